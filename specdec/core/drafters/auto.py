"""Speculation that knows when not to speculate (`--drafter auto`): prompt lookup (cost ~0 to propose)
whose block is sent only while it pays; otherwise the block is empty, and the verify is a plain step of
the cloud model (one token in, its next token out). Greedy output is the cloud's either way, so the
choice can change every cycle.

A block of n draft tokens is one forward over n + 1 tokens (the last accepted one and the draft) that
yields tau = accepted + 1 tokens; a plain step is one forward over 1 token that yields 1. So

    send the block  <=>  tau_hat > t_block(n + 1) / t_plain(1)

t_block(m), t_plain(m): a verify forward's seconds for m tokens fed, running means per m over this
engine's generations, blocks and plain steps apart (the machine's cost curve: on 2026-11-25, 2
threads, a 5-token block cost 1.07 token steps in torch-int8 and 2.9 in llama.cpp Q4_K_M, so the same
acceptance pays in one runtime and not the other). Until both are measured the ratio is taken as 1.
tau_hat: the running mean (EMA, alpha 0.5) of tokens per verify a block gets, starting from the mean
over the engine's earlier requests (2.0 before any). A withheld block still teaches it: the plain steps
that follow decide the tokens the block proposed, so its tau is read off for free once they are in
(matched prefix + 1: exactly what a greedy verify would have accepted; under sampling an estimate).

A cloud held in two runtimes (`--cloud-runtime llamacpp+torch-int8`: plain steps in the first, blocks
in the second, DraftContext.cloud_caches 2) adds a switching cost: the blocks' runtime first feeds the
c tokens it has not seen (on its first block, the whole prompt). A switch is made only if what the
blocks save over the tokens still to generate pays for that feed:

    (t_plain(1) - t_block(n + 1) / tau_hat) * remaining  >  (c - 1) * r_block

r_block: the blocks' runtime's seconds per token over its catch-up feeds so far (0 before any: switch,
and learn). A 1,000-token prompt at ~10 ms a token costs ~10 s to catch up, more than 128 tokens can
save, so on long inputs the plain steps stay in the plain runtime (and the whole request is plain).
"""
from __future__ import annotations

import time

from specdec.core.drafters.interface import DraftContext, DraftFree, DraftNote, Proposal, register_drafter
from specdec.core.drafters.prompt_lookup import PromptLookup
from specdec.core.session import AcceptedSequence
from specdec.core.verdict import Verdict

ALPHA = 0.5  # EMA weight of the newest block's tokens per verify
PRIOR_TAU = 2.0  # tokens per verify assumed before any block was verified on this engine
PLAIN = "plain"  # the name a withheld (empty) block is traced under
BLOCK, STEP = "block", "plain"  # the two kinds of verify forward a CostCurve keeps apart


class CostCurve:
    """Running mean seconds of a verify forward by its kind (block or plain step) and the tokens it fed,
    catch-up feeds' seconds per token, and tokens per verify: kept across an engine's generations."""

    def __init__(self) -> None:
        self.seconds: dict[tuple[str, int], list[float]] = {}  # (kind, tokens fed) -> [sum of seconds, count]
        self.catch_up = [0.0, 0]  # [seconds, tokens] of block feeds that carried tokens the blocks' cache had not seen
        self.tau = [0.0, 0]  # [sum of tokens per block, blocks] (sent or read off plain steps) over earlier requests

    def observe(self, kind: str, tokens_fed: int, seconds: float) -> None:
        entry = self.seconds.setdefault((kind, tokens_fed), [0.0, 0])
        entry[0] += seconds
        entry[1] += 1

    def mean(self, kind: str, tokens_fed: int) -> float | None:
        total, n = self.seconds.get((kind, tokens_fed), (0.0, 0))
        return total / n if n else None

    def ratio(self, tokens_fed: int) -> float:
        """t_block(tokens_fed) / t_plain(1); 1 until both are measured."""
        block, step = self.mean(BLOCK, tokens_fed), self.mean(STEP, 1)
        return block / step if block and step else 1.0

    def catch_up_s_per_token(self) -> float:
        seconds, tokens = self.catch_up
        return seconds / tokens if tokens else 0.0

    def prior_tau(self) -> float:
        total, n = self.tau
        return total / n if n else PRIOR_TAU


@register_drafter("auto", weighs_runtimes=True)
class Auto(DraftFree):
    name = "auto"

    def __init__(self, context: DraftContext) -> None:
        super().__init__()
        self.lookup = PromptLookup(context)  # its settings, checked there
        self.curve: CostCurve = context.memory.setdefault(self.name, CostCurve())
        self.two_runtimes = context.cloud_caches > 1
        self.tau_hat = self.curve.prior_tau()
        self.blocks_seen = 0  # accepted tokens the blocks' cache holds (two runtimes; its first block feeds the prompt)
        self.withheld: list[tuple[int, list[int]]] = []  # (position, tokens) of blocks not sent, until the steps decide them

    def propose(self, seq: AcceptedSequence, k: int) -> Proposal:
        start = time.perf_counter()
        tokens = self.lookup.propose(seq, k).tokens
        send = tokens.numel() > 0 and self.pays(seq, tokens.numel())
        if tokens.numel() and not send:
            self.withheld.append((seq.length, tokens.tolist()))
        self.compute_s += time.perf_counter() - start
        if send:
            return Proposal(tokens, None, seq.length, "prompt-lookup")
        return Proposal(tokens[:0], None, seq.length, PLAIN)

    def pays(self, seq: AcceptedSequence, n: int) -> bool:
        """The rule in the module's docstring."""
        if self.tau_hat <= self.curve.ratio(n + 1):
            return False
        behind = seq.length - self.blocks_seen
        if not self.two_runtimes or behind <= 1:
            return True
        step, block = self.curve.mean(STEP, 1), self.curve.mean(BLOCK, n + 1)
        if step is None or block is None:
            return True  # not measured yet: switch, and learn
        saved_s = (step - block / self.tau_hat) * seq.remaining
        return saved_s > (behind - 1) * self.curve.catch_up_s_per_token()

    def rollback(self, seq: AcceptedSequence, proposal: Proposal, verdict: Verdict | None) -> DraftNote:
        """Learn from the verify: its forward's seconds by kind and tokens fed, a sent block's tokens per
        verify, and those of withheld blocks whose tokens the plain steps have now decided."""
        if verdict is None:
            return DraftNote()
        seconds = verdict.read_at - verdict.sent_at
        if len(proposal):
            self.curve.observe(BLOCK, verdict.tokens_in, seconds)
            if verdict.tokens_in > len(proposal) + 1:  # the blocks' cache caught up: its per-token cost
                self.curve.catch_up[0] += seconds
                self.curve.catch_up[1] += verdict.tokens_in
            self.blocks_seen = proposal.base + verdict.accepted
            self.learn(verdict.accepted + 1)
        else:
            self.curve.observe(STEP, verdict.tokens_in, seconds)
        self.read_withheld(seq)
        return DraftNote()

    def read_withheld(self, seq: AcceptedSequence) -> None:
        """A withheld block at position p proposed d_0..d_{n-1}; once the accepted sequence decides them,
        a greedy verify would have kept the matching prefix and added the cloud's token."""
        pending = []
        for position, tokens in self.withheld:
            decided = seq.ids[position : position + len(tokens)].tolist()
            matched = next((i for i, (a, b) in enumerate(zip(decided, tokens)) if a != b), len(decided))
            if matched < len(decided) or len(decided) == len(tokens):
                self.learn(matched + 1)
            else:
                pending.append((position, tokens))
        self.withheld = pending

    def learn(self, tau: int) -> None:
        self.tau_hat = ALPHA * tau + (1 - ALPHA) * self.tau_hat
        self.curve.tau[0] += tau
        self.curve.tau[1] += 1
