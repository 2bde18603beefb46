"""Every derived speed and acceptance number, from raw counts, in one place (Spec-Bench's rule:
runs write raw records; statistics are computed afterwards, once). `run`, `sweep` (via the
summary), `gate`, `profile`, `compare` and the report all call these.

A caller sums its records' raw fields (`COUNTS`) however it holds them, a list of dicts
(`totals`) or a pandas group (`group[list(COUNTS)].sum()`), and passes the totals here. Rates
pool over prompts: total accepted / total drafted, never the mean of per-prompt rates, which
would weigh a 3-token output like a 300-token one. Counters follow vLLM's spec-decode metrics
(specdec/core/trace.py).

How sure a number is: `*_ci` give bootstrap intervals over prompts (the unit a user's workload
samples), recomputing the same pooled statistic on each resample; a speed-up resamples prompts
paired, each prompt carrying both of its runs, so prompt difficulty cancels.
"""
from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence

import numpy as np
from scipy import stats

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


# --- uncertainty ------------------------------------------------------------------------------
CONFIDENCE = 0.95  # two-sided level of every interval a summary or report shows
BOOTSTRAP_SEED = 0  # fixed: the same records always give the same interval
RESAMPLES = 9999


def bootstrap_ci(columns: Sequence[Sequence[float]], statistic: Callable, confidence: float = CONFIDENCE,
                 paired: bool = True) -> tuple[float, float]:
    """Percentile bootstrap interval (Efron & Tibshirani 1993, ch. 13) of `statistic(*columns, axis=-1)`.
    paired: the columns are per-prompt values of one set of prompts, resampled together (rows with a
    non-finite value are dropped first); otherwise each column is its own sample, resampled alone.
    Percentile, not BCa: with the 3-10 prompts a sweep has per point, BCa's jackknife acceleration is
    itself noise and it returns NaN (with a warning) when the resampled statistic takes few values.
    (NaN, NaN) when a sample has fewer than 2 values: no spread can be estimated from one."""
    arrays = [np.asarray(column, dtype=float) for column in columns]
    if paired:
        keep = np.logical_and.reduce([np.isfinite(a) for a in arrays])
        arrays = [a[keep] for a in arrays]
    else:
        arrays = [a[np.isfinite(a)] for a in arrays]
    if min(len(a) for a in arrays) < 2:
        return math.nan, math.nan
    with warnings.catch_warnings(), np.errstate(divide="ignore", invalid="ignore"):
        warnings.simplefilter("ignore")  # a resample whose statistic is undefined is NaN, not an error
        result = stats.bootstrap(tuple(arrays), statistic, vectorized=True, paired=paired, axis=-1,
                                 confidence_level=confidence, n_resamples=RESAMPLES, method="percentile",
                                 rng=np.random.default_rng(BOOTSTRAP_SEED))
    low, high = result.confidence_interval
    return float(low), float(high)


def _pooled_ratio(numerators, denominators, axis=-1):
    return np.sum(numerators, axis=axis) / np.sum(denominators, axis=axis)


def _paired_speedup(tokens, latency_s, base_tokens, base_latency_s, axis=-1):
    return _pooled_ratio(tokens, latency_s, axis) / _pooled_ratio(base_tokens, base_latency_s, axis)


def _ratio_of_medians(current, baseline, axis=-1):
    return np.median(current, axis=axis) / np.median(baseline, axis=axis)


def pooled_ratio_ci(numerators: Sequence[float], denominators: Sequence[float],
                    confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Interval of sum(numerators) / sum(denominators) over prompts: acceptance (accepted / drafted),
    cloud-call rate (calls / cycles), tokens/s (tokens / seconds)."""
    return bootstrap_ci((numerators, denominators), _pooled_ratio, confidence)


def speedup_ci(tokens: Sequence[float], latency_s: Sequence[float], base_tokens: Sequence[float],
               base_latency_s: Sequence[float], confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Interval of `speedup` (pooled tokens/s over pooled baseline tokens/s), the four columns aligned
    by prompt: resampling a prompt takes both of its runs (a paired bootstrap)."""
    return bootstrap_ci((tokens, latency_s, base_tokens, base_latency_s), _paired_speedup, confidence)


def mean_ci(values: Sequence[float], confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Interval of the mean over prompts (chrF, token match)."""
    return bootstrap_ci((values,), np.mean, confidence)


def median_ci(values: Sequence[float], confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Interval of the median over prompts (time to the first token)."""
    return bootstrap_ci((values,), np.median, confidence)


def ratio_of_medians_ci(current: Sequence[float], baseline: Sequence[float],
                        one_sided: float = CONFIDENCE) -> tuple[float, float]:
    """(lower, upper) bounds of median(current) / median(baseline), two independent samples (a gate's
    per-repeat ratios), each bound one-sided at `one_sided` (together a 2 * one_sided - 1 interval).
    With a single value on a side there is no spread: both bounds are the point estimate."""
    if min(len(current), len(baseline)) < 2:
        estimate = ratio(float(np.median(current)), float(np.median(baseline)))
        return estimate, estimate
    return bootstrap_ci((current, baseline), _ratio_of_medians, 2 * one_sided - 1, paired=False)
