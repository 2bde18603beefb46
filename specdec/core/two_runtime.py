"""The cloud model held in two runtimes (`--cloud-runtime PLAIN+BLOCKS`, e.g. llama.cpp, torch's dynamic int8): plain
steps in A, the runtime whose one-token forward is fastest, blocks in B, whose (n + 1)-token forward is
cheapest. Each keeps its own cache of the accepted prefix and catches up on what the other decided by one
feed at its next call (its first call: the whole prompt). Each cycle names its runtime, a `Route`: a plain
step in A (STEP), the block in B (BLOCK), or a plain step in B (STAY: switching back would cost A a feed).

The `Router` chooses one request's routes from what the engine's History measured, switching only when
the rest of the answer pays for the feed:

    a = t_plain(1)                                   seconds a token in A
    b = max(t_block(n + 1) / τ̂, b_B)                 seconds a token in B, by this block and B's record
    A -> B  iff  (a − b) · N  >  (c_B − 1) · r_B     (lookup has a block: n > 0)
    B -> A  iff  (b_B − a) · N  >  (c_A − 1) · r_A

c: the tokens the runtime switched to has not seen. r_A, r_B: each runtime's measured seconds per catch-up
token (before any, the other's; a block not yet measured costs a plain step). b_B: B's measured seconds
per emitted token over its cycles in a row, blocks and stays (before any: this block's estimate alone to
enter, and no leaving). N: the tokens the request will still decode (History.tokens_left). Judged cycle
by cycle, a good block sent a request to B and the next cycle sent it back: on math questions
(2026-11-25) 6 round trips a request, whose catch-up feeds took 24 s of the 58 s that 10 requests spent
in the cloud. A 1,000-token article at ~10 ms a token costs ~10 s to catch up, more than 128 tokens can
save, so a request stays in the runtime that prefilled its prompt.

Which runtime prefills, at a request's first cycle (c = prompt tokens):

    start in B  iff  c · r_B + N · b_B  <  c · r_A + N · a_A

a_A: A's measured seconds per emitted token; b_B: those of the requests B prefilled, over their whole
answers; r only each runtime's own. The engine's first request starts in A; while B is unmeasured, the
first request whose prefill in A would cost more than decoding its answer there (c · r_A > N · a_A) starts
in B to measure it: one request pays for finding out, one whose prompt is long enough for a faster
prefill to matter. On Spec-Bench's questions (2026-11-25, 2 threads; prompts of 400+ tokens) llama.cpp
Q4_K_M prefilled 10.1 ms a prompt token and decoded 33 ms a token, int8 6.0 and 61 ms: a 780-token RAG
question whose answers run ~20 tokens prefills 3.2 s faster in int8 and decodes 0.6 s slower there; a
60-token MT-bench question stays in llama.cpp.

What this replaced, each measured on that run's questions: the first cycle always a plain step in A (RAG
at 0.58× plain int8); b_B from one cycle's time and the prior τ̂, N the whole budget (one 197-ms cycle
after a RAG prefill sent the request back to A, which prefilled it again: 0.55×; MT-bench prompts went to
B on the prior's promise: 0.91×); before both, a lookup match in the chat template that made the first
cycle a block, each runtime prefilling the whole prompt (11 s + 18 s on a 740-token RAG question). A stay
was once a one-token block repeating the last token, the runtime read off the block's length.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec.backends.prompt import Prompt
from specdec.core.cloud import Cloud, CloudSession
from specdec.core.config import DecodeConfig, SpecConfig
from specdec.core.drafters.interface import Proposal
from specdec.core.history import History, RuntimeRates
from specdec.core.payoff import feed_pays
from specdec.core.processors import Constraints
from specdec.core.session import AcceptedSequence
from specdec.core.verdict import Route, Verdict
from specdec.errors import SpecdecError


class Router:
    """One request's routes, by the rules in the module's docstring; what they read is the engine's History."""

    def __init__(self, history: History) -> None:
        self.history = history
        self.plain_seen = self.blocks_seen = 0  # accepted tokens each runtime's cache holds (A's, B's)
        self.in_blocks = False  # the runtime of the last cycle: B (True) or A
        self.prefilled_in_blocks = False  # B fed this request's prompt

    def rates(self, in_blocks: bool) -> RuntimeRates:
        return self.history.blocks_runtime if in_blocks else self.history.plain_runtime

    def catch_up_s_per_token(self, in_blocks: bool) -> float:
        """A runtime's measured seconds per catch-up token; before any, the other's (both feed the same
        model's prompt: the first request's prefill measures one of them); before either, 0."""
        own, other = self.rates(in_blocks).catch_up.mean, self.rates(not in_blocks).catch_up.mean
        return own if own is not None else other if other is not None else 0.0

    def behind(self, seq: AcceptedSequence, in_blocks: bool) -> int:
        """Accepted tokens a runtime's cache has not seen: what switching to it feeds."""
        return seq.length - (self.blocks_seen if in_blocks else self.plain_seen)

    def route(self, seq: AcceptedSequence, drafted: int, tau_hat: float) -> Route:
        first = not self.plain_seen and not self.blocks_seen
        in_blocks = self.prefill_in_blocks(seq) if first else self.stay_in_blocks(seq, drafted, tau_hat)
        return Route.STEP if not in_blocks else Route.BLOCK if drafted else Route.STAY

    def stay_in_blocks(self, seq: AcceptedSequence, drafted: int, tau_hat: float) -> bool:
        """After a request's first cycle: whether this one runs in B (a block, or a stay when lookup has none)."""
        step = self.history.verify.mean(Route.STEP, 1)
        if step is None:
            return drafted > 0  # not measured yet: send what lookup finds, and learn
        in_b, left = self.history.blocks_runtime.decoding.mean, self.history.tokens_left(seq)
        if self.in_blocks:  # leave B only on its record, not on one cycle (before any record: stay, and learn)
            per_token_b = step if in_b is None else in_b
            feed_s = (self.behind(seq, False) - 1) * self.catch_up_s_per_token(False)
            return not feed_pays(per_token_b - step, left, feed_s)
        if not drafted:
            return False
        block = self.history.verify.nearest(Route.BLOCK, drafted + 1)
        this_block = (step if block is None else block) / tau_hat
        per_token_b = this_block if in_b is None else max(this_block, in_b)
        return feed_pays(step - per_token_b, left, (self.behind(seq, True) - 1) * self.catch_up_s_per_token(True))

    def prefill_in_blocks(self, seq: AcceptedSequence) -> bool:
        """A request's first cycle: whether B (rather than A) prefills its prompt."""
        prompt, left = seq.length, self.history.tokens_left(seq)
        r_a, r_b = self.history.plain_runtime.catch_up.mean, self.history.blocks_runtime.catch_up.mean
        a, b = self.history.plain_runtime.decoding.mean, self.history.blocks_prefilled.mean
        if r_a is None or a is None:
            return False  # the engine's first request: A prefills, measuring r_A and a
        if r_b is None or b is None:
            return prompt * r_a > left * a  # B measured once, where a faster prefill could matter
        return prompt * r_b + left * b < prompt * r_a + left * a

    def observe(self, proposal: Proposal, verdict: Verdict) -> None:
        """A feed beyond the cycle's own tokens (the runtime caught up) as a rate per token; the decoding
        rate of a runtime that also ran the cycle before (a stateless verifier's calls each feed the whole
        context: that is its rate); what each runtime's cache now holds."""
        seconds, in_blocks = verdict.read_at - verdict.sent_at, proposal.verified_as.in_blocks
        rates, emitted = self.rates(in_blocks), verdict.accepted + 1
        if verdict.tokens_in > len(proposal) + 1:
            rates.catch_up.add(seconds, verdict.tokens_in)
        first = not self.plain_seen and not self.blocks_seen
        if not first and self.in_blocks == in_blocks:
            rates.decoding.add(seconds, emitted)
            if self.prefilled_in_blocks:  # wherever its cycles run: B's prefill is paid for by the whole answer
                self.history.blocks_prefilled.add(seconds, emitted)
        self.prefilled_in_blocks = self.prefilled_in_blocks or (first and in_blocks)
        if in_blocks:
            self.blocks_seen = proposal.base + verdict.accepted
        else:
            self.plain_seen = proposal.base + verdict.accepted
        self.in_blocks = in_blocks


class TwoRuntimeSession:
    """One generation on a cloud model held in two runtimes: each verify goes where its route says, a plain
    step (STEP) to `plain`, a block or a stay to `blocks`. The cached verifier feeds every accepted token a
    runtime has not seen, so each catches up on what the other decided at its next call."""

    round_trip_s = None  # both in process

    def __init__(self, plain: CloudSession, blocks: CloudSession) -> None:
        self.plain, self.blocks = plain, blocks
        self.last: CloudSession | None = None  # the one that verified last: the only one past the accepted prefix

    @property
    def compute_s(self) -> float:
        return self.plain.compute_s + self.blocks.compute_s

    def verify(self, seq: AcceptedSequence, draft_tokens: torch.Tensor, draft_probs: torch.Tensor | None,
               route: Route | None = None) -> Verdict:
        if route is None:
            raise SpecdecError("a cloud held in two runtimes verifies a routed proposal: use a drafter that weighs "
                               "the runtimes (auto)")
        if draft_tokens.numel() and route is not Route.BLOCK:
            raise SpecdecError(f"a {route.value} step carries no draft, got {draft_tokens.numel()} tokens")
        self.last = self.blocks if route.in_blocks else self.plain
        return self.last.verify(seq, draft_tokens, draft_probs)

    def rollback(self, length: int, seq: AcceptedSequence) -> None:
        assert self.last is not None, "rollback follows a verify, which set the session it ran on"
        self.last.rollback(length, seq)

    def close(self) -> None:
        self.plain.close()
        self.blocks.close()


@dataclass
class TwoRuntimeCloud:
    """The cloud model in two runtimes: on 2026-11-25, 2 threads, a 5-token block cost 2.9 token steps in
    llama.cpp Q4_K_M and 1.07 in torch's dynamic int8, whose single step is ~1.4x llama.cpp's. Memory: both copies of
    the weights (the 1.5B: ~1.1 GB GGUF + ~2 GB int8) and both KV caches. Only a drafter that asks a
    `Router` runs on it (drafters' `weighs_runtimes`)."""

    plain: Cloud
    blocks: Cloud

    @property
    def vocab_size(self) -> int:
        return min(self.plain.vocab_size, self.blocks.vocab_size)

    @property
    def accepts_audio(self) -> bool:
        return self.plain.accepts_audio and self.blocks.accepts_audio

    @property
    def accepts_trees(self) -> bool:
        return False  # chains only: its router weighs chains

    def open(self, prompt: Prompt, spec: SpecConfig, decode: DecodeConfig, constraints: Constraints, vocab: int,
             generator: torch.Generator) -> TwoRuntimeSession:
        opening = (prompt, spec, decode, constraints, vocab, generator)
        return TwoRuntimeSession(self.plain.open(*opening), self.blocks.open(*opening))
