"""What an engine's requests teach its next ones: one `History` per engine, kept from its first request
until `Engine.forget_history` (an untimed warm-up's lessons dropped; the assumed block costs stay). The
engine closes each request (`close_request`): its answer's length is what later requests expect to
decode. Nothing here decides: the rules that read it are pure (specdec/core/payoff.py) or sit beside
what they route (specdec/core/two_runtime.py), and every record is a running mean (running.py).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from specdec.core.running import RunningMean
from specdec.core.session import AcceptedSequence
from specdec.core.verdict import Route, Verdict

PRIOR_TAU = 2.0  # tokens per verify a block is assumed to yield before any block was verified on an engine
T = TypeVar("T")


class VerifyCosts:
    """Mean seconds of the cloud's verify forwards by route and tokens fed (a block: n + 1; a plain step: 1).
    A verify that fed more than its cycle's own tokens (a prefill, a catch-up) is a rate per token
    (`RuntimeRates.catch_up`), never a forward's cost: the nearest block size would otherwise be a
    900-token feed."""

    def __init__(self) -> None:
        self.seconds: dict[tuple[Route, int], RunningMean] = {}

    def observe(self, route: Route, tokens_fed: int, seconds: float) -> None:
        self.seconds.setdefault((route, tokens_fed), RunningMean()).add(seconds)

    def observe_verify(self, route: Route, drafted: int, verdict: Verdict) -> None:
        """A verify of `drafted` tokens on `route`, kept only if it fed nothing but them and the last token."""
        if verdict.tokens_in == drafted + 1:
            self.observe(route, verdict.tokens_in, verdict.read_at - verdict.sent_at)

    def mean(self, route: Route, tokens_fed: int) -> float | None:
        record = self.seconds.get((route, tokens_fed))
        return None if record is None else record.mean

    def block_steps(self, prior: dict[int, float]) -> dict[int, float]:
        """Each block size's cost in plain steps (rows fed -> steps): measured where a block of that size and a plain
        step both were, else `prior` (the machine's calibration)."""
        step = self.mean(Route.STEP, 1)
        measured = {} if step is None else {rows: record.mean / step for (route, rows), record in self.seconds.items()
                                             if route is Route.BLOCK and record.mean is not None}
        return {**prior, **measured}

    def nearest(self, route: Route, tokens_fed: int) -> float | None:
        """The mean at `tokens_fed`, else at the nearest size measured on `route` (the smaller of two as near);
        None when nothing was."""
        sizes = [m for r, m in self.seconds if r is route]
        if not sizes:
            return None
        return self.mean(route, min(sizes, key=lambda m: (abs(m - tokens_fed), m)))


@dataclass
class RuntimeRates:
    """One runtime of a cloud held in two, over an engine's requests."""

    catch_up: RunningMean = field(default_factory=RunningMean)  # seconds per token of feeds that caught its cache up
    decoding: RunningMean = field(default_factory=RunningMean)  # seconds per emitted token of its verifies that fed
    # only their cycle's own tokens (it ran the cycle before too): the runtime's decoding rate


@dataclass
class EdgeCosts:
    """The edge model's drafting, as the hybrid weighs it."""

    proposal: RunningMean = field(default_factory=RunningMean)  # seconds per model proposal that fed <= 2 accepted tokens
    catch_up: RunningMean = field(default_factory=RunningMean)  # seconds per token of proposals that caught its cache up


class History:
    """What one engine's generations measured, for its next ones."""

    def __init__(self, block_steps_prior: dict[int, float] | None = None) -> None:
        # a verify block's cost in plain steps by tokens fed, assumed until measured (the machine's calibration)
        self.block_steps_prior = dict(block_steps_prior or {})
        self.verify = VerifyCosts()  # the cloud's verify forwards
        self.tau = RunningMean()  # tokens per verify of the drafter's blocks (auto: lookup's, hybrid: the model's)
        self.answers = RunningMean()  # tokens per answer of the closed requests
        self.plain_runtime, self.blocks_runtime = RuntimeRates(), RuntimeRates()  # a cloud held in two runtimes
        self.blocks_prefilled = RunningMean()  # seconds per emitted token in requests the blocks' runtime prefilled
        self.edge = EdgeCosts()
        # What a drafter keeps of its own (the n-gram cache's counts), by name: each of its own type, which only that
        # drafter reads (`own`), so the table holds Any.
        self.drafters: dict[str, Any] = {}

    def own(self, name: str, make: Callable[[], T]) -> T:
        """Drafter `name`'s own record, made on its first generation."""
        if name not in self.drafters:
            self.drafters[name] = make()
        return self.drafters[name]

    def tau_prior(self) -> float:
        """A new request's τ̂ before its first block: the mean over earlier requests, PRIOR_TAU before any."""
        mean = self.tau.mean
        return PRIOR_TAU if mean is None else mean

    def close_request(self, answer_tokens: int) -> None:
        """A request ended with an answer of `answer_tokens`: later requests expect about as many."""
        self.answers.add(answer_tokens)

    def tokens_left(self, seq: AcceptedSequence) -> float:
        """Tokens this request will still decode: the mean length of earlier answers (many stop well before
        the budget: RAG's at ~20 of 128) less what it has, at least 1 and at most the budget left; the budget
        left before any answer is known."""
        mean = self.answers.mean
        return seq.remaining if mean is None else min(seq.remaining, max(mean - len(seq.generated), 1.0))
