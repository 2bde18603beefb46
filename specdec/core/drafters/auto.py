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
acceptance pays in one runtime and not the other). Until both are measured the ratio is the machine's
calibrated block cost in steps where the engine was told it (Engine.assume_block_costs: the sweep passes
its calibration's curve for the cloud's runtime), else 1.
tau_hat: the running mean (EMA, alpha 0.5) of tokens per verify a block gets, starting from the mean
over the engine's earlier requests (2.0 before any). A withheld block still teaches it: the plain steps
that follow decide the tokens the block proposed, so its tau is read off for free once they are in
(matched prefix + 1: exactly what a greedy verify would have accepted; under sampling an estimate).

A cloud held in two runtimes (`--cloud-runtime llamacpp+torch-int8`: plain steps in the first, blocks
in the second, DraftContext.cloud_caches 2) adds a switching cost: the runtime switched to first feeds
the c tokens it has not seen (the blocks' runtime on its first block: the whole prompt). So auto keeps a
mode, plain steps (A) or blocks (B), and switches only when the rest of the answer pays for the feed:

    a = t_plain(1)                                  seconds a token in A
    b = max(t_block(n + 1) / tau_hat, b_B)          seconds a token in B, by this block and B's record
    A -> B  iff  (a - b) * N  >  (c_B - 1) * r_B
    B -> A  iff  (b_B - a) * N  >  (c_A - 1) * r_A

b_B: B's measured seconds per emitted token over all its cycles (holds and blocks), once it has any
(before: this block's estimate alone to enter, and no leaving). Judged cycle by cycle, a good block sent
a request to B and the next cycle's hold sent it back: on math questions (2026-11-25) 6 round trips a
request, their catch-up feeds 24 s of the 58 s that 10 requests spent in the cloud.

N: the tokens the request will still decode, estimated as the mean length of this engine's earlier
answers less what it has (at least 1, at most its budget left; the budget before any answer is known).

r_A, r_B: each runtime's measured seconds per catch-up token (before any, the other's; a block not yet
measured is assumed to cost a plain step). In B a cycle whose lookup finds nothing is a one-token block
guessing the last token again (`hold`: a verify in B costs about its plain step, where an empty block
would be a plain step in A, and a switch). A 1,000-token article at ~10 ms a token costs ~10 s to catch
up, more than 128 tokens can save, so a request stays in the runtime that prefilled its prompt.

Which runtime prefills, at a request's first cycle (c = prompt tokens):

    start in B  iff  c * r_B + N * b_B  <  c * r_A + N * a_A

a_A, b_B: each runtime's measured seconds per emitted token (A's plain steps; B's holds and lookup
blocks together) and r_A, r_B only each runtime's own measurements. The engine's first request starts
in A (measuring r_A and a_A); while B's are unmeasured, the first request whose prefill in A would cost
more than decoding its answer there (c * r_A > N * a_A) starts in B to measure them: one request pays
for finding out, and only one whose prompt is long enough for a faster prefill to matter. Measured on
Spec-Bench's questions (2026-11-25, 2 threads; medians, prefill over prompts of 400+ tokens): llama.cpp
Q4_K_M prefilled 10.1 ms a prompt token and decoded 33 ms a token, int8 6.0 and 61 ms. A 780-token RAG
question whose answers run ~20 tokens prefills 3.2 s faster in int8 and decodes 0.6 s slower there; a
60-token MT-bench question stays in llama.cpp.

What this replaced, each measured on that run's questions: the first cycle always a plain step in A
(RAG at plain llama.cpp's 0.58x of plain int8); the rule above with b_B taken from one hold's time and
the prior tau (2.0) and N the whole budget (a 197-ms hold after a RAG prefill sent the request back to
A, which prefilled it again: 0.55x; MT-bench prompts went to B on the prior's promise: 0.91x); before
both, a lookup match in the chat template that made the first cycle a block, each runtime prefilling
the whole prompt (11 s + 18 s on a 740-token RAG question).
"""
from __future__ import annotations

import time

from specdec.core.drafters.interface import BLOCK_STEPS_PRIOR, DraftContext, DraftFree, DraftNote, Proposal, register_drafter
from specdec.core.drafters.prompt_lookup import PromptLookup
from specdec.core.session import AcceptedSequence
from specdec.core.verdict import Verdict

ALPHA = 0.5  # EMA weight of the newest block's tokens per verify
PRIOR_TAU = 2.0  # tokens per verify assumed before any block was verified on this engine
PLAIN = "plain"  # the name a withheld (empty) block is traced under
HOLD = "hold"  # a one-token guess that keeps a two-runtime cloud in its blocks' runtime
BLOCK, STEP = "block", "plain"  # the two kinds of verify forward a CostCurve keeps apart


class CostCurve:
    """Running mean seconds of a verify forward by its kind (block or plain step) and the tokens it fed,
    catch-up feeds' seconds per token, and tokens per verify: kept across an engine's generations."""

    def __init__(self) -> None:
        self.seconds: dict[tuple[str, int], list[float]] = {}  # (kind, tokens fed) -> [sum of seconds, count]
        self.catch_up = {BLOCK: [0.0, 0], STEP: [0.0, 0]}  # [seconds, tokens] of feeds that caught a cache up
        self.decoded = {BLOCK: [0.0, 0], STEP: [0.0, 0]}  # [seconds, tokens emitted] by verifies of their own block
        self.whole_answers_in_blocks = [0.0, 0]  # the same, B's, in requests B prefilled: its rate over whole answers
        self.tau = [0.0, 0]  # [sum of tokens per block, blocks] (sent or read off plain steps) over earlier requests
        self.answers = [0, 0]  # [sum of tokens, requests]: the lengths of earlier answers
        self.answer_so_far = 0  # the newest request's tokens so far: an answer once the next request opens
        self.prior: dict[int, float] = {}  # tokens fed -> a block's assumed cost in plain steps, before measuring

    def observe(self, kind: str, tokens_fed: int, seconds: float) -> None:
        entry = self.seconds.setdefault((kind, tokens_fed), [0.0, 0])
        entry[0] += seconds
        entry[1] += 1

    def mean(self, kind: str, tokens_fed: int) -> float | None:
        total, n = self.seconds.get((kind, tokens_fed), (0.0, 0))
        return total / n if n else None

    def nearest(self, kind: str, tokens_fed: int) -> float | None:
        """The mean at `tokens_fed`, else at the nearest size measured (a one-token hold before any was
        sent: about a 4-token block's cost in int8); None when none of `kind` was."""
        sizes = [m for k, m in self.seconds if k == kind]
        if not sizes:
            return None
        return self.mean(kind, min(sizes, key=lambda m: (abs(m - tokens_fed), m)))

    def ratio(self, tokens_fed: int) -> float:
        """t_block(tokens_fed) / t_plain(1); until both are measured, the assumed block cost in steps
        (`prior`: the machine's calibration, Engine.assume_block_costs), else 1."""
        block, step = self.mean(BLOCK, tokens_fed), self.mean(STEP, 1)
        return block / step if block and step else self.prior.get(tokens_fed, 1.0)

    def catch_up_s_per_token(self, kind: str) -> float:
        """Measured seconds per token of the feeds that caught `kind`'s runtime up; before any, the
        other runtime's (both feed the same model's prompt: the first request's prefill measures one
        of them); before either, 0."""
        for which in (kind, STEP if kind == BLOCK else BLOCK):
            if (measured := self.own_catch_up_s_per_token(which)) is not None:
                return measured
        return 0.0

    def own_catch_up_s_per_token(self, kind: str) -> float | None:
        """`kind`'s runtime's own measured seconds per catch-up token; None before its first feed."""
        seconds, tokens = self.catch_up[kind]
        return seconds / tokens if tokens else None

    def prior_tau(self) -> float:
        total, n = self.tau
        return total / n if n else PRIOR_TAU

    def decode_s_per_token(self, kind: str, whole_answers: bool = False) -> float | None:
        """Seconds per emitted token of `kind`'s verifies that fed only their own block (a runtime's
        decoding rate, lookup's blocks and holds together in B; `whole_answers`: B's in requests it
        prefilled, not in stretches a good block switched to it); None before any."""
        seconds, tokens = self.whole_answers_in_blocks if whole_answers and kind == BLOCK else self.decoded[kind]
        return seconds / tokens if tokens else None

    def open_request(self) -> None:
        """A new request: the previous one's tokens so far were its answer."""
        if self.answer_so_far:
            self.answers[0] += self.answer_so_far
            self.answers[1] += 1
        self.answer_so_far = 0

    def tokens_left(self, seq: AcceptedSequence) -> float:
        """Tokens this request will still decode: the mean length of earlier answers (many stop well
        before the budget: RAG's at ~20 of 128) less what it has, at least 1 and at most the budget left;
        the budget left before any answer is known."""
        total, n = self.answers
        return min(seq.remaining, max(total / n - len(seq.generated), 1.0)) if n else seq.remaining


@register_drafter("auto", weighs_runtimes=True)
class Auto(DraftFree):
    name = "auto"

    def __init__(self, context: DraftContext) -> None:
        super().__init__()
        self.lookup = PromptLookup(context)  # its settings, checked there
        self.curve: CostCurve = context.memory.setdefault(self.name, CostCurve())
        self.curve.prior = context.memory.get(BLOCK_STEPS_PRIOR, {})
        self.curve.open_request()
        self.two_runtimes = context.cloud_caches > 1
        self.tau_hat = self.curve.prior_tau()
        self.seen = {BLOCK: 0, STEP: 0}  # accepted tokens each runtime's cache holds (two runtimes)
        self.in_blocks = False  # two runtimes: the mode, blocks (B) or plain steps (A)
        self.prefilled_in_blocks = False  # two runtimes: B fed this request's prompt
        self.withheld: list[tuple[int, list[int]]] = []  # (position, tokens) of blocks not sent, until the steps decide them

    def propose(self, seq: AcceptedSequence, k: int) -> Proposal:
        start = time.perf_counter()
        tokens = self.lookup.propose(seq, k).tokens
        n = tokens.numel()
        send = self.stay_in_blocks(seq, n) if self.two_runtimes else n > 0 and self.tau_hat > self.curve.ratio(n + 1)
        if n and not send:
            self.withheld.append((seq.length, tokens.tolist()))
        self.compute_s += time.perf_counter() - start
        if send and n:
            return Proposal(tokens, None, seq.length, "prompt-lookup")
        if send:
            return Proposal(seq.ids[-1:].clone(), None, seq.length, HOLD)
        return Proposal(tokens[:0], None, seq.length, PLAIN)

    def stay_in_blocks(self, seq: AcceptedSequence, n: int) -> bool:
        """Two runtimes: whether this cycle is a block (mode B), by the rules in the module's docstring."""
        if not self.seen[STEP] and not self.seen[BLOCK]:
            return self.prefill_in_blocks(seq)
        step, block = self.curve.mean(STEP, 1), self.curve.nearest(BLOCK, max(n, 1) + 1)
        if step is None:
            return n > 0  # not measured yet: send what lookup finds, and learn
        block = step if block is None else block  # no block measured yet: assume a block costs a step
        per_token_a, this_block, in_b = step, block / (self.tau_hat if n else 1.0), self.curve.decode_s_per_token(BLOCK)
        left = self.curve.tokens_left(seq)
        if self.in_blocks:  # leave B only on its record, not on one cycle's hold (before any record: stay, and learn)
            behind, per_token_b = seq.length - self.seen[STEP], per_token_a if in_b is None else in_b
            return not (per_token_b - per_token_a) * left > (behind - 1) * self.curve.catch_up_s_per_token(STEP)
        behind, per_token_b = seq.length - self.seen[BLOCK], this_block if in_b is None else max(this_block, in_b)
        return n > 0 and (per_token_a - per_token_b) * left > (behind - 1) * self.curve.catch_up_s_per_token(BLOCK)

    def prefill_in_blocks(self, seq: AcceptedSequence) -> bool:
        """Two runtimes, a request's first cycle: whether B (rather than A) prefills its prompt."""
        curve, prompt, left = self.curve, seq.length, self.curve.tokens_left(seq)
        r_a, r_b = curve.own_catch_up_s_per_token(STEP), curve.own_catch_up_s_per_token(BLOCK)
        a, b = curve.decode_s_per_token(STEP), curve.decode_s_per_token(BLOCK, whole_answers=True)
        if r_a is None or a is None:
            return False  # the engine's first request: A prefills, measuring r_A and a
        if r_b is None or b is None:
            return prompt * r_a > left * a  # B measured once, where a faster prefill could matter
        return prompt * r_b + left * b < prompt * r_a + left * a

    def rollback(self, seq: AcceptedSequence, proposal: Proposal, verdict: Verdict | None) -> DraftNote:
        """Learn from the verify: its forward's seconds by kind and tokens fed (a feed beyond the block's
        own tokens: the runtime caught up, its seconds per token), the decoding rate of a runtime that also
        ran the cycle before, a lookup block's tokens per verify, and those of withheld blocks whose tokens
        the plain steps have now decided."""
        self.curve.answer_so_far = len(seq.generated)
        if verdict is None:
            return DraftNote()
        seconds, kind = verdict.read_at - verdict.sent_at, BLOCK if len(proposal) else STEP
        if verdict.tokens_in > len(proposal) + 1:  # a prefill or a catch-up: a rate per token, not a block's cost
            self.curve.catch_up[kind][0] += seconds
            self.curve.catch_up[kind][1] += verdict.tokens_in
        else:
            self.curve.observe(kind, verdict.tokens_in, seconds)
        first = not self.seen[STEP] and not self.seen[BLOCK]
        if not first and self.in_blocks == (kind == BLOCK):  # the runtime that ran the cycle before: decoding
            for record in [self.curve.decoded[kind]] + ([self.curve.whole_answers_in_blocks] if self.prefilled_in_blocks else []):
                record[0] += seconds  # (a stateless verifier's calls each feed the whole context: that is its rate)
                record[1] += verdict.accepted + 1
        self.prefilled_in_blocks = self.prefilled_in_blocks or (first and kind == BLOCK)
        self.seen[kind], self.in_blocks = proposal.base + verdict.accepted, kind == BLOCK
        if proposal.drafter == "prompt-lookup":
            self.learn(verdict.accepted + 1)
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
