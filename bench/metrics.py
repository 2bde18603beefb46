"""Every derived speed and acceptance number, from raw counts, in one place (Spec-Bench's rule:
runs write raw records; statistics are computed afterwards, once). `run`, `sweep` (via the
summary), `gate`, `profile`, `compare` and the report all call these.

A caller sums its records' raw fields (`COUNTS`) however it holds them, a list of dicts
(`totals`) or a pandas group (`group[list(COUNTS)].sum()`), and passes the totals here. Rates
pool over prompts: total accepted / total drafted, never the mean of per-prompt rates, which
would weigh a 3-token output like a 300-token one. Counters follow vLLM's spec-decode metrics
(specdec/trace.py).
"""
from __future__ import annotations

import math
from typing import Iterable, Mapping, Sequence

# Raw per-generation fields that are pooled (summed) over a point's or a pass's records.
COUNTS = ("new_tokens", "latency_s", "cycles", "cloud_calls", "num_draft_tokens", "num_accepted_tokens",
          "edge_s", "cloud_s", "overhead_s")


def ratio(numerator, denominator) -> float:
    """numerator / denominator; NaN when there is nothing to divide by."""
    return numerator / denominator if denominator else math.nan


def totals(records: Iterable[Mapping], keys: Sequence[str] = COUNTS) -> dict:
    """Each raw count summed over `records` (a missing or None field counts 0)."""
    records = list(records)
    return {key: sum(r.get(key) or 0 for r in records) for key in keys}


def tokens_per_s(t: Mapping) -> float:
    """New tokens per second of wall time, pooled."""
    return ratio(t["new_tokens"], t["latency_s"])


def acceptance_rate(t: Mapping) -> float:
    """Accepted / verified draft tokens (unverified blocks are not in it); NaN when none was verified."""
    return ratio(t["num_accepted_tokens"], t["num_draft_tokens"])


def cloud_call_rate(t: Mapping) -> float:
    """Cloud calls per drafted block (cycle)."""
    return ratio(t["cloud_calls"], t["cycles"])


def cloud_calls_per_token(t: Mapping) -> float:
    return ratio(t["cloud_calls"], t["new_tokens"])


def overhead_fraction(t: Mapping) -> float:
    """Share of the wall time spent outside model forwards (sampling, gate, policy, bookkeeping)."""
    return ratio(t["overhead_s"], t["latency_s"])


def speedup(tokens_per_s_: float, baseline_tokens_per_s: float) -> float:
    """How many times faster than the baseline, on the same prompts."""
    return ratio(tokens_per_s_, baseline_tokens_per_s)


def cost_ratio(cloud_tokens_per_s: float, edge_tokens_per_s: float) -> float:
    """c = edge step time / cloud step time, from the edge-only and cloud-only baselines."""
    return ratio(cloud_tokens_per_s, edge_tokens_per_s)


def expected_speedup(alpha: float, k: int, c: float) -> float:
    """Leviathan et al. 2023, eq. (1) / Thm 3.8: expected walltime improvement of speculative
    decoding, (1 - a^(k+1)) / ((1 - a)(k c + 1)), a = acceptance rate, c = cost ratio."""
    if alpha >= 1.0:
        return (k + 1) / (k * c + 1)
    return (1 - alpha ** (k + 1)) / ((1 - alpha) * (k * c + 1))


def position_acceptance(accepted_per_position: Iterable[Sequence[int]], num_drafts: int) -> list[float]:
    """vLLM's per-position acceptance: P(position i of a verified block accepted) =
    sum over prompts of accepted_per_position[i] / verified blocks."""
    summed = [sum(column) for column in zip(*accepted_per_position)]
    return [count / num_drafts for count in summed]


def time_split(t: Mapping, prompts: int) -> dict:
    """Where the decode time went (totals in seconds), and per unit: cloud seconds per cloud call
    (its prefill included), edge seconds per cycle."""
    split = {**t, "prompts": prompts}
    if t["latency_s"]:
        for key in ("edge_s", "cloud_s", "overhead_s"):
            split[key.replace("_s", "_fraction")] = t[key] / t["latency_s"]
    if t["cloud_calls"]:
        split["cloud_s_per_call"] = t["cloud_s"] / t["cloud_calls"]
    if t["cycles"] and t["edge_s"]:
        split["edge_s_per_cycle"] = t["edge_s"] / t["cycles"]
    return split
