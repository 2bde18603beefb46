"""Speculation that knows when not to speculate (`--drafter auto`): prompt lookup (cost ~0 to propose)
whose block is sent only while it pays (specdec/core/payoff.py: τ̂ > t_block(n + 1) / t_plain(1));
otherwise the cycle is a plain step of the cloud model. On a cloud held in two runtimes the router
beside it (specdec/core/two_runtime.py) says where each cycle runs instead.

A withheld block still teaches τ̂: the plain steps that follow decide the tokens it proposed, so its τ is
read off for free once they are in (matched prefix + 1: exactly what a greedy verify would have accepted;
under sampling an estimate). An earlier version sent every 8th withheld block as a probe.
"""
from __future__ import annotations

import time

from specdec.core.drafters.interface import (
    DraftContext,
    DraftFree,
    DraftNote,
    Proposal,
    kept_when_decided,
    plain_step,
    register_drafter,
)
from specdec.core.drafters.prompt_lookup import OPTIONS, PromptLookup
from specdec.core.payoff import BlockEvidence, block_pays
from specdec.core.running import ema
from specdec.core.session import AcceptedSequence
from specdec.core.verdict import Route, Verdict


@register_drafter("auto", weighs_runtimes=True, options=OPTIONS)
class Auto(DraftFree):
    name = "auto"

    def __init__(self, context: DraftContext) -> None:
        super().__init__()
        self.lookup = PromptLookup(context)
        self.history, self.router = context.history, context.router
        self.tau_hat = self.history.tau_prior()  # tokens per verify of lookup's blocks, sent or read off
        self.withheld: list[tuple[int, list[int]]] = []  # (position, tokens) of blocks not sent, until steps decide them

    def evidence(self, drafted: int) -> BlockEvidence:
        """What the rule reads for a block of `drafted` tokens on a cloud of one runtime."""
        verify = self.history.verify
        return BlockEvidence(self.tau_hat, verify.mean(Route.BLOCK, drafted + 1), verify.mean(Route.STEP, 1),
                             self.history.block_steps_prior.get(drafted + 1, 1.0))

    def propose(self, seq: AcceptedSequence, k: int) -> Proposal:
        start = time.perf_counter()
        block = self.lookup.propose(seq, k)
        n = len(block)
        if self.router is not None:
            route = self.router.route(seq, n, self.tau_hat)
        else:
            route = Route.BLOCK if n and block_pays(self.evidence(n)) else Route.STEP
        if n and route is not Route.BLOCK:
            self.withheld.append((seq.length, block.tokens.tolist()))
        self.compute_s += time.perf_counter() - start
        routed = route if self.router is not None else None
        if route is Route.BLOCK:
            return Proposal(block.tokens, None, seq.length, block.drafter, routed)
        return plain_step(seq, routed)

    def rollback(self, seq: AcceptedSequence, proposal: Proposal, verdict: Verdict | None) -> DraftNote:
        """Learn from the verify: its forward's cost, the router's records, a sent block's tokens per
        verify, and those of withheld blocks whose tokens the plain steps have now decided."""
        if verdict is None:
            return DraftNote()
        self.history.verify.observe_verify(proposal.verified_as, len(proposal), verdict)
        if self.router is not None:
            self.router.observe(proposal, verdict)
        if len(proposal):
            self.learn(verdict.accepted + 1)
        self.read_withheld(seq)
        return DraftNote()

    def read_withheld(self, seq: AcceptedSequence) -> None:
        """A withheld block at position p proposed d_0..d_{n-1}; once the accepted sequence decides them,
        a greedy verify would have kept the matching prefix and added the cloud's token."""
        pending = []
        for position, tokens in self.withheld:
            kept = kept_when_decided(seq, position, tokens)
            if kept is None:
                pending.append((position, tokens))
            else:
                self.learn(kept + 1)
        self.withheld = pending

    def learn(self, tau: int) -> None:
        self.tau_hat = ema(self.tau_hat, tau)
        self.history.tau.add(tau)
