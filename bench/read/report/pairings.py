"""The runtime pairings against plain decoding: per pairing (edge runtime -> cloud runtime) and prompt
set, every speculative point's speed-up over the fastest plain decoding measured on those prompts
(of the verifier's model, cloud-only in any runtime and dtype: `bench.derive.summary.fastest_plain`) with its 95 %
interval, beside its cloud calls per generated token (pooled, with its interval). One row of two panels
sharing the points per pairing; split, co-located and in-process points carry their own marker, so
co-located speculation stands beside the split point it is the baseline of.

Why the fastest plain decoding of the verifier's model: speculation that beats its own runtime's
cloud-only can still lose to plain decoding in a faster runtime; this figure shows whether any pairing
is worth running at all, and what it costs the cloud per token it delivers. The edge model alone is
drawn as a dotted reference line: a different model writing different text, never the baseline."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; no display

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from bench.core.point import Deployment
from bench.derive.summary import colocated, fastest_edge, fastest_plain, plain_label, runtime_name
from bench.read.report.fonts import subplots
from bench.read.report.pareto import pareto_mask, set_name
from bench.read.report.plots import _interval, _save
from specdec.settings import Mode

MAX_ROWS = 12  # points of one pairing and prompt set drawn whole; past that, its front and its fastest
FASTEST_KEPT = 4  # the fastest points drawn beside the front of a trimmed row
SPEEDUP = "speedup_vs_fastest_plain"
CALLS = "cloud_calls_per_token"
# deployment -> (marker, legend text); records from before the axis read "-", in one process
MARKERS = {Deployment.SPLIT: ("o", "split (edge and server apart)"),
           Deployment.COLOCATED: ("s", "co-located (both on the cloud's cores)"),
           Deployment.INPROC: ("D", "in one process")}
NO_PLAIN = ("no plain decoding of the cloud model (cloud-only) was measured on the spec points' prompts: rerun the sweep "
            "with --mode edge,cloud,spec")
NO_SPEC = "no speculative point was measured: rerun the sweep with --mode edge,cloud,spec"

READ = (
    "One row per runtime pairing (edge runtime → cloud runtime) and prompt set. Left: each speculative point's tokens/s "
    "over the fastest plain decoding measured on the same prompts, whichever model and runtime that is (named above "
    "each row), with its 95 % interval (paired bootstrap over prompts); right of the dashed line at 1.0× is faster. "
    "Right: the same point's cloud calls per generated token (fewer: less load on the server and the link). Circles "
    "are split points, squares their co-located twins (the same pair on the cloud's cores), diamonds in one process. "
    "A pairing whose every bar stays left of 1.0× is beaten by plain decoding on this machine.")


@dataclass(frozen=True)
class PlainFigure:
    """What `plot_vs_fastest_plain` drew: the file (None when nothing was: `reason` says why) and, per
    prompt set, the plain decoding it compared with (`cloud-only in torch bfloat16, 17.2 tok/s`), and the
    prompt sets left out because no plain decoding was measured on them."""

    path: Path | None
    baselines: dict[str, str] = field(default_factory=dict)
    reason: str = ""
    left_out: tuple[str, ...] = ()
    trimmed: dict[str, tuple[int, int]] = field(default_factory=dict)  # "pairing · set" -> (points drawn, measured)

    @property
    def caption(self) -> str:
        against = "; ".join(f"{name}: vs {text}" if len(self.baselines) > 1 else f"vs {text}"
                            for name, text in self.baselines.items())
        missing = f"; left out, with no plain decoding measured: {', '.join(self.left_out)}" if self.left_out else ""
        trimmed = "" if not self.trimmed else "; " + "; ".join(
            f"{row}: {drawn} of {total} points drawn (the front of speed-up and calls per token, the "
            f"{FASTEST_KEPT} fastest, and the co-located twin of each split one)" for row, (drawn, total) in self.trimmed.items())
        return (f"Speed-up over the fastest plain decoding ({against}{missing}) and cloud calls per token, "
                f"per runtime pairing{trimmed}")


def _baseline_text(point: pd.Series) -> str:
    return f"{plain_label(point)}, {point['tokens_per_s']:.1f} tok/s"


def drawn_points(points: pd.DataFrame) -> pd.DataFrame:
    """The points of one pairing and prompt set the figure draws: all of them up to MAX_ROWS; past that (a
    big sweep's row would be taller than a screen), those no other point beats on both speed-up and cloud
    calls per token, and the FASTEST_KEPT fastest (whatever their calls), each split one with its co-located twin."""
    if len(points) <= MAX_ROWS:
        return points
    front = pareto_mask(points[CALLS], points[SPEEDUP]) if CALLS in points else np.zeros(len(points), dtype=bool)
    fastest = points.index.isin(points[SPEEDUP].nlargest(FASTEST_KEPT).index)
    drawn = points[front | fastest]
    twins = [i for _, point in drawn.iterrows() for i in colocated(points, point).index]  # a split point's baseline
    return points[points.index.isin([*drawn.index, *twins])]


def plot_vs_fastest_plain(summary: pd.DataFrame, labels: pd.Series, path: Path) -> PlainFigure:
    """Draw the figure (see the module docstring) into `path`; a folder without spec points, or without a
    plain decoding on their prompts, gets no file and a one-line reason."""
    spec = summary[summary["mode"] == Mode.SPEC]
    if spec.empty:
        return PlainFigure(None, reason=NO_SPEC)
    baselines = {}
    for prompts in dict.fromkeys(spec["prompts"]):
        fastest = fastest_plain(summary, prompts)
        if fastest is not None:
            baselines[prompts] = fastest
    spec = spec[spec["prompts"].isin(list(baselines)) & spec[SPEEDUP].notna()] if SPEEDUP in spec else spec.iloc[0:0]
    if spec.empty:
        return PlainFigure(None, reason=NO_PLAIN)
    pairing = spec["edge_runtime"].map(runtime_name) + " → " + spec["cloud_runtime"].map(runtime_name)
    measured = list(spec.assign(pairing=pairing).groupby(["prompts", "pairing"], sort=False))
    rows = [(key, drawn_points(points)) for key, points in measured]
    trimmed = {f"{name} · {set_name(prompts)}": (len(drawn), len(points))
               for ((prompts, name), points), (_, drawn) in zip(measured, rows) if len(drawn) < len(points)}
    heights = [0.9 + 0.3 * len(points) for _, points in rows]
    fig, axes = subplots(len(rows), 2, figsize=(12, sum(heights) + 0.6), squeeze=False,
                             gridspec_kw={"height_ratios": heights, "width_ratios": [3, 2]})
    high = spec.get(f"{SPEEDUP}_ci_high", spec[SPEEDUP]).fillna(spec[SPEEDUP])
    edges = {p: fastest_edge(summary, p) for p in baselines}  # the small model alone, per prompt set: a reference
    references = {p: float(e["tokens_per_s"]) / float(baselines[p]["tokens_per_s"]) for p, e in edges.items()
                  if e is not None and float(baselines[p]["tokens_per_s"]) > 0}
    speed_top = max(float(high.max()), float(spec[SPEEDUP].max()), *references.values(), 1.0) * 1.1  # one scale
    calls_top = max(float(spec[CALLS].max()) if CALLS in spec and spec[CALLS].notna().any() else 0.0, 0.05) * 1.15
    shown = set()
    for (speed_ax, calls_ax), ((prompts, name), points) in zip(axes, rows):
        points = points.sort_values(SPEEDUP)
        y = np.arange(len(points))  # [n]: one row per point, shared by both panels
        speed_ax.errorbar(points[SPEEDUP], y, xerr=_interval(points, SPEEDUP), fmt="none", ecolor="#868e96",
                          elinewidth=1.2, capsize=3, zorder=1)
        if CALLS in points:
            calls_ax.errorbar(points[CALLS], y, xerr=_interval(points, CALLS), fmt="none", ecolor="#868e96",
                              elinewidth=1.2, capsize=3, zorder=1)
        placed = points["deployment"].astype(str) if "deployment" in points else pd.Series(Deployment.INPROC, index=points.index)
        for deployment, (marker, _legend) in MARKERS.items():
            at = (placed == deployment) | ((deployment == Deployment.INPROC) & ~placed.isin(list(MARKERS)))
            if not at.any():
                continue
            shown.add(deployment)
            colors = ["#2b8a3e" if v > 1 else "#d9480f" for v in points.loc[at, SPEEDUP]]
            speed_ax.scatter(points.loc[at, SPEEDUP], y[at.to_numpy()], marker=marker, c=colors, s=36, zorder=3)
            if CALLS in points:
                calls_ax.scatter(points.loc[at, CALLS], y[at.to_numpy()], marker=marker, color="#1c7ed6", s=36, zorder=3)
        speed_ax.axvline(1.0, color="black", linestyle="--", linewidth=1)
        if (ratio := references.get(prompts)) is not None:
            speed_ax.axvline(ratio, color="#adb5bd", linestyle=":", linewidth=1.2)
            speed_ax.annotate("edge model alone (reference)", (ratio, len(points) - 0.5), fontsize=6,
                              color="#868e96", rotation=90, ha="right", va="top")
        speed_ax.set_xlim(0, speed_top)
        speed_ax.set_yticks(y, [labels[i] for i in points.index], fontsize=7)
        speed_ax.set_ylim(-0.6, len(points) - 0.4)
        speed_ax.set_title(f"{name} · prompt set {set_name(prompts)} · vs {_baseline_text(baselines[prompts])}",
                           fontsize=9, loc="left")
        speed_ax.set_xlabel(f"speed-up vs {plain_label(baselines[prompts])} (×), 95 % interval", fontsize=8)
        speed_ax.grid(alpha=0.3, axis="x")
        calls_ax.set_yticks(y, [""] * len(y))
        calls_ax.set_ylim(-0.6, len(points) - 0.4)
        calls_ax.set_xlim(0, calls_top)
        calls_ax.set_xlabel("cloud calls per generated token, 95 % interval", fontsize=8)
        calls_ax.grid(alpha=0.3, axis="x")
    handles = [plt.Line2D([], [], marker=MARKERS[d][0], linestyle="", color="#495057", label=MARKERS[d][1])
               for d in MARKERS if d in shown]
    fig.legend(handles=handles, loc="upper center", ncol=len(handles), fontsize=8, frameon=False,
               bbox_to_anchor=(0.5, 1.0))
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.4 / (sum(heights) + 0.6)))
    left_out = tuple(set_name(p) for p in dict.fromkeys(summary.loc[summary["mode"] == Mode.SPEC, "prompts"])
                     if p not in baselines)
    return PlainFigure(_save(fig, path), {set_name(p): _baseline_text(b) for p, b in baselines.items()}, "", left_out,
                       trimmed)
