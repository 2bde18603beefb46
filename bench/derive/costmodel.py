"""Where edge-cloud speculation pays: a cost model of one generation's timeline, from measured
inputs only (pure functions; `bench/derive/costfit.py` fits the inputs from a results folder).

One speculative cycle (k drafted tokens, j of them accepted, then a correction or the bonus):

  sequential, split     T = n·t_d + o + c + L + V(n + 1)      emitted j + 1
  co-located            T = n·t_d' + o + V(n + 1)             (no link; t_d' the draft model on the cloud's cores)
  cloud-only            T = t_v + o                            emitted 1
  edge-only             T = t_d                                emitted 1
  empty block (n = 0)   T = o + V_plain(1)                     emitted 1: a draft-free drafter with nothing
                                                               to propose, or `auto` withholding its block

A draft-free drafter (prompt lookup, `auto`) has t_d ≈ 0 (a lookup costs microseconds: taken as 0). A
cloud held in two runtimes (`PLAIN+BLOCKS`) verifies blocks on V (the blocks' runtime) and takes
plain steps on V_plain (the other's cloud-only step); without one, V_plain = V. The catch-up feed a switch
between them costs is not modelled: the prediction's error on such a point is what switching costs.

with t_d the edge's wall time per drafted token (forward + sampling), V(T) = a + b·T the verify
forward over T tokens fed (the accepted token the cloud has not seen + the n drafts), o the cloud's
non-forward time per verify (sampling, policy), c the split edge's own bookkeeping per call
(acceptance, rollback, the message; measured on the other split points), and the link per call
L = RTT + 8·up_bytes / up_bps + 8·down_bytes / down_bps + protocol_s (bench/core/network.py's
arithmetic plus what the protocol itself costs). Throughput is emitted / T over the distribution of
cycle outcomes (not only the mean acceptance: the last block of a generation is shorter, and drafting
ahead pays only on whole blocks), plus one prefill per generation.

The textbook case: i.i.d. acceptance α per position and blocks of k give
E[emitted] = (1 − α^(k+1)) / (1 − α) (Leviathan et al. 2023, "Fast Inference from Transformers via
Speculative Decoding", eq. 1), reproduced by `Acceptance.geometric`.

Drafting ahead (specdec/core/drafters/ahead.py): after sending a block the edge steps once to guess the bonus,
then drafts a = min(n, steps that fit the wait W = L + V(n + 1)) − 1 tokens after it. They are kept
only when the cloud accepts the whole block *and* its bonus equals the guess (π = P(whole block) ·
P(guess right)); then the next block needs only n − a more steps. Steady state:

  T_ahead = (n − π·a)·t_d + o + W                            (edge and server on their own cores)
  T_ahead += max(0, m·t_d − L)                               (cores shared: the m = a + 1 steps drafted
                                                              while the server computes slow it by theirs)

A server of N edges in lockstep runs one forward of N rows per cycle: V_N = a + b·N·(n + 1), so
per-edge rate E / (n·t_d + o + L + V_N) and server throughput N times that; cloud-only serving of N
users costs V(N) = a + b·N per step (with measured sizes, V interpolates them: `CostInputs.verify_s`).
"Speculation at a Distance" (arXiv 2606.25091) gives the saturated
server's capacity gain in closed form, 1 + γ·t_d / t_v (`distance_capacity_factor`), drawn beside ours.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from specdec.errors import ConfigError


def _positive(name: str, value: float, allow_zero: bool = False) -> None:
    ok = value >= 0 if allow_zero else value > 0
    if not (isinstance(value, (int, float)) and math.isfinite(value) and ok):
        raise ConfigError(f"{name} must be a finite number {'>= 0' if allow_zero else '> 0'}, got {value!r}")


@dataclass(frozen=True)
class Outcome:
    """One kind of cycle and how often it happens (weights of an `Acceptance` sum to 1)."""

    weight: float
    drafted: int  # n: edge draft steps (the block's length; 0: an empty block, a plain step of the cloud)
    accepted: int  # j <= n
    emitted: int  # j + 1 with a correction or bonus, j when the block ended the generation
    escalated: bool = True  # False: the gate kept the block without a cloud call

    def __post_init__(self) -> None:
        if not (0 <= self.accepted <= self.drafted and self.emitted >= self.accepted and (self.drafted or self.escalated)):
            raise ConfigError(f"a cycle outcome needs 0 <= accepted <= drafted, emitted >= accepted, and an empty block "
                              f"escalated (a plain step of the cloud); got {self}")

    @property
    def whole(self) -> bool:
        """The cloud accepted every draft and added its bonus: what drafting ahead needs."""
        return self.escalated and self.accepted == self.drafted and self.emitted == self.drafted + 1


@dataclass(frozen=True)
class Acceptance:
    """The distribution of cycle outcomes for one (model pair, prompts, k, policy): it does not depend
    on the deployment, so any point of that group measures it. guess_rate: P(the edge's guess of the
    bonus is the cloud's bonus | the whole block was accepted)."""

    outcomes: tuple[Outcome, ...]
    guess_rate: float = 0.0

    def __post_init__(self) -> None:
        if not self.outcomes or abs(sum(o.weight for o in self.outcomes) - 1) > 1e-9 or min(o.weight for o in self.outcomes) < 0:
            raise ConfigError("an acceptance distribution needs outcomes with weights >= 0 that sum to 1")
        if not 0 <= self.guess_rate <= 1:
            raise ConfigError(f"guess_rate must be in [0, 1], got {self.guess_rate}")

    @classmethod
    def geometric(cls, alpha: float, k: int, guess_rate: float | None = None) -> Acceptance:
        """Leviathan et al.'s i.i.d. case: j accepted with P = α^j (1 − α) for j < k, α^k for j = k;
        the guess is one more position, right with P = α."""
        if not 0 <= alpha <= 1 or k < 1:
            raise ConfigError(f"geometric acceptance needs 0 <= alpha <= 1 and k >= 1, got {alpha}, {k}")
        outcomes = [Outcome(alpha ** j * (1 - alpha), k, j, j + 1) for j in range(k)]
        return cls((*outcomes, Outcome(alpha ** k, k, k, k + 1)), alpha if guess_rate is None else guess_rate)

    def mean(self, what) -> float:
        return sum(o.weight * what(o) for o in self.outcomes)

    @property
    def emitted_per_cycle(self) -> float:
        return self.mean(lambda o: o.emitted)

    @property
    def calls_per_cycle(self) -> float:
        return self.mean(lambda o: o.escalated)

    @property
    def kept_probability(self) -> float:
        """π = P(whole block accepted with its bonus) · P(guess right)."""
        return self.mean(lambda o: o.whole) * self.guess_rate


def expected_emitted(alpha: float, k: int) -> float:
    """Leviathan et al. 2023, eq. (1): expected tokens per verify, (1 − α^(k+1)) / (1 − α)."""
    return k + 1.0 if alpha >= 1 else (1 - alpha ** (k + 1)) / (1 - alpha)


def distance_capacity_factor(k: int, draft_step_s: float, verify_step_s: float) -> float:
    """"Speculation at a Distance" (arXiv 2606.25091): a saturated server carries 1 + γ·t_d / t_v times
    more clients at the same per-client rate (γ the draft length, t_d, t_v per-step draft and verify)."""
    return 1 + k * draft_step_s / verify_step_s


@dataclass(frozen=True)
class Link:
    """One edge-cloud link as `specbench link` shapes it, plus the protocol's own cost per call."""

    rtt_s: float = 0.0
    uplink_bps: float = math.inf
    downlink_bps: float = math.inf
    protocol_s: float = 0.0  # per call: serialization, framing, the server's bookkeeping (measured on loopback)

    def __post_init__(self) -> None:
        _positive("rtt_s", self.rtt_s, allow_zero=True)
        _positive("protocol_s", self.protocol_s, allow_zero=True)
        for name in ("uplink_bps", "downlink_bps"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be > 0 (inf for free), got {getattr(self, name)!r}")

    def call_s(self, up_bytes: float, down_bytes: float) -> float:
        return self.rtt_s + 8 * up_bytes / self.uplink_bps + 8 * down_bytes / self.downlink_bps + self.protocol_s


@dataclass(frozen=True)
class CostInputs:
    """Every measured quantity the model reads (seconds, tokens, bytes)."""

    draft_step_s: float  # t_d: edge wall time per drafted token (forward + sampling), from edge-only decoding
    verify_a_s: float  # V(T) = a + b·T: the verify forward over T tokens fed
    verify_b_s_per_token: float
    acceptance: Acceptance
    # Measured (tokens fed, seconds) of the verify forward: V(T) interpolates them (the line a + b·T
    # carries it past their ends). A forward's cost is not one line over tokens: on one core a bf16
    # step of 1 token costs more than a verify of 2 (364 vs 336 ms, a matrix-vector path), int8 is flat
    # up to 5 tokens and then climbs, a llama.cpp verify costs ~50 ms per token fed.
    verify_points: tuple[tuple[float, float], ...] = ()
    verify_overhead_s: float = 0.0  # o: the cloud's non-forward time per verify / per token of plain decoding
    plain_step_s: float | None = None  # V_plain(1) + o_plain: an empty block's cost in a two-runtime cloud's plain
    # runtime (None: V(1) + o, the blocks' runtime)
    edge_prefill_extra_s: float = 0.0  # a generation's first draft step (the prompt) beyond t_d
    cloud_prefill_extra_s: float = 0.0  # its first verify (the prompt) beyond V(1)
    output_tokens: float = 64.0  # tokens per generation (the prefill is paid once per this many)
    colocated_draft_step_s: float | None = None  # t_d': the draft model on the cloud's cores (None: = t_d)
    up_bytes_per_call: float = 0.0  # what one verify call sends and receives
    down_bytes_per_call: float = 0.0
    link: Link = field(default_factory=Link)
    call_overhead_s: float = 0.0  # the split edge's own time per verify call beyond drafts, link and server
    overlap: bool = False  # draft ahead while a call is in flight
    cores_shared: bool = False  # edge and server on the same cores (one machine emulating two)

    def __post_init__(self) -> None:
        _positive("draft_step_s", self.draft_step_s, allow_zero=True)  # 0: a draft-free drafter
        _positive("verify_a_s", self.verify_a_s, allow_zero=True)
        _positive("verify_b_s_per_token", self.verify_b_s_per_token, allow_zero=True)
        if self.verify_a_s + self.verify_b_s_per_token <= 0:
            raise ConfigError("the verify cost curve a + b·tokens must be > 0 at one token")
        _positive("output_tokens", self.output_tokens)
        if self.plain_step_s is not None:
            _positive("plain_step_s", self.plain_step_s)
        for name in ("verify_overhead_s", "up_bytes_per_call", "down_bytes_per_call", "call_overhead_s"):
            _positive(name, getattr(self, name), allow_zero=True)
        if self.colocated_draft_step_s is not None:
            _positive("colocated_draft_step_s", self.colocated_draft_step_s)
        for tokens, seconds in self.verify_points:
            _positive("verify_points tokens", tokens)
            _positive("verify_points seconds", seconds)
        sizes = [t for t, _ in self.verify_points]
        if list(self.verify_points) != sorted(self.verify_points) or len(set(sizes)) != len(sizes):
            raise ConfigError("verify_points must be (tokens, seconds) pairs in increasing order of tokens, one per size")

    def verify_s(self, tokens: float) -> float:
        """V(T): between measured sizes the straight line joining them; outside them (or with none) the
        line a + b·T shifted to pass through the nearest measured size."""
        points = self.verify_points
        line = self.verify_a_s + self.verify_b_s_per_token * tokens
        if not points:
            return line
        (t_lo, s_lo), (t_hi, s_hi) = points[0], points[-1]
        if tokens <= t_lo:
            return max(s_lo + self.verify_b_s_per_token * (tokens - t_lo), 0.0)
        if tokens >= t_hi:
            return s_hi + self.verify_b_s_per_token * (tokens - t_hi)
        for (t0, s0), (t1, s1) in zip(points, points[1:]):
            if t0 <= tokens <= t1:
                return s0 + (s1 - s0) * (tokens - t0) / (t1 - t0)
        raise AssertionError("unreachable: tokens lies between the first and last measured size")


@dataclass(frozen=True)
class Prediction:
    tokens_per_s: float
    time_per_token_s: float  # steady state, prefill excluded
    cycle_s: float
    cloud_calls_per_token: float
    uplink_bytes_per_token: float
    ahead_kept_per_cycle: float = 0.0
    ahead_wasted_per_cycle: float = 0.0


def _rate(x: CostInputs, cycle_s: float, emitted: float, prefill_extra_s: float) -> float:
    """Pooled tokens/s of a generation of `output_tokens`: its cycles plus one prefill."""
    return x.output_tokens / (prefill_extra_s + x.output_tokens / emitted * cycle_s)


def _prefill_extra_s(x: CostInputs) -> float:
    return x.edge_prefill_extra_s + x.cloud_prefill_extra_s


def _outcome_s(x: CostInputs, o: Outcome, draft_step_s: float, link_s: float) -> float:
    """One sequential cycle of outcome `o`: n drafts, then (if escalated) the call and the verify; an empty
    block in a two-runtime cloud is its plain runtime's step."""
    if o.drafted == 0 and x.plain_step_s is not None:
        return x.call_overhead_s + link_s + x.plain_step_s
    return o.drafted * draft_step_s + (x.verify_overhead_s + x.call_overhead_s + link_s + x.verify_s(o.drafted + 1)
                                       if o.escalated else 0.0)


def _per_token(x: CostInputs, cycle_s: float, prefill_extra_s: float, calls: float | None = None,
               **ahead) -> Prediction:
    a = x.acceptance
    emitted = a.emitted_per_cycle
    calls = a.calls_per_cycle if calls is None else calls
    return Prediction(_rate(x, cycle_s, emitted, prefill_extra_s), cycle_s / emitted, cycle_s, calls / emitted,
                      calls * x.up_bytes_per_call / emitted, **ahead)


def sequential(x: CostInputs) -> Prediction:
    """Split speculation, one verify at a time: T = n·t_d + o + L + V(n + 1) per escalated cycle."""
    link_s = x.link.call_s(x.up_bytes_per_call, x.down_bytes_per_call)
    cycle_s = x.acceptance.mean(lambda o: _outcome_s(x, o, x.draft_step_s, link_s))
    return _per_token(x, cycle_s, _prefill_extra_s(x))


def colocated(x: CostInputs) -> Prediction:
    """Both models on the cloud's cores, no link: T = n·t_d' + o + V(n + 1)."""
    step_s = x.draft_step_s if x.colocated_draft_step_s is None else x.colocated_draft_step_s
    cycle_s = x.acceptance.mean(lambda o: _outcome_s(x, o, step_s, 0.0))
    prediction = _per_token(x, cycle_s, _prefill_extra_s(x))
    return replace(prediction, uplink_bytes_per_token=0.0)


def drafting_ahead(x: CostInputs) -> Prediction:
    """Split speculation drafting ahead, the pipeline's steady state (module docstring). Per
    escalated outcome: the wait W = L + V(n + 1); the edge fits m = min(n + 1, ⌊W / t_d⌋) steps in it
    (the guess and m − 1 ahead tokens, as the drafter's deadline allows); with probability π the
    next block starts with those m − 1 tokens."""
    a = x.acceptance
    link_s = x.link.call_s(x.up_bytes_per_call, x.down_bytes_per_call)
    kept_p = a.kept_probability

    def cycle(o: Outcome) -> tuple[float, float]:  # (seconds, ahead tokens drafted)
        if not o.escalated:
            return o.drafted * x.draft_step_s, 0.0
        wait_s = link_s + x.verify_overhead_s + x.verify_s(o.drafted + 1)
        steps = min(o.drafted + 1, math.floor(wait_s / x.draft_step_s + 1e-9))
        ahead = max(steps - 1, 0)
        seconds = (o.drafted - kept_p * ahead) * x.draft_step_s + wait_s + x.call_overhead_s
        if x.cores_shared:
            seconds += max(0.0, steps * x.draft_step_s - link_s)
        return seconds, ahead

    cycle_s = a.mean(lambda o: cycle(o)[0])
    ahead = a.mean(lambda o: cycle(o)[1])
    return _per_token(x, cycle_s, _prefill_extra_s(x), ahead_kept_per_cycle=kept_p * ahead,
                      ahead_wasted_per_cycle=(1 - kept_p) * ahead)


def split(x: CostInputs) -> Prediction:
    """The split deployment as configured: drafting ahead when `x.overlap`, else sequential."""
    return drafting_ahead(x) if x.overlap else sequential(x)


def cloud_only(x: CostInputs) -> Prediction:
    """Plain decoding on the cloud: one V(1) + o per token (streamed: no round trip per token)."""
    step_s = x.verify_s(1) + x.verify_overhead_s
    rate = x.output_tokens / (x.cloud_prefill_extra_s + x.output_tokens * step_s)
    return Prediction(rate, step_s, step_s, 0.0, 0.0)


def edge_only(x: CostInputs) -> Prediction:
    rate = x.output_tokens / (x.edge_prefill_extra_s + x.output_tokens * x.draft_step_s)
    return Prediction(rate, x.draft_step_s, x.draft_step_s, 0.0, 0.0)


def server_tokens_per_s(x: CostInputs, edges: int) -> tuple[float, float]:
    """(per-edge, server) tokens/s for `edges` split edges in lockstep: one forward of N rows per
    cycle, V_N = a + b·N·(n + 1); sequential cycles (drafting ahead hides the edge's part, not the server's)."""
    if edges < 1:
        raise ConfigError(f"a server needs at least one edge, got {edges}")
    link_s = x.link.call_s(x.up_bytes_per_call, x.down_bytes_per_call)

    def cycle(o: Outcome) -> float:
        if not o.escalated:
            return o.drafted * x.draft_step_s
        return o.drafted * x.draft_step_s + x.verify_overhead_s + x.call_overhead_s + link_s + x.verify_s(edges * (o.drafted + 1))

    per_edge = x.acceptance.emitted_per_cycle / x.acceptance.mean(cycle)
    return per_edge, edges * per_edge


def cloud_server_tokens_per_s(x: CostInputs, users: int) -> float:
    """Cloud-only serving of `users` at once: one token per row, a + b·N per step."""
    return users / (x.verify_s(users) + x.verify_overhead_s)
