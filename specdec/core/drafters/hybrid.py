"""Prompt lookup when it finds a match of 2+ tokens; otherwise the edge model while its blocks pay, and
what prompt lookup alone would send (a one-token match's block, or a plain step of the cloud) when they
do not. A draft-free block costs no edge forward, and a model block covers the text that copies nothing,
but only where drafting k tokens and verifying them costs less per token than the cloud's own step, and
what that saves over the tokens left pays for feeding the edge what it has not seen
(specdec/core/payoff.py, with d the model's proposal and F the edge's catch-up):

    d = seconds of a model proposal (k edge forwards)      v = t_verify(k + 1)      s = t_verify(1)
    draft with the model  iff  (d + v) / τ_model < s  and  (s − (d + v) / τ_model) · tokens left > behind · r_edge

τ_model: tokens per verify of model blocks (EMA, alpha 0.5, from the mean over the engine's earlier
requests; 2.0 before any); behind: accepted tokens the edge's cache has not seen (after lookup blocks or
plain steps it lags, and its next proposal feeds them as one block: on a request's first cycle, the whole
prompt); r_edge: the edge's measured seconds per token of such proposals (the feed and the k − 1 forwards
after it, over the tokens they fed); s, before a plain step is measured: the cheapest verify measured.
Until a cost is measured the model drafts, and learns it. A withheld model block teaches nothing, so once
the model stops paying on an engine it stays off there, and the hybrid is prompt lookup.

A one-token match (a repeated word) is too weak to skip the model for: lookup must match at least
`min_ngram` (2) tokens before the model is asked. With `suffix=1` the draft-free half is the suffix drafter
(suffix.py: the prompt, the output so far and the engine's earlier outputs, scored by frequency), whose chain must
hold 2+ tokens likewise (its length is bounded by its match's); its global corpus takes every cycle's output,
whoever proposed the block. `head_vocab` is the model drafter's (model.py: the edge's head over fewer ids).

The hybrid cannot draft ahead: its next block may be lookup's, which has nothing to draft meanwhile (`--overlap
true` with it is refused).

Measured (docs/drafters.md, 2026-11-30, AMD EPYC, 60 Spec-Bench questions): over the suffix drafter it gains nothing
pooled (1.36x after the first token, the suffix drafter alone 1.36x): the 0.5B's blocks kept ~90 % of their tokens on
math, but a drafted token costs ~0.4-0.5 of the 1.5B's step in kernels-int4, and catching the edge up on a prompt
costs translation's short answers more than its blocks save."""
from __future__ import annotations

import time

from specdec.core.drafters.interface import DraftContext, DrafterOption, DraftNote, Proposal, plain_step, register_drafter
from specdec.core.drafters.model import HEAD_VOCAB, ModelDrafter
from specdec.core.drafters.prompt_lookup import MAX_NGRAM, PromptLookup, lookup
from specdec.core.drafters.prompt_lookup import MIN_NGRAM as ANY_NGRAM
from specdec.core.drafters.suffix import SuffixDrafter
from specdec.core.payoff import BlockEvidence, block_pays
from specdec.core.running import ema
from specdec.core.session import AcceptedSequence
from specdec.core.verdict import InFlight, Route, Verdict

MIN_NGRAM = 2
OPTIONS = {"max_ngram": DrafterOption(MAX_NGRAM, MIN_NGRAM, "the longest suffix its lookup searches for, in tokens"),
           "suffix": DrafterOption(0, 0, "1: the suffix drafter's chain (prompt, output, earlier outputs) instead of "
                                         "prompt lookup's"),
           "head_vocab": HEAD_VOCAB}


@register_drafter("hybrid", needs_model=True, options=OPTIONS)
class Hybrid:
    name = "hybrid"
    proposes_trees = False

    def __init__(self, context: DraftContext) -> None:
        self.model = ModelDrafter(context)
        self.suffix = SuffixDrafter(context) if context.options.get("suffix", 0) else None
        self.max_ngram = context.options.get("max_ngram", MAX_NGRAM)
        self.lookup_s = 0.0
        self.history = context.history
        self.tau_model = self.history.tau_prior()

    @property
    def compute_s(self) -> float:
        return self.model.compute_s + self.lookup_s + (self.suffix.compute_s if self.suffix else 0.0)

    @property
    def prefill_s(self) -> float:
        return self.model.prefill_s

    def propose(self, seq: AcceptedSequence, k: int) -> Proposal:
        if self.suffix is not None:
            free = self.suffix.propose(seq, k)
            if len(free) >= MIN_NGRAM:
                return free
            if self.model_pays(seq, k):
                return self.draft_with_model(seq, k)
            return free if len(free) else plain_step(seq)
        start = time.perf_counter()
        tokens = lookup(seq.ids, k, self.max_ngram, MIN_NGRAM)
        with_model = not tokens.numel() and self.model_pays(seq, k)
        if not tokens.numel() and not with_model:
            tokens = lookup(seq.ids, k, self.max_ngram, ANY_NGRAM)  # what lookup alone would send
        self.lookup_s += time.perf_counter() - start
        if with_model:
            return self.draft_with_model(seq, k)
        return Proposal(tokens.clone(), None, seq.length, PromptLookup.name) if tokens.numel() else plain_step(seq)

    def draft_with_model(self, seq: AcceptedSequence, k: int) -> Proposal:
        """The model's block, its seconds kept as a drafting cost or, when it fed the edge what it had
        not seen (the prompt, lookup's tokens, plain steps'), as a catch-up rate."""
        behind, before = seq.length - self.model.session.length, self.model.compute_s
        proposal = self.model.propose(seq, k)
        seconds = self.model.compute_s - before
        if behind > 2:
            self.history.edge.catch_up.add(seconds, behind + len(proposal) - 1)
        else:
            self.history.edge.proposal.add(seconds)
        return proposal

    def model_pays(self, seq: AcceptedSequence, k: int) -> bool:
        """By the rule in the module's docstring; True while a cost is unmeasured (draft, and learn)."""
        verify, draft = self.history.verify, self.history.edge.proposal.mean
        step, block = verify.mean(Route.STEP, 1) or verify.nearest(Route.BLOCK, 1), verify.nearest(Route.BLOCK, k + 1)
        if step is None or block is None or draft is None:
            return True
        behind = seq.length - self.model.session.length
        feed_s = behind * (self.history.edge.catch_up.mean or 0.0)
        return block_pays(BlockEvidence(self.tau_model, block, step, draft_s=draft, feed_s=feed_s, tokens_left=seq.remaining))

    def meanwhile(self, seq: AcceptedSequence, proposal: Proposal, in_flight: InFlight, next_n: int) -> None:
        """Sequential: the hybrid does not draft ahead (see the module's docstring)."""

    def rollback(self, seq: AcceptedSequence, proposal: Proposal, verdict: Verdict | None) -> DraftNote:
        """Learn the verify's cost (and a model block's tokens per verify). After the model's block, crop
        its cache as the model drafter does; after a lookup block or a plain step there is nothing to crop:
        the model's cache is a prefix of the accepted sequence, which only grows."""
        if verdict is not None:
            self.history.verify.observe_verify(proposal.verified_as, len(proposal), verdict)
        if self.suffix is not None:
            self.suffix.remember(seq, proposal, verdict)
        if proposal.drafter != self.model.name:
            return DraftNote()
        if verdict is not None:
            self.tau_model = ema(self.tau_model, verdict.accepted + 1)
            self.history.tau.add(verdict.accepted + 1)
        return self.model.rollback(seq, proposal, verdict)
