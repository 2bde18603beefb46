"""The cloud side: one explicit forward per escalated block (never `generate`: asked for no new token,
it returns no scores to verify with).

Both verifiers return cloud logits [n+1, V] for a draft of n tokens: row i predicts d_i, row n is
the bonus position. For a block [last_accepted, d_0..d_{n-1}] fed on a cache holding the prefix
before last_accepted, logits[i] predicts d_i and logits[n] the token after d_{n-1}.
"""
from __future__ import annotations

import torch

from specdec.backends.base import Backend
from specdec.backends.devices import clock
from specdec.backends.prompt import Prompt
from specdec.core.session import AcceptedSequence, Session
from specdec.core.tree import TokenTree

VERIFIERS: dict[str, type] = {}
_TREES: set[str] = set()  # verifiers registered with verifies_trees=True  # --verifier name -> class(backend, prompt)


def register_verifier(name: str, *, verifies_trees: bool = False):
    """Class decorator: file a verifier under its `--verifier` name; `verifies_trees`: it has tree_logits and
    commit_path (token trees verify on it)."""

    def register(cls: type) -> type:
        VERIFIERS[name] = cls
        if verifies_trees:
            _TREES.add(name)
        return cls

    return register


@register_verifier("cached", verifies_trees=True)
class CachedVerifier:
    """The cloud keeps a KV cache of the accepted prefix, audio included from its prefill.
    The first call prefills the prompt and verifies its draft in one forward. Each call feeds only the accepted tokens it
    has not seen (blocks accepted without escalation arrive lazily here) plus the draft; rejected positions are cropped
    afterwards."""

    def __init__(self, backend: Backend, prompt: Prompt) -> None:
        self.backend, self.prompt = backend, prompt
        self.session: Session | None = None  # prefilled on the first escalation only
        self.last_tokens_in = 0
        self.last_sent_features = False

    @property
    def compute_s(self) -> float:
        return self.session.compute_s if self.session else 0.0

    def logits(self, seq: AcceptedSequence, draft_tokens: torch.Tensor) -> torch.Tensor:
        session, unseen = self._unseen(seq, draft_tokens.numel())
        return session.feed(torch.cat([unseen, draft_tokens]), keep=draft_tokens.numel() + 1)

    def tree_logits(self, seq: AcceptedSequence, tree: TokenTree) -> torch.Tensor:
        """As `logits`, for a token tree's nodes: [1 + nodes, V] (row 0 the last accepted token's)."""
        session, unseen = self._unseen(seq, tree.size)
        return session.feed_tree(unseen, tree)

    def _unseen(self, seq: AcceptedSequence, drafted: int) -> tuple[Session, torch.Tensor]:
        """The session (opened on the first call) and the accepted tokens it has not seen. What crosses the network:
        every accepted token the cloud has not received (the whole prompt on the first call, prefilled in the same
        forward as the draft) plus the `drafted` tokens."""
        first_call = self.session is None
        self.last_sent_features = first_call and bool(self.prompt.features)
        if self.session is None:  # the first call
            self.session = Session(self.backend, self.prompt)
        unseen = self.session.unseen(seq)
        self.last_tokens_in = unseen.numel() + drafted
        return self.session, unseen

    def commit_path(self, tree: TokenTree, path: list[int]) -> None:
        """The accepted path of the tree `tree_logits` fed joins the cache, before the rollback crops past it."""
        assert self.session is not None, "commit_path follows tree_logits"
        self.session.commit_path(tree, path)

    def block(self, seq: AcceptedSequence, draft_tokens: torch.Tensor) -> tuple[object, torch.Tensor, int] | None:
        """What `logits` would feed, on which state, for a forward shared with other sessions
        (`specdec.core.shared_forward`): (state, tokens, keep). None when it cannot be shared: a first call
        whose prompt carries multimodal features goes through the backend's own prefill."""
        if self.session is None:
            if self.prompt.features:
                return None
            self.session = Session(self.backend, self.prompt)
            self.session.state, _ = self.backend.prefill(self.prompt, draft_tokens[:0])  # empty: the prompt rides in the block
        unseen = self.session.unseen(seq)
        self.last_tokens_in = unseen.numel() + draft_tokens.numel()
        self.last_sent_features = False
        return self.session.state, torch.cat([unseen, draft_tokens]), draft_tokens.numel() + 1

    def rollback(self, length: int, seq: AcceptedSequence) -> None:
        assert self.session is not None, "rollback follows a verify, whose logits or block made the session"
        self.session.rollback(length, seq)


@register_verifier("stateless")
class StatelessVerifier:
    """The original research system's design: context + draft recomputed from scratch every call, multimodal inputs
    passed again, no cache kept. Kept so users can measure what the cache saves."""

    def __init__(self, backend: Backend, prompt: Prompt) -> None:
        self.backend, self.prompt = backend, prompt
        self.compute_s = 0.0
        self.last_tokens_in = 0
        self.last_sent_features = False

    def logits(self, seq: AcceptedSequence, draft_tokens: torch.Tensor) -> torch.Tensor:
        tokens = torch.cat([seq.ids, draft_tokens])
        self.last_tokens_in = tokens.numel()
        self.last_sent_features = bool(self.prompt.features)
        device = self.backend.device
        start = clock(device)
        _, logits = self.backend.prefill(self.prompt, tokens, keep=draft_tokens.numel() + 1, use_cache=False)
        self.compute_s += clock(device) - start
        assert logits is not None  # keep >= 1 on a non-empty block (the context): prefill returns [keep, V]
        return logits

    def block(self, seq: AcceptedSequence, draft_tokens: torch.Tensor) -> tuple[object, torch.Tensor, int] | None:
        """As `CachedVerifier.block`: the whole context on a fresh state, dropped after the forward."""
        if self.prompt.features:
            return None
        tokens = torch.cat([seq.ids, draft_tokens])
        self.last_tokens_in = tokens.numel()
        self.last_sent_features = False
        state, _ = self.backend.prefill(self.prompt, tokens[:0])
        return state, tokens, draft_tokens.numel() + 1

    def rollback(self, length: int, seq: AcceptedSequence) -> None:
        """Nothing is cached."""


def verifies_trees(kind: str) -> bool:
    """Whether the verifier `kind` verifies token trees (its registration says)."""
    return kind in _TREES


def make_verifier(kind: str, backend: Backend, prompt: Prompt) -> CachedVerifier | StatelessVerifier:
    return VERIFIERS[kind](backend, prompt)
