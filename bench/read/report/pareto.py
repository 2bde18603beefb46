"""Pareto fronts over the per-point summary (`bench.derive.summary.summarize`): which settings no other
setting beats on both axes at once. Pure functions on DataFrames; drawing lives in `plots.py`.

A point dominates another when it is at least as good on both axes and strictly better on one
(the usual definition, e.g. Deb 2001, "Multi-Objective Optimization using Evolutionary
Algorithms", §2.4). Equal points do not dominate each other: ties are all on the front.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from bench.core.metric_registry import lower_is_better
from bench.core.point import Point
from bench.core.prompts import prompt_set_name
from specdec.settings import Mode

SPEC_AXES = ("entropy_threshold", "k", "policy")  # the "(thr, k, policy)" of a label
EXTRA_AXES = ("dtype", "accept_threshold", "verifier", "drafter_options")  # named in a label only when they vary
# where a spec point ran, named (as `split`, `colocated`, `link 4g`, `overlap auto`) when it varies, so a split
# point and its co-located baseline, or the overlap settings of one split point, are told apart
PLACED_AXES = ("deployment", "link", "overlap")
RUNTIME_AXES = ("edge_runtime", "cloud_runtime")  # named, where the role runs, when they vary


@dataclass(frozen=True)
class Front:
    """One trade-off: `x` and `y` are summary columns; which way is good is bench/core/metric_registry.py's."""

    name: str  # file-safe id
    short: str  # how a table names it: "latency / chrF"
    x: str
    y: str
    x_label: str
    y_label: str
    title: str
    how_to_read: str
    spec_only: bool = False  # the baselines' value on an axis means nothing here (no blocks: 0 cloud calls)

    def points(self, summary: pd.DataFrame) -> pd.DataFrame:
        """The points this front is drawn and judged over: those with both values (spec only, where said)."""
        keep = summary[self.x].notna() & summary[self.y].notna()
        return summary[keep & (summary["mode"] == Mode.SPEC)] if self.spec_only else summary[keep]

    def __post_init__(self) -> None:
        if not self.name.replace("_", "").isalnum():
            raise ValueError(f"front name must be letters, digits and _, got {self.name!r}")

    @property
    def x_lower_is_better(self) -> bool:
        return lower_is_better(self.x)

    @property
    def y_lower_is_better(self) -> bool:
        return lower_is_better(self.y)


_LATENCY_READ = ("Each dot is one setting; further left is faster (median seconds per prompt). "
                 "Highlighted, labelled dots are Pareto-optimal: no other setting is both faster and better on "
                 "the vertical axis. Pick among them; every grey dot is beaten by a highlighted one. Grey bars: "
                 "95 % intervals over prompts, where the metric has one (chrF).")
FRONTS = (
    Front("latency_chrf", "latency / chrF", "latency_p50_s", "chrf_vs_cloud",
          "median latency per prompt (s, compute only)", "chrF vs cloud-only output (0–100)",
          "Latency vs agreement with the cloud",
          _LATENCY_READ + " Up is closer to what the cloud model alone writes (100 = identical text)."),
    Front("network_chrf", "latency+network / chrF", "latency_with_network_p50_s", "chrf_vs_cloud",
          "median latency per prompt incl. network (s)", "chrF vs cloud-only output (0–100)",
          "Latency with the network vs agreement with the cloud",
          _LATENCY_READ + " Latency here adds the modelled network cost of every cloud call (round trip + "
          "transfer), so settings that call the cloud often move right."),
    Front("latency_punct", "latency / punctuation", "latency_p50_s", "punct_band_distance",
          "median latency per prompt (s, compute only)", "distance of punctuation density from 10–25 %",
          "Latency vs punctuation health",
          _LATENCY_READ + " Down is healthier: 0 means the outputs' punctuation density is inside the 10–25 % "
          "band of characters; 0.15 means e.g. 40 % (\"a comma after every character or two\")."),
    Front("latency_repeat", "latency / repeats", "latency_p50_s", "repeat_3gram",
          "median latency per prompt (s, compute only)", "repeated content 3-grams (fraction)",
          "Latency vs repetition",
          _LATENCY_READ + " Down is better: the fraction of content 3-grams that repeat an earlier one "
          "(loops like 音色中，音色中 push it up)."),
    Front("latency_calls", "latency / cloud calls", "latency_p50_s", "cloud_call_rate",
          "median latency per prompt (s, compute only)", "cloud calls per draft block",
          "Latency vs cloud traffic",
          "Spec points only (the baselines make no cloud calls per block: edge-only is another model, cloud-only "
          "is the cloud). Left is faster, down asks the cloud less often (the entropy gate keeps confident blocks "
          "on the edge). Highlighted, labelled dots are Pareto-optimal: the settings that trade one for the "
          "other. Grey bars: 95 % intervals over prompts.", spec_only=True),
    Front("calls_acceptance", "calls / acceptance", "cloud_call_rate", "acceptance_rate",
          "cloud calls per draft block", "acceptance rate (accepted / verified draft tokens)",
          "Cloud calls vs acceptance",
          "Spec points only (edge-only and cloud-only have no drafts to accept). Left: the edge asks the cloud "
          "less often; up: when it asks, more of its draft is kept (above 0.6 counts as good). "
          "Highlighted, labelled dots are Pareto-optimal. Grey bars: 95 % intervals over prompts."),
    Front("memory_speed", "memory / speed", "peak_rss_bytes", "tokens_per_s",
          "peak RSS of the process (GiB)", "tokens per second",
          "Memory vs speed",
          "Left uses less memory (the process's peak resident set: in a sweep worker that can include a "
          "cloud model sharing the process); up generates faster. Highlighted, labelled dots are Pareto-optimal."),
)


def pareto_mask(x: pd.Series | np.ndarray, y: pd.Series | np.ndarray,
                x_lower_is_better: bool = True, y_lower_is_better: bool = False) -> np.ndarray:
    """True where a point is on the Pareto front. Points with a NaN on either axis are never on it
    and never dominate another."""
    xs = np.asarray(x, dtype=float) * (1 if x_lower_is_better else -1)  # now lower is better on both
    ys = np.asarray(y, dtype=float) * (1 if y_lower_is_better else -1)
    valid = ~(np.isnan(xs) | np.isnan(ys))
    # dominated[i] iff some valid j has xs[j] <= xs[i], ys[j] <= ys[i], one of them strictly: [n, n]
    no_worse = (xs[None, :] <= xs[:, None]) & (ys[None, :] <= ys[:, None])
    better = (xs[None, :] < xs[:, None]) | (ys[None, :] < ys[:, None])
    dominated = (no_worse & better & valid[None, :]).any(axis=1)
    return valid & ~dominated


def front_members(summary: pd.DataFrame, front: Front) -> pd.Series:
    """Boolean Series over `summary`: on `front` within its own prompt set (sets differ in
    prompts, so their latencies are not comparable)."""
    member = pd.Series(False, index=summary.index)
    if front.x not in summary or front.y not in summary:
        return member
    for _, group in front.points(summary).groupby("prompts", sort=False):
        mask = pareto_mask(group[front.x], group[front.y], front.x_lower_is_better, front.y_lower_is_better)
        member.loc[group.index] = mask
    return member


def fronts_of(summary: pd.DataFrame, fronts: tuple[Front, ...] = FRONTS) -> pd.DataFrame:
    """One boolean column per front (named by its `short` name), indexed like `summary`."""
    return pd.DataFrame({front.short: front_members(summary, front) for front in fronts}, index=summary.index)


def _number(value) -> str:
    if isinstance(value, float) and math.isinf(value):
        return "inf"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return f"{value:g}" if isinstance(value, float) else str(value)


def point_labels(summary: pd.DataFrame) -> pd.Series:
    """A short name per point: "cloud-only", "edge-only", or "(thr, k, policy)" for spec, with the drafter
    first and dtype / accept threshold / verifier / runtimes / KV cache appended only when they vary within the
    summary (the KV cache only where it changes what the point runs, `Point.caches_here`)."""
    spec = summary[summary["mode"] == Mode.SPEC]
    cached = pd.Series([Point.from_row(row).caches_here() for row in summary.to_dict("records")], index=summary.index,
                       dtype=bool)
    named_cache = "kv_cache" in summary and summary.loc[cached, "kv_cache"].astype(str).nunique() > 1
    varying = [a for a in EXTRA_AXES if a in summary and (spec if a != "dtype" else summary)[a].nunique() > 1]
    runtimes = [a for a in RUNTIME_AXES if a in summary and summary[a][summary[a] != "-"].nunique() > 1]
    placed = [a for a in PLACED_AXES if a in summary and spec[a][spec[a].astype(str) != "-"].astype(str).nunique() > 1]
    named_drafter = "drafter" in summary and spec["drafter"].astype(str).nunique() > 1
    # a spec label names a runtime where the spec points differ in it (a sweep's extra plain runtimes vary
    # among the baselines only, and would lengthen every spec label for nothing)
    spec_runtimes = [a for a in RUNTIME_AXES if a in spec and spec[a][spec[a] != "-"].nunique() > 1]
    labels = []
    for index, row in summary.iterrows():
        named = spec_runtimes if row["mode"] == Mode.SPEC else runtimes
        extra = [f"{axis.split('_')[0]} {row[axis]}" for axis in named if row[axis] != "-"]  # "edge <runtime>"
        if named_cache and cached[index]:
            extra.append(f"kv {row['kv_cache']}")  # "kv static"
        for axis in varying:
            if axis == "dtype":
                extra.append(str(row["dtype"]))
            elif row["mode"] == Mode.SPEC:
                extra.append(f"a={_number(row[axis])}" if axis == "accept_threshold"
                             else (str(row[axis]).strip("-") or "default options") if axis == "drafter_options"
                             else str(row[axis]))
        for axis in placed:
            if row["mode"] == Mode.SPEC and str(row[axis]) != "-":
                extra.append(str(row[axis]) if axis == "deployment" else f"{axis} {str(row[axis]).lower()}")
        if row["mode"] == Mode.SPEC:
            # where drafters vary, the drafter first: a draft-free point and a model point at one setting differ there
            drafter = [str(row["drafter"])] if named_drafter else []
            label = "(" + ", ".join(drafter + [_number(row["entropy_threshold"]), _number(row["k"]), str(row["policy"])]
                                    + extra) + ")"
        else:
            label = f"{row['mode']}-only" + (f" ({', '.join(extra)})" if extra else "")
        labels.append(label)
    return pd.Series(labels, index=summary.index, dtype=object)


def set_name(prompts: str) -> str:
    """A prompt set as readers know it: shipped names stay, a file path shows its stem, a Spec-Bench
    set its category."""
    return prompt_set_name(prompts)
