"""`overlap = "auto"`: draft ahead only where it pays, decided from the cycles measured so far.

Drafting ahead (specdec/core/drafters/ahead.py) gains only on a *hit*: the cloud accepts the whole block and its
bonus token is the edge's guess; then the tokens drafted during the round trip are the next block's
first tokens and the edge skips that many forwards. Otherwise they are thrown away. It costs whatever
the drafting does to the verify it runs beside: on shared cores the edge's forwards slow the server's
(the edge process and the server oversubscribing two cores made split runs 0.61-0.80x as fast with
drafting ahead on the real pair), and a forward still running when the verdict lands delays it. Both
are in one measured number, the verify's time from send to verdict read with and without drafting ahead.

    gain_s = P(hit) * m * step_s,   m = min(k, floor(round_trip_s / step_s) - 1)
    cost_s = max(0, verify_ahead_s - verify_s)
    draft ahead  <=>  gain_s > cost_s

step_s is the edge's time per draft forward, round_trip_s and verify_s the mean send -> verdict time of
sequential cycles (m: the forwards that fit in one round trip after the guess's own, at most a block),
verify_ahead_s that of cycles that drafted ahead. P(hit) = P(full accept) * P(guess right | full
accept): the first from every verified block; the second from the guesses the edge made, and until
it made one, the per-token acceptance rate (greedy: the guess is the edge's next draft token, right
as often as a draft token is accepted).

The run starts sequential (WARMUP cycles: the step time, round trip and acceptance), then drafts ahead
for PROBE cycles (the cost), then follows the rule, re-deciding every cycle; every REPROBE-th cycle
runs the other way once, so the mean of the side not chosen follows the machine. Either way the
output is the same: drafting ahead is lossless (specdec/core/drafters/ahead.py), only the time differs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from specdec.core.running import RunningMean

WARMUP = 2  # verified cycles run sequentially first
PROBE = 2  # then verified cycles that draft ahead, to measure what it costs
REPROBE = 32  # after that, one cycle in this many runs the way not chosen (a wrong way costs its share)


@dataclass(frozen=True)
class OverlapEvidence:
    """What the rule reads, measured in this run (None: not measured yet)."""

    step_s: float | None  # edge seconds per draft forward
    verify_s: float | None  # send -> verdict read, sequential cycles (mean)
    verify_ahead_s: float | None  # send -> verdict read, cycles that drafted ahead (mean)
    full_accept_rate: float | None  # verified blocks accepted whole
    guess_rate: float | None  # P(bonus == guess | block accepted whole), or the per-token acceptance rate
    k: int  # draft tokens per block


def ahead_gain_s(e: OverlapEvidence) -> float:
    """Expected seconds one cycle saves by drafting ahead: P(hit) * forwards that fit * step_s."""
    if not e.step_s or e.verify_s is None or e.full_accept_rate is None or e.guess_rate is None:
        return 0.0
    fit = max(0, min(e.k, math.floor(e.verify_s / e.step_s) - 1))
    return e.full_accept_rate * e.guess_rate * fit * e.step_s


def draft_ahead_pays(e: OverlapEvidence) -> bool | None:
    """True: drafting ahead saves more than it costs; False: it does not; None: the cost is not
    measured yet (no cycle drafted ahead) or the gain has no inputs yet."""
    if e.verify_ahead_s is None or e.verify_s is None or not e.step_s:
        return None
    return ahead_gain_s(e) > max(0.0, e.verify_ahead_s - e.verify_s)


class OverlapGovernor:
    """The running means behind `overlap = "auto"`, for one engine: they carry across its
    generations (a sweep point's prompts), since the machine and the pair do not change between them."""

    def __init__(self, k: int) -> None:
        self.k = k
        self.sequential, self.ahead = RunningMean(), RunningMean()  # seconds send -> verdict read, per cycle
        self.step_s: float | None = None
        self.blocks = self.full = self.drafted = self.accepted = 0
        self.guesses = self.guess_hits = 0
        self.decided = 0  # cycles decided by the rule

    def evidence(self) -> OverlapEvidence:
        guess_rate = (self.guess_hits / self.guesses if self.guesses else
                      self.accepted / self.drafted if self.drafted else None)
        return OverlapEvidence(self.step_s, self.sequential.mean, self.ahead.mean,
                               self.full / self.blocks if self.blocks else None, guess_rate, self.k)

    def choose(self) -> bool:
        """Draft ahead during the next verify?"""
        if self.sequential.count < WARMUP:
            return False
        if self.ahead.count < PROBE:
            return True
        verdict = bool(draft_ahead_pays(self.evidence()))
        self.decided += 1
        return (not verdict) if self.decided % REPROBE == 0 else verdict

    def observe(self, ahead: bool, verify_s: float | None, step_s: float | None, drafted: int, accepted: int,
                guess: int | None, bonus: int | None) -> None:
        """One verified cycle: whether it drafted ahead (a guess was drafted), its send -> verdict read
        time (None: not a cycle's time, e.g. the call that opened the server's session), the edge's step
        time, the block's size and accepted count, the guess and the bonus."""
        if verify_s is not None:
            (self.ahead if ahead else self.sequential).add(verify_s)
        self.step_s = step_s if step_s is not None else self.step_s
        self.blocks += 1
        self.drafted += drafted
        self.accepted += accepted
        whole = accepted == drafted
        self.full += whole
        if whole and guess is not None and bonus is not None:
            self.guesses += 1
            self.guess_hits += guess == bonus
