"""Prompt lookup when it finds a match of 2+ tokens; otherwise the edge model while its blocks pay, and
what prompt lookup alone would send (a one-token match's block, or a plain step of the cloud) when they
do not. A draft-free block costs no edge forward, and a model block covers the text that copies nothing,
but only where drafting k tokens and verifying them costs less per token than the cloud's own step:

    d = seconds of a model proposal (k edge forwards)      v = t_verify(k + 1)      s = t_verify(1)
    draft with the model  iff  (d + v) / tau_model < s
                          and  (s - (d + v) / tau_model) * tokens left > behind * r_edge

tau_model: tokens per verify of model blocks (EMA, alpha 0.5, from the mean over the engine's earlier
requests; 2.0 before any); behind: accepted tokens the edge's cache has not seen (after lookup blocks or
plain steps it lags, and its next proposal feeds them as one block: on a request's first cycle, the
whole prompt); r_edge: the edge's measured seconds per token of such proposals (the feed and the k - 1
forwards after it, over the tokens they fed); s, before a plain step is measured: the cheapest verify
measured. Until a cost is measured the model drafts, and learns it. A withheld model block teaches
nothing, so once the model stops paying on an engine it stays off there, and the hybrid is prompt
lookup. On 2026-11-25 (2 threads, the 1.5B verified in int8) the hybrid without this rule ran at
0.53-0.98x plain llama.cpp where lookup alone ran at 0.77-2.27x: the 0.5B's block cost more per token
than an int8 step on MT-bench, and on a 900-token article its prefill took ~3 s of a ~12-s request.

A one-token match (a repeated word) is too weak to skip the model for: lookup must match at least
`min_ngram` (2) tokens before the model is asked."""
from __future__ import annotations

import time

from specdec.core.drafters.auto import ALPHA, BLOCK, PLAIN, STEP, CostCurve
from specdec.core.drafters.interface import DraftContext, DraftNote, Proposal, register_drafter
from specdec.core.drafters.model import ModelDrafter
from specdec.core.drafters.prompt_lookup import MAX_NGRAM, MIN_NGRAM as ANY_NGRAM, lookup
from specdec.core.session import AcceptedSequence
from specdec.core.verdict import InFlight, Verdict

MIN_NGRAM = 2


class ModelCosts:
    """What the hybrid weighs its model part by, kept across an engine's generations."""

    def __init__(self) -> None:
        self.verify = CostCurve()  # the cloud's verify forwards by kind and tokens fed; its `tau`: model blocks'
        self.draft = [0.0, 0]  # [seconds, proposals] of model proposals that fed at most 2 accepted tokens
        self.edge_feed = [0.0, 0]  # [seconds, tokens fed] of model proposals that caught the edge's cache up

    def draft_s(self) -> float | None:
        seconds, n = self.draft
        return seconds / n if n else None

    def edge_s_per_token(self) -> float:
        seconds, tokens = self.edge_feed
        return seconds / tokens if tokens else 0.0


@register_drafter("hybrid", needs_model=True)
class Hybrid:
    name = "hybrid"

    def __init__(self, context: DraftContext) -> None:
        self.model = ModelDrafter(context)
        self.max_ngram = int(context.options.get("max_ngram", MAX_NGRAM))
        self.lookup_s = 0.0
        self.costs: ModelCosts = context.memory.setdefault(self.name, ModelCosts())
        self.tau_model = self.costs.verify.prior_tau()

    @property
    def compute_s(self) -> float:
        return self.model.compute_s + self.lookup_s

    @property
    def prefill_s(self) -> float:
        return self.model.prefill_s

    def propose(self, seq: AcceptedSequence, k: int) -> Proposal:
        start = time.perf_counter()
        tokens = lookup(seq.ids, k, self.max_ngram, MIN_NGRAM)
        with_model = not tokens.numel() and self.model_pays(seq, k)
        if not tokens.numel() and not with_model:
            tokens = lookup(seq.ids, k, self.max_ngram, ANY_NGRAM)  # what lookup alone would send
        self.lookup_s += time.perf_counter() - start
        if with_model:
            return self.draft_with_model(seq, k)
        return Proposal(tokens.clone(), None, seq.length, "prompt-lookup" if tokens.numel() else PLAIN)

    def draft_with_model(self, seq: AcceptedSequence, k: int) -> Proposal:
        """The model's block, its seconds kept as a drafting cost or, when it fed the edge what it had
        not seen (the prompt, lookup's tokens, plain steps'), as a catch-up rate."""
        behind, before = seq.length - self.model.session.length, self.model.compute_s
        proposal = self.model.propose(seq, k)
        seconds = self.model.compute_s - before
        if behind > 2:
            self.costs.edge_feed[0] += seconds
            self.costs.edge_feed[1] += behind + len(proposal) - 1
        else:
            self.costs.draft[0] += seconds
            self.costs.draft[1] += 1
        return proposal

    def model_pays(self, seq: AcceptedSequence, k: int) -> bool:
        """By the rule in the module's docstring; True while a cost is unmeasured (draft, and learn)."""
        curve, draft = self.costs.verify, self.costs.draft_s()
        step, verify = curve.mean(STEP, 1) or curve.nearest(BLOCK, 1), curve.nearest(BLOCK, k + 1)
        if step is None or verify is None or draft is None:
            return True
        per_token = (draft + verify) / self.tau_model
        behind = seq.length - self.model.session.length
        return per_token < step and (step - per_token) * seq.remaining > behind * self.costs.edge_s_per_token()

    def meanwhile(self, seq: AcceptedSequence, proposal: Proposal, in_flight: InFlight, next_n: int) -> None:
        """Sequential (drafting ahead wraps the model drafter alone)."""

    def rollback(self, seq: AcceptedSequence, proposal: Proposal, verdict: Verdict | None) -> DraftNote:
        """Learn the verify's cost (and a model block's tokens per verify). After the model's block, crop
        its cache as the model drafter does; after a lookup block or a plain step there is nothing to crop:
        the model's cache is a prefix of the accepted sequence, which only grows."""
        if verdict is not None and verdict.tokens_in == len(proposal) + 1:  # not a prefill or a catch-up
            self.costs.verify.observe(BLOCK if len(proposal) else STEP, verdict.tokens_in, verdict.read_at - verdict.sent_at)
        if proposal.drafter != self.model.name:
            return DraftNote()
        if verdict is not None:
            tau = verdict.accepted + 1
            self.tau_model = ALPHA * tau + (1 - ALPHA) * self.tau_model
            self.costs.verify.tau[0] += tau
            self.costs.verify.tau[1] += 1
        return self.model.rollback(seq, proposal, verdict)

