"""Every metric a reader judges, once: its name (a summary column, or the last part of a gate
metric such as `spec.acceptance_rate`), unit, which way is better, and how it is derived (the
formulas are bench/derive/metrics.py's). compare and the gate's checks take their directions from here, the
report's Pareto fronts and recommendations their "lower is better", and compare its list of
result metrics and how each is judged.

A new metric is one `Metric` line here (and its formula in bench/derive/metrics.py or bench/derive/health.py).
"""
from __future__ import annotations

from dataclasses import dataclass

DIRECTIONS = ("higher", "lower")
JUDGED = ("deterministic", "timing", "shown")


@dataclass(frozen=True)
class Metric:
    name: str
    unit: str
    direction: str | None  # "higher" | "lower" is better; None: neither (a count, a density, a hash)
    derived: str  # how, in words
    compared: str | None = None  # how `compare` judges it between two results folders (JUDGED), None: not listed

    def __post_init__(self) -> None:
        if self.direction not in (*DIRECTIONS, None):
            raise ValueError(f"{self.name}: direction must be one of {DIRECTIONS} or None, got {self.direction!r}")
        if self.compared not in (*JUDGED, None):
            raise ValueError(f"{self.name}: compared must be one of {JUDGED} or None, got {self.compared!r}")

    @property
    def lower_is_better(self) -> bool:
        if self.direction is None:
            raise ValueError(f"metric {self.name!r} has no better direction")
        return self.direction == "lower"


# In the order `compare` lists them.
METRICS = {m.name: m for m in (
    Metric("tokens_per_s", "tokens/s", "higher", "pooled new tokens / pooled latency (metrics.tokens_per_s)", "shown"),
    Metric("latency_p50_s", "s", "lower", "median latency per prompt, compute only", "shown"),
    Metric("ttft_p50_s", "s", "lower", "median time to the first token", "shown"),
    Metric("speedup_vs_cloud", "x", "higher", "tokens/s over the cloud-only point's on the same prompts, dtype and "
           "cloud runtime (metrics.speedup; interval: paired bootstrap)", "timing"),
    Metric("speedup_vs_edge", "x", "higher", "tokens/s over the edge-only point's on the same prompts, dtype and "
           "edge runtime", "timing"),
    Metric("speedup_vs_fastest_cloud", "x", "higher", "tokens/s over the fastest cloud-only point measured on the same "
           "prompts, any runtime and dtype (`fastest_cloud` names it; metrics.speedup; interval: paired bootstrap)",
           "timing"),
    Metric("speedup_vs_fastest_plain", "x", "higher", "tokens/s over the fastest plain decoding measured on the same "
           "prompts of the verifier's model (cloud-only), any runtime and dtype (`fastest_plain` names it; interval: paired "
           "bootstrap); shown in the report's per-pairing figure, not judged by compare"),
    Metric("speedup_vs_colocated", "x", "higher", "a split point's tokens/s over its co-located point's (the same pair "
           "and settings in one process on the cloud's cores; metrics.speedup; interval: paired bootstrap)", "timing"),
    Metric("acceptance_rate", "fraction", "higher", "pooled accepted / drafted tokens (metrics.acceptance_rate)",
           "deterministic"),
    Metric("cloud_call_rate", "calls per cycle", "lower", "pooled cloud calls / cycles (metrics.cloud_call_rate)",
           "deterministic"),
    Metric("token_match_vs_cloud", "fraction", "higher", "tokens equal to the cloud-only output's, position by "
           "position (health.token_match_rate)", "deterministic"),
    Metric("chrf_vs_cloud", "chrF (0-100)", "higher", "chrF of the output against the cloud-only output (health.chrf)",
           "deterministic"),
    Metric("repeat_3gram", "fraction", "lower", "content 3-grams repeating an earlier one (health.text_health)",
           "deterministic"),
    Metric("punct_band_distance", "fraction", "lower", "distance of punctuation density from the healthy 10-25 % band",
           "deterministic"),
    Metric("peak_rss_bytes", "bytes", "lower", "largest resident set of the point's process", "shown"),
    Metric("latency_with_network_p50_s", "s", "lower", "median latency plus the modelled network time (network.py)"),
    Metric("cloud_calls_per_token", "calls per token", "lower", "pooled cloud calls / new tokens (the gate's workload, "
           "and a summary column with its interval: metrics.cloud_calls_per_token)"),
    Metric("cloud_calls", "calls", "lower", "cloud calls of a pass (the gate's workload)"),
    Metric("immediate_repeats", "count", "lower", "characters repeating the one before (health.text_health)"),
    Metric("punct_density", "fraction", None, "punctuation marks / characters; healthy inside 10-25 %, not monotone"),
    Metric("new_tokens", "tokens", None, "tokens generated"),
)}
# A gate's timing metric (`spec_vs_cloud`, ...) is a ratio of two modes' median speeds (bench/measure/gate.py).
TIMING_RATIO = Metric("timing ratio", "x", "higher", "median tokens/s of one mode over another's, per repeat")


def metric(name: str) -> Metric | None:
    """The metric of a summary column or a gate metric (`mode.name`); None for one that is not judged."""
    return METRICS.get(name.rsplit(".", 1)[-1])


def direction(name: str) -> str | None:
    found = metric(name)
    return found.direction if found else None


def lower_is_better(name: str) -> bool:
    found = metric(name)
    if found is None:
        raise ValueError(f"metric {name!r} is not in bench/core/metric_registry.py: add it there")
    return found.lower_is_better


def compared() -> list[Metric]:
    """The summary metrics `compare` lists between two results folders, in order."""
    return [m for m in METRICS.values() if m.compared]
