"""Prompt lookup when it finds a match, the edge model otherwise: a draft-free block costs no edge
forward, and a model block covers the text that copies nothing. The model's cache lags behind
while lookup blocks are accepted; its next proposal feeds the accepted tokens it has not seen as
one block, as after any cycle.

A one-token match (a repeated word) is too weak to skip the model for: lookup must match at least
`min_ngram` (2) tokens here."""
from __future__ import annotations

import time

from specdec.core.drafters.interface import DraftContext, DraftNote, Proposal, register_drafter
from specdec.core.drafters.model import ModelDrafter
from specdec.core.drafters.prompt_lookup import MAX_NGRAM, lookup
from specdec.core.session import AcceptedSequence
from specdec.core.verdict import InFlight, Verdict

MIN_NGRAM = 2


@register_drafter("hybrid", needs_model=True)
class Hybrid:
    name = "hybrid"

    def __init__(self, context: DraftContext) -> None:
        self.model = ModelDrafter(context)
        self.max_ngram = int(context.options.get("max_ngram", MAX_NGRAM))
        self.lookup_s = 0.0

    @property
    def compute_s(self) -> float:
        return self.model.compute_s + self.lookup_s

    @property
    def prefill_s(self) -> float:
        return self.model.prefill_s

    def propose(self, seq: AcceptedSequence, k: int) -> Proposal:
        start = time.perf_counter()
        tokens = lookup(seq.ids, k, self.max_ngram, MIN_NGRAM)
        self.lookup_s += time.perf_counter() - start
        if tokens.numel():
            return Proposal(tokens.clone(), None, seq.length, "prompt-lookup")
        return self.model.propose(seq, k)

    def meanwhile(self, seq: AcceptedSequence, proposal: Proposal, in_flight: InFlight, next_n: int) -> None:
        """Sequential (drafting ahead wraps the model drafter alone)."""

    def rollback(self, seq: AcceptedSequence, proposal: Proposal, verdict: Verdict | None) -> DraftNote:
        """After the model's block, crop its cache as the model drafter does. After a lookup block
        there is nothing to crop: the model's cache is a prefix of the accepted sequence, which only grows."""
        if proposal.drafter == self.model.name:
            return self.model.rollback(seq, proposal, verdict)
        return DraftNote()
