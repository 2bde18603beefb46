"""Speculation that knows when not to speculate (`--drafter auto`): prompt lookup (cost ~0 to propose)
whose block is sent only while it pays; otherwise the block is empty, and the verify is a plain step of
the cloud model (one token in, its next token out). Greedy output is the cloud's either way, so the
choice can change every cycle.

A block of n draft tokens is one forward over n + 1 tokens (the last accepted one and the draft) that
yields tau = accepted + 1 tokens; a plain step is one forward over 1 token that yields 1. So

    send the block  <=>  tau_hat > t(n + 1) / t(1)

t(m): the verify forward's seconds for m tokens, running means per m over this engine's generations
(the machine's cost curve: on 2026-11-25, 2 threads, a 5-token block cost 1.07 token steps in
torch-int8 and 2.9 in llama.cpp Q4_K_M, so the same acceptance pays in one runtime and not the other).
Until t(m) and t(1) are both measured the ratio is taken as 1 (send: measuring is how it learns).
tau_hat: this request's running mean of tokens per sent block (EMA, alpha 0.5), starting from the mean
over the engine's earlier requests (2.0 before any). While blocks are withheld tau_hat cannot move, so
every PROBE-th withheld block is sent anyway (its cost: at most one block in PROBE).
"""
from __future__ import annotations

import time

from specdec.core.drafters.interface import DraftContext, DraftFree, DraftNote, Proposal, register_drafter
from specdec.core.drafters.prompt_lookup import PromptLookup
from specdec.core.session import AcceptedSequence
from specdec.core.verdict import Verdict

PROBE = 8  # every PROBE-th withheld block is sent anyway, so tau_hat follows the text
ALPHA = 0.5  # EMA weight of the newest block's tokens per verify
PRIOR_TAU = 2.0  # tokens per verify assumed before any block was verified on this engine
PLAIN = "plain"  # the name a withheld (empty) block is traced under


class CostCurve:
    """Running mean seconds of a verify forward by the tokens it fed; kept across an engine's generations."""

    def __init__(self) -> None:
        self.seconds: dict[int, list[float]] = {}  # tokens fed -> [sum of seconds, count]
        self.tau = [0.0, 0]  # [sum of tokens per sent block, blocks] over earlier requests

    def observe(self, tokens_fed: int, seconds: float) -> None:
        entry = self.seconds.setdefault(tokens_fed, [0.0, 0])
        entry[0] += seconds
        entry[1] += 1

    def mean(self, tokens_fed: int) -> float | None:
        total, n = self.seconds.get(tokens_fed, (0.0, 0))
        return total / n if n else None

    def ratio(self, tokens_fed: int) -> float:
        """t(tokens_fed) / t(1); 1 until both are measured."""
        block, step = self.mean(tokens_fed), self.mean(1)
        return block / step if block and step else 1.0

    def prior_tau(self) -> float:
        total, n = self.tau
        return total / n if n else PRIOR_TAU


@register_drafter("auto")
class Auto(DraftFree):
    name = "auto"

    def __init__(self, context: DraftContext) -> None:
        super().__init__()
        self.lookup = PromptLookup(context)  # its settings, checked there
        self.curve: CostCurve = context.memory.setdefault(self.name, CostCurve())
        self.tau_hat = self.curve.prior_tau()
        self.withheld = 0  # blocks withheld since the last one sent

    def propose(self, seq: AcceptedSequence, k: int) -> Proposal:
        start = time.perf_counter()
        tokens = self.lookup.propose(seq, k).tokens
        send = tokens.numel() > 0 and (self.tau_hat > self.curve.ratio(tokens.numel() + 1) or self.withheld + 1 >= PROBE)
        self.withheld = 0 if send else self.withheld + (tokens.numel() > 0)
        self.compute_s += time.perf_counter() - start
        if send:
            return Proposal(tokens, None, seq.length, "prompt-lookup")
        return Proposal(tokens[:0], None, seq.length, PLAIN)

    def rollback(self, seq: AcceptedSequence, proposal: Proposal, verdict: Verdict | None) -> DraftNote:
        """Learn from the verify: its forward's seconds by tokens fed, and a sent block's tokens per verify."""
        if verdict is not None:
            self.curve.observe(verdict.tokens_in, verdict.read_at - verdict.sent_at)
            if len(proposal):
                tau = verdict.accepted + 1
                self.tau_hat = ALPHA * tau + (1 - ALPHA) * self.tau_hat
                self.curve.tau[0] += tau
                self.curve.tau[1] += 1
        return DraftNote()
