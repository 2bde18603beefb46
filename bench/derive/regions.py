"""Where speculation pays over round trips × acceptance: the cost model (costmodel.py) evaluated on a
grid, which deployment is fastest in each cell, and the closed-form boundaries of "Speculation at a
Distance" (arXiv 2606.25091) written in the model's own symbols. Pure functions of fitted `CostInputs`.

A cell (RTT, α) replaces the fitted acceptance with Leviathan et al.'s i.i.d. case at α
(`Acceptance.geometric`: the edge's guess of the bonus right with P α) and the link's RTT, keeping the
fitted timings (t_d, V(T), o, the prefill), rates, protocol cost and bytes per call. Split runs at its
better way (sequential or drafting ahead: what `overlap = "auto"` aims for), and both speculative
deployments at their best k of those given.

Why edge-only is kept apart (`LOSSLESS`): split, co-located and cloud-only all emit the cloud's tokens;
edge-only emits the edge's. And a sequential cycle can never outrun the faster of its two models
alone: it emits at most k + 1 tokens in k·t_d + t_v, and (k + 1) / (k·t_d + t_v) ≤ max(1/t_d, 1/t_v).
So a four-way contest is won by edge-only wherever the edge is the faster model; the question a
deployment asks is which lossless way is fastest, and whether edge-only is faster still.
"""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from bench.derive.costmodel import (
    Acceptance,
    CostInputs,
    cloud_only,
    colocated,
    drafting_ahead,
    edge_only,
    expected_emitted,
    sequential,
)

WAYS = ("split", "co-located", "cloud-only", "edge-only")
LOSSLESS = WAYS[:3]  # the ways that emit the cloud's tokens


def at(x: CostInputs, alpha: float, k: int, rtt_s: float | None = None) -> CostInputs:
    """`x` with i.i.d. acceptance α over blocks of k and, if given, the link's RTT."""
    link = x.link if rtt_s is None else replace(x.link, rtt_s=rtt_s)
    return replace(x, acceptance=Acceptance.geometric(alpha, k), link=link)


def best_split_tokens_per_s(x: CostInputs) -> float:
    return max(sequential(x).tokens_per_s, drafting_ahead(x).tokens_per_s)


def rates(x: CostInputs, alpha: float, ks: tuple[int, ...], rtt_s: float, ways: tuple[str, ...] = WAYS) -> dict[str, float]:
    """tokens/s of each way at (RTT, α), the speculative ones at their best k of `ks`."""
    found = {}
    if "split" in ways:
        found["split"] = max(best_split_tokens_per_s(at(x, alpha, k, rtt_s)) for k in ks)
    if "co-located" in ways:
        found["co-located"] = max(colocated(at(x, alpha, k)).tokens_per_s for k in ks)
    if "cloud-only" in ways:
        found["cloud-only"] = cloud_only(x).tokens_per_s
    if "edge-only" in ways:
        found["edge-only"] = edge_only(x).tokens_per_s
    return found


def fastest(x: CostInputs, alpha: float, ks: tuple[int, ...], rtt_s: float, ways: tuple[str, ...] = WAYS) -> str:
    """The fastest of `ways` at (RTT, α); a tie goes to the way named first in WAYS."""
    found = rates(x, alpha, ks, rtt_s, ways)
    return max((w for w in WAYS if w in found), key=lambda w: found[w])


def rate_grid(x: CostInputs, rtts_s, alphas, ks: tuple[int, ...], ways: tuple[str, ...] = WAYS) -> dict[str, np.ndarray]:
    """way -> tokens/s on the grid, shape [len(alphas), len(rtts_s)] (rows: α, columns: RTT). Only
    split depends on the RTT; the others are computed once per α."""
    grid = {w: np.empty((len(alphas), len(rtts_s))) for w in ways}
    for i, alpha in enumerate(alphas):
        fixed = rates(x, float(alpha), ks, 0.0, tuple(w for w in ways if w != "split"))
        for w, rate in fixed.items():
            grid[w][i, :] = rate
        if "split" in ways:
            per_k = [at(x, float(alpha), k) for k in ks]  # the acceptance once per (α, k), the link per cell
            grid["split"][i, :] = [max(best_split_tokens_per_s(replace(xk, link=replace(xk.link, rtt_s=float(r))))
                                       for xk in per_k) for r in rtts_s]
    return grid


def winners(grid: dict[str, np.ndarray], ways: tuple[str, ...]) -> np.ndarray:
    """Per cell, the index into `ways` of the fastest (ties to the first)."""
    return np.argmax(np.stack([grid[w] for w in ways]), axis=0)


def _link_extra_s(x: CostInputs) -> float:
    """What a call costs beyond the RTT: the transfers at the link's rates and the protocol."""
    return replace(x.link, rtt_s=0.0).call_s(x.up_bytes_per_call, x.down_bytes_per_call)


def split_cloud_rtt_bound_s(x: CostInputs, alpha: float, k: int) -> float:
    """"Speculation at a Distance" (arXiv 2606.25091): split speculation beats cloud-only iff the
    tokens a cycle emits would take the cloud longer than the cycle, E·t_v > n·t_d + L + V(n + 1).
    In the model's symbols (t_v = V(1) + o per cloud token, the cycle's o included, E Leviathan
    et al.'s (1 − α^(k+1)) / (1 − α)) the RTT must stay below

        RTT* = E·(V(1) + o) − k·t_d − o − V(k + 1) − (transfers + protocol)

    Steady state, sequential cycles: the model also pays the edge's prefill once per generation
    (RTT* overstates its crossing by E·edge_prefill_extra_s / output_tokens) and drafting ahead can
    push it further right. Negative: split never beats cloud-only at this α."""
    emitted = expected_emitted(alpha, k)
    verify_step_s = x.verify_s(1) + x.verify_overhead_s
    cycle_s = k * x.draft_step_s + x.verify_overhead_s + x.verify_s(k + 1)
    return emitted * verify_step_s - cycle_s - _link_extra_s(x)


def ahead_colocated_rtt_bound_s(x: CostInputs, alpha: float, k: int) -> float:
    """"Speculation at a Distance" (arXiv 2606.25091): with drafting ahead, split beats co-located
    speculation only where the round trip is shorter than the edge's drafting window. Both emit the
    same tokens per cycle and pay the same o + V(k + 1), so in the model's symbols (a tokens drafted
    ahead in the wait, kept with π = α^k · α) split wins iff

        L < k·t_d' − (k − π·a)·t_d

    the drafting the edge hides in the wait (π·a·t_d) plus what it drafts faster than the cloud's
    cores (k·(t_d' − t_d)); a = k once the wait holds a whole next block, so at α → 1 the bound is the
    window k·t_d' itself, and a = 0 is the sequential split. a depends on the wait, hence on L: the
    bound is the L whose own a it was computed with (nan at a jump between two a's). With edge and
    server on shared cores the m = a + 1 steps drafted while the server computes slow it by
    max(0, m·t_d − L): below m·t_d no RTT makes split win. Returned as an RTT (transfers and protocol
    taken off); negative: split never beats co-located at this α."""
    step_s = x.draft_step_s
    near_step_s = step_s if x.colocated_draft_step_s is None else x.colocated_draft_step_s
    kept_p = Acceptance.geometric(alpha, k).kept_probability
    rest_s = x.verify_overhead_s + x.verify_s(k + 1)
    for ahead in range(k, -1, -1):
        link_s = k * near_step_s - (k - kept_p * ahead) * step_s
        steps = min(k + 1, math.floor((link_s + rest_s) / step_s + 1e-9))
        if max(steps - 1, 0) == ahead and not (x.cores_shared and link_s < steps * step_s):
            return link_s - _link_extra_s(x)
    return math.nan


def alpha_of(acceptance: Acceptance) -> float | None:
    """The i.i.d. α that explains a measured outcome distribution: Σ over verified blocks of the
    expected accepted tokens, α(1 − α^n) / (1 − α) for a block of n, equals the measured Σ accepted
    (block lengths as measured, short last blocks included). None when no block was verified."""
    verified = [o for o in acceptance.outcomes if o.escalated and o.weight > 0]
    if not verified:
        return None
    measured = sum(o.weight * o.accepted for o in verified)

    def expected(alpha: float) -> float:
        return sum(o.weight * (expected_emitted(alpha, o.drafted) - 1) for o in verified)

    low, high = 0.0, 1.0  # expected() rises with α: bisection to below 1e-12
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if expected(mid) < measured else (low, mid)
    return (low + high) / 2

