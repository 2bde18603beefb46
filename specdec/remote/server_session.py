"""One edge generation on the verifier server: a mirror of the edge's accepted sequence (the
server's one source of truth) and the cloud session built on it, and the verify / generate state
machine between them.

A row in flight is either a verify (the edge's block: the verdict's accepted tokens join the mirror,
its correction or bonus comes back with the next `new`) or a `generate` step (the cloud's own next
token joins the mirror at once). `pending` is the last verdict's token, which the next verify's `new`
must carry, or a `generate` takes first.
"""
from __future__ import annotations

import time
from dataclasses import replace

import torch

from specdec.backends.prompt import Prompt
from specdec.constraint_profiles import build_constraints
from specdec.core.cloud import LocalCloudSession
from specdec.core.config import DecodeConfig, SpecConfig
from specdec.core.policies import traits
from specdec.core.session import AcceptedSequence
from specdec.core.shared_forward import BatchRow
from specdec.core.tree import TokenTree
from specdec.core.verdict import Verdict
from specdec.core.verifier import verifies_trees
from specdec.errors import InputError, SpecdecError
from specdec.models.loading import LoadedModel
from specdec.remote.payloads import unpack_probs, unpack_tensors
from specdec.remote.protocol import Followed, Open, ProtocolError, Verify, check_token_ids
from specdec.settings import Profile, parse

# The server's sampling stream must not be the edge's: seeding both with the same seed would feed
# the acceptance test the very uniforms that drew the draft tokens.
CLOUD_SEED_OFFSET = 0x9E3779B9
SEED_RANGE = 1 << 64  # torch seeds are 64-bit: the cloud's seed wraps instead of overflowing


def session_settings(model: LoadedModel, opening: Open) -> tuple[SpecConfig, DecodeConfig, dict[str, torch.Tensor]]:
    """What the schema cannot check of an `open` (it is typed and `check`ed already): its ids and
    vocabulary against this model, audio for a model that hears, the settings as configs (which check
    themselves), the positions they need. Returns the configs and the features."""
    vocab_limit = model.backend.vocab_size
    check_token_ids("prompt_ids", opening.prompt_ids, vocab_limit)
    if not 1 <= opening.vocab <= vocab_limit:
        raise ProtocolError(f"open: vocab must be in [1, {vocab_limit}]")
    features = unpack_tensors(opening.features, "features") if opening.features is not None else {}
    if features and not model.backend.accepts_audio:
        raise ProtocolError(f"open: model {model.name!r} is text-only but the session carries audio features", code="no_audio")
    try:
        spec = SpecConfig(k=1, policy=opening.policy, accept_threshold=opening.accept_threshold, verifier=opening.verifier)
        decode_config = DecodeConfig(max_new_tokens=opening.max_new_tokens, temperature=opening.temperature,
                                     seed=opening.seed)
        spec.check_decoding(decode_config)
    except SpecdecError as e:
        raise ProtocolError(f"open: {e}") from None
    limit = model.max_positions
    if limit is not None and len(opening.prompt_ids) + decode_config.max_new_tokens > limit:
        raise ProtocolError(f"open: a prompt of {len(opening.prompt_ids)} tokens and max_new_tokens "
                            f"{decode_config.max_new_tokens} need more positions than model {model.name!r} has "
                            f"({limit}): lower max_new_tokens", code="too_long")
    check_token_ids("eos_ids", opening.eos_ids, opening.vocab)  # the constraints index the session's vocab
    return spec, decode_config, features


class ServerSession:
    def __init__(self, model: LoadedModel, opening: Open) -> None:
        spec, decode_config, features = session_settings(model, opening)
        self.vocab, self.policy = opening.vocab, opening.policy
        profile = parse(Profile, opening.constraints, "constraints")  # Open.check allowed it: the word becomes its member
        self.constraints = build_constraints(model, profile, self.vocab, frozenset(opening.eos_ids))
        prompt = Prompt(torch.tensor(opening.prompt_ids, dtype=torch.long), features)
        generator = torch.Generator().manual_seed((opening.seed + CLOUD_SEED_OFFSET) % SEED_RANGE)
        # Mirror of the edge's accepted sequence: it grows by `new` and by the accepted draft tokens.
        self.seq = AcceptedSequence(prompt.input_ids, decode_config.max_new_tokens)
        self.cloud = LocalCloudSession(model.backend, prompt, spec, decode_config, self.constraints, self.vocab, generator)
        # Token trees are verified greedily on a cached verifier, in a runtime that verifies them (as in process).
        self.trees = (model.backend.accepts_trees and traits(spec.policy).argmax and not decode_config.do_sample
                      and verifies_trees(spec.verifier))
        # The last verdict's correction or bonus: the edge's next `new` carries it back, and a
        # `generate` after a verify takes it into the mirror first (the cache has seen every token of
        # the mirror then: the step needs at least one it has not).
        self.pending: int | None = None
        self.edge_takes_the_token = True  # the row in flight is a verify (its token comes back in `new`), not a `generate` step
        self.following: Followed | None = None  # the verdict the row in flight keeps (verify.follow), or None: its own
        self.agreed: bool | None = None  # after a followed verify: the server's own verdict was the kept one; else None
        self.last_active = time.monotonic()

    def prepare(self, verify: Verify) -> BatchRow:
        """Check a verify against this session and take in its unseen accepted tokens; returns the block to verify."""
        new = check_token_ids("new", verify.new, self.vocab, self.seq.remaining)
        draft = check_token_ids("draft", verify.draft, self.vocab)  # at most MAX_DRAFT_TOKENS: the schema's
        if self.seq.length + len(new) != verify.base:
            raise ProtocolError(f"verify: base {verify.base} != server length {self.seq.length} + {len(new)} new tokens",
                                code="out_of_sync")
        tree = self.tree_of(verify)
        longest = tree.depth if tree is not None else len(draft)  # what the verdict can keep
        if len(new) + longest > self.seq.remaining:
            raise ProtocolError(f"verify: a draft of at most {self.seq.remaining - len(new)} tokens expected, got {longest}")
        if self.pending is not None and not new:  # the cache has seen every accepted token: nothing to predict from
            raise ProtocolError(f"verify: new must carry the last verdict's token ({self.pending})", code="out_of_sync")
        # No `probs`: a draft-free block, each token a point mass (specdec/core/policies/sample.py).
        probs = unpack_probs(verify.probs, len(draft), self.vocab) if verify.probs is not None else None
        if verify.follow is not None and verify.follow.token is not None:
            check_token_ids("follow.token", [verify.follow.token], self.vocab)
        self.seq.extend(new)
        self.pending, self.edge_takes_the_token, self.following, self.agreed = None, True, verify.follow, None
        return BatchRow(self.cloud.verifier, self.seq, torch.tensor(draft, dtype=torch.long), probs, tree)

    def tree_of(self, verify: Verify) -> TokenTree | None:
        """The token tree a verify carries (its parents), checked against what this session verifies; None: a chain."""
        if verify.parents is None:
            return None
        if not self.trees:
            raise ProtocolError("verify: this session verifies chains only (a tree needs a runtime that verifies "
                                "trees, the greedy policy, temperature 0 and the cached verifier): send a chain",
                                code="no_trees")
        try:
            return TokenTree(torch.tensor(verify.draft, dtype=torch.long), tuple(verify.parents))
        except InputError as e:
            raise ProtocolError(f"verify: {e}") from None

    def take_pending(self) -> int | None:
        """Before cloud-only steps: the last verdict's token joins the mirror, as the edge took it
        (None if there was none, or the budget is spent)."""
        token, self.pending = self.pending, None
        if token is None or not self.seq.remaining:
            return None
        self.seq.extend([token])
        return token

    def next_step(self) -> BatchRow:
        """A next-token step of cloud-only serving: a block with no draft."""
        no_draft = torch.empty(0, self.vocab) if traits(self.policy).samples else None
        self.edge_takes_the_token, self.following = False, None
        return BatchRow(self.cloud.verifier, self.seq, torch.empty(0, dtype=torch.long), no_draft)

    def stops(self, token: int) -> bool:
        """Does `token`, just joined to the mirror, end the generation (a stop token of the constraints)?"""
        return self.constraints.stop.stops(token, len(self.seq.generated))

    def conclude(self, row: BatchRow, logits: torch.Tensor) -> Verdict:
        """After the forward (compute thread): the verdict from the row's logits, then the mirror
        follows it. A verify (an empty one too: a draft-free drafter's plain step): the accepted draft
        tokens join the mirror and the cache is cropped to exactly that prefix (the correction, bonus or
        next token arrives with the next `new`). A `generate` step: the token joins the mirror (the cache
        holds every position before it). A followed verify keeps the given verdict (`follow`)."""
        if row.tree is not None:  # its kept path joins the cache as a chain would (decide_tree commits it)
            verdict = self.cloud.decide_tree(self.seq, row.tree, logits)
        else:
            verdict = self.cloud.decide(self.seq, row.draft_tokens, row.draft_probs, logits)
        if self.following is not None:  # its own verdict decided (the same work), the given one kept
            verdict = self.follow(verdict)
        if self.edge_takes_the_token:  # a verify, an empty block (a draft-free drafter's plain step) included
            kept = row.draft_tokens[list(verdict.path)] if row.tree is not None else row.draft_tokens[: verdict.accepted]
            self.seq.extend(kept.tolist())
            self.cloud.rollback(self.seq.length, self.seq)
            self.pending = verdict.next_token
        else:
            self.seq.extend([verdict.next_token])
        return verdict

    def follow(self, own: Verdict) -> Verdict:
        """The followed verdict in place of `own` (a token left nil keeps its own), and whether they agreed."""
        kept = self.following
        assert kept is not None  # called only for a followed verify (decide checks `following` first)
        token = own.next_token if kept.token is None else kept.token
        self.agreed = (own.accepted, own.next_token) == (kept.accepted, token)
        return replace(own, accepted=kept.accepted, next_token=token)
