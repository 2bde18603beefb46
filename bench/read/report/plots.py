"""Drawing only: every figure of the report from the summary and what `pareto` / `views`
computed. Each function writes one PNG and returns its path, or None when there is nothing to draw."""
from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; no display

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.colors import Normalize, TwoSlopeNorm

from bench.core.point import AXES
from bench.derive.summary import fastest_cloud, plain_name
from bench.read.report.fonts import subplots
from bench.read.report.pareto import Front, front_members, set_name
from specdec.settings import Mode

GIB = 1 << 30
DPI = 110
MARKERS = {"cloud": "s", "edge": "^", "spec": "o"}
HEAT_METRICS = (  # (column, title, colormap, value range or None for "centred on 1")
    ("speedup_vs_fastest_cloud", "speed-up vs the fastest cloud-only (×)", "RdBu", None),  # named in the title
    ("acceptance_rate", "acceptance rate", "viridis", (0.0, 1.0)),
    ("cloud_call_rate", "cloud calls per block", "viridis_r", (0.0, 1.0)),
)
# heat maps: one row per combination of every point axis but the two the grid spans (runtimes and placement too,
# or two runtimes' points would fall into one cell)
FACET_AXES = tuple(a for a in AXES if a not in ("mode", "prompts", "k", "entropy_threshold"))


def _grid(n: int, width: float = 5.2, height: float = 4.2, max_cols: int = 3):
    cols = min(n, max_cols)
    rows = math.ceil(n / cols)
    fig, axes = subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return fig, list(axes.flat[:n])


def _save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    return path


def _interval(points: pd.DataFrame, column: str, scale: float = 1.0):
    """[2, n] distances below and above each value to its 95 % interval (summary's `_ci_low` /
    `_ci_high`), for errorbar; None when the summary has no interval for `column`."""
    low, high = f"{column}_ci_low", f"{column}_ci_high"
    if low not in points or not points[low].notna().any():
        return None
    value = points[column].to_numpy(float)
    below = (value - points[low].to_numpy(float)).clip(min=0)
    above = (points[high].to_numpy(float) - value).clip(min=0)
    return np.nan_to_num(np.vstack([below, above])) * scale


def _error_bars(ax, points: pd.DataFrame, x: str, y: str, x_scale: float = 1.0) -> None:
    """Grey 95 % interval bars behind the markers, on whichever of x and y has one."""
    xerr, yerr = _interval(points, x, x_scale), _interval(points, y)
    if (xerr is not None or yerr is not None) and len(points):
        ax.errorbar(points[x] * x_scale, points[y], xerr=xerr, yerr=yerr, fmt="none", ecolor="#9a9a9a",
                    elinewidth=0.9, capsize=2, zorder=1)


def _threshold_text(value) -> str:
    value = float(value)
    return "inf" if math.isinf(value) else f"{value:g}"


def plot_front(summary: pd.DataFrame, labels: pd.Series, front: Front, path: Path) -> Path | None:
    """Scatter of every point on (front.x, front.y), one panel per prompt set, the Pareto-optimal
    points highlighted, joined by their staircase and labelled."""
    scale = (1 / GIB) if front.x == "peak_rss_bytes" else 1.0
    data = front.points(summary)
    if data.empty:
        return None
    on_front = front_members(summary, front)
    sets = list(dict.fromkeys(data["prompts"]))
    fig, axes = _grid(len(sets), width=6.4, height=4.8)
    for ax, prompts in zip(axes, sets):
        points = data[data["prompts"] == prompts]
        best = points[on_front[points.index]]
        _error_bars(ax, points, front.x, front.y, scale)
        for mode, marker in MARKERS.items():
            dominated = points[(points["mode"] == mode) & ~on_front[points.index]]
            ax.scatter(dominated[front.x] * scale, dominated[front.y], marker=marker, s=36, color="#b8b8b8",
                       label=f"{mode}, dominated")
            optimal = best[best["mode"] == mode]
            ax.scatter(optimal[front.x] * scale, optimal[front.y], marker=marker, s=70, color="#d9480f",
                       edgecolor="black", linewidth=0.8, zorder=3, label=f"{mode}, Pareto-optimal")
        ordered = best.sort_values(front.x, ascending=front.x_lower_is_better)
        ax.step(ordered[front.x] * scale, ordered[front.y], where="post", color="#d9480f", linewidth=1, alpha=0.6)
        for (x, y), tied in ordered.groupby([front.x, front.y], sort=False):  # equal points: one joined label
            ax.annotate(" = ".join(labels[tied.index]), (x * scale, y), xytext=(5, 4), textcoords="offset points",
                        fontsize=8)
        ax.set_title(f"prompt set: {set_name(prompts)}", fontsize=10)
        ax.set_xlabel(front.x_label + ("  ← better" if front.x_lower_is_better else "  → better"))
        ax.set_ylabel(front.y_label + ("  (lower is better)" if front.y_lower_is_better else "  (higher is better)"))
        ax.grid(alpha=0.3)
    handles, names = axes[0].get_legend_handles_labels()
    shown = {n: h for h, n in zip(handles, names) if n.split(",")[0] in set(data["mode"])}
    fig.suptitle(front.title, fontsize=12)
    fig.tight_layout()
    fig.legend(shown.values(), shown.keys(), loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8, frameon=False)
    return _save(fig, path)


def _facets(spec: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    varying = [a for a in FACET_AXES if a in spec and spec[a].nunique(dropna=False) > 1] or ["policy"]
    facets = []
    for keys, group in spec.groupby(varying, sort=False, dropna=False):  # an in-process point has no link: a row too
        keys = keys if isinstance(keys, tuple) else (keys,)
        facets.append((", ".join(f"{a.replace('_threshold', '')}={k}" for a, k in zip(varying, keys)), group))
    return facets


def plot_heatmaps(summary: pd.DataFrame, prompts: str, path: Path) -> Path | None:
    """Entropy threshold × k grids of speed-up, acceptance and cloud-call rate for one prompt set:
    a row of panels per policy (and per other setting that varies)."""
    spec = summary[(summary["mode"] == Mode.SPEC) & (summary["prompts"] == prompts)]
    if spec.empty:
        return None
    facets = _facets(spec)
    fig, axes = subplots(len(facets), len(HEAT_METRICS), figsize=(4.6 * len(HEAT_METRICS), 3.4 * len(facets)),
                             squeeze=False)
    for row_axes, (facet, group) in zip(axes, facets):
        ks = sorted({int(k) for k in group["k"]})
        thresholds = sorted({float(t) for t in group["entropy_threshold"]})
        for ax, (column, title, cmap, value_range) in zip(row_axes, HEAT_METRICS):
            grid = np.full((len(thresholds), len(ks)), np.nan)  # [threshold, k]
            for _, point in group.iterrows():
                grid[thresholds.index(float(point["entropy_threshold"])), ks.index(int(point["k"]))] = point[column]
            norm: Normalize
            if value_range is None:  # a ratio: 1/r as red as r is blue, white at 1 (no change)
                finite = grid[np.isfinite(grid) & (grid > 0)]
                ratio = max(finite.max(), 1 / finite.min(), 1.1) if finite.size else 2.0
                norm = TwoSlopeNorm(vcenter=1.0, vmin=1 / ratio, vmax=ratio)
            else:
                norm = plt.Normalize(*value_range)
            image = ax.imshow(np.ma.masked_invalid(grid), cmap=cmap, norm=norm, aspect="auto", origin="lower")
            intervals = {}  # (i, j) -> "low–high" where the summary has the metric's 95 % interval
            if f"{column}_ci_low" in group:
                for _, point in group.iterrows():
                    low, high = point[f"{column}_ci_low"], point[f"{column}_ci_high"]
                    if low == low and high == high:
                        cell = (thresholds.index(float(point["entropy_threshold"])), ks.index(int(point["k"])))
                        intervals[cell] = f"\n{low:.2f}–{high:.2f}"
            for (i, j), value in np.ndenumerate(grid):
                text = "—" if np.isnan(value) else f"{value:.2f}{intervals.get((i, j), '')}"
                ax.text(j, i, text, ha="center", va="center", fontsize=8 if (i, j) not in intervals else 7,
                        color="black", bbox=dict(boxstyle="round,pad=0.15", fc="white", ec="none", alpha=0.6))
            ax.set_xticks(range(len(ks)), [str(k) for k in ks])
            ax.set_yticks(range(len(thresholds)), [_threshold_text(t) for t in thresholds])
            ax.set_xlabel("k (draft tokens per block)")
            ax.set_ylabel("entropy threshold (nats)")
            ax.set_title(f"{title}\n{facet}", fontsize=9)
            bar = fig.colorbar(image, ax=ax, shrink=0.85)
            if value_range is None:  # label both halves of the ratio scale: 1/r ... 1 ... r
                ticks = sorted({1 / ratio, 1.0, ratio} | {t for t in (0.5, 2.0) if 1 / ratio < t < ratio})
                bar.set_ticks(ticks, labels=[f"{t:.2g}×" for t in ticks])
    base = fastest_cloud(summary, prompts)
    named = "" if base is None else f" · the fastest cloud-only: {plain_name(base)}, {base['tokens_per_s']:.1f} tok/s"
    fig.suptitle(f"prompt set: {set_name(prompts)}{named}", fontsize=12)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.4 / fig.get_figheight()))  # the suptitle's 0.4 inch kept clear
    return _save(fig, path)


def plot_theory(summary: pd.DataFrame, labels: pd.Series, path: Path) -> Path | None:
    """Measured speed-up vs cloud-only against Leviathan et al.'s expected speed-up, y = x line."""
    data = summary[summary["theoretical_speedup"].notna() & summary["speedup_vs_cloud"].notna()]
    if data.empty:
        return None
    fig, ax = subplots(figsize=(7, 6))
    for prompts, points in data.groupby("prompts", sort=False):
        _error_bars(ax, points, "theoretical_speedup", "speedup_vs_cloud")
        ax.scatter(points["theoretical_speedup"], points["speedup_vs_cloud"], s=40, label=set_name(prompts), zorder=2)
        for index, row in points.iterrows():
            ax.annotate(labels[index], (row["theoretical_speedup"], row["speedup_vs_cloud"]), xytext=(4, 3),
                        textcoords="offset points", fontsize=7)
    top = max(data["theoretical_speedup"].max(), data["speedup_vs_cloud"].max(), 1.0) * 1.1
    ax.plot([0, top], [0, top], color="black", linewidth=1, label="measured = theory")
    ax.axhline(1.0, color="grey", linestyle=":", linewidth=1, label="cloud-only speed")
    ax.set_xlim(0, top)
    ax.set_ylim(0, top)
    ax.set_xlabel("theoretical speed-up (Leviathan et al. 2023, from acceptance, k and c)")
    ax.set_ylabel("measured speed-up vs cloud-only (tokens/s ratio; bars: 95 % interval)")
    ax.set_title("Measured vs theoretical speed-up")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


def plot_per_position(per_position: pd.DataFrame, summary: pd.DataFrame, labels: pd.Series, path: Path) -> Path | None:
    """P(accept draft position i) per spec point, one panel per prompt set."""
    if per_position.empty:
        return None
    sets = list(dict.fromkeys(summary.loc[per_position["point"].unique(), "prompts"]))
    fig, axes = _grid(len(sets), width=6.0, height=4.4, max_cols=2)
    for ax, prompts in zip(axes, sets):
        points = [p for p in per_position["point"].unique() if summary.at[p, "prompts"] == prompts]
        colors = plt.colormaps["tab20"](np.linspace(0, 1, max(len(points), 2)))
        for color, point in zip(colors, points):
            curve = per_position[per_position["point"] == point]
            ax.plot(curve["position"], curve["p_accept"], marker="o", markersize=4, color=color,
                    label=f"{labels[point]}  ({int(curve['num_drafts'].iloc[0])} blocks)")
        ax.set_xlabel("draft position i (1 = first drafted token)")
        ax.set_ylabel("P(position i accepted)")
        ax.set_ylim(-0.02, 1.02)
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.set_title(f"prompt set: {set_name(prompts)}", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.suptitle("Acceptance by draft position (verified blocks only)", fontsize=12)
    fig.tight_layout()
    return _save(fig, path)


def speedup_panels(summary: pd.DataFrame) -> dict[str, tuple[pd.Series, pd.DataFrame]]:
    """Per prompt set with a cloud-only point: (the fastest cloud-only measured, every other point with a
    `speedup_vs_fastest_cloud`, slowest first)."""
    metric = "speedup_vs_fastest_cloud"
    panels: dict[str, tuple[pd.Series, pd.DataFrame]] = {}
    if metric not in summary:
        return panels
    for prompts in dict.fromkeys(summary["prompts"]):
        base = fastest_cloud(summary, prompts)
        points = summary[(summary["prompts"] == prompts) & summary[metric].notna()]
        points = points.drop(index=base.name) if base is not None else points.iloc[0:0]
        if len(points):
            panels[prompts] = (base, points.sort_values(metric))
    return panels


def plot_speedups(summary: pd.DataFrame, labels: pd.Series, path: Path) -> Path | None:
    """Every point's speed-up vs the fastest cloud-only measured on its prompt set (any runtime and
    dtype: `speedup_vs_fastest_cloud`, named under each panel) with its 95 % interval (paired
    bootstrap over prompts), one panel per prompt set, fastest first; the slower cloud-only points are
    drawn too, so a speculative point that only beats a slow runtime's cloud-only shows where it is.
    Two points whose bars overlap are not told apart by this sweep."""
    metric = "speedup_vs_fastest_cloud"
    panels = speedup_panels(summary)
    if not panels:
        return None
    rows = max(len(points) for _, points in panels.values())
    fig, axes = _grid(len(panels), width=6.4, height=1.2 + 0.28 * rows, max_cols=2)
    for ax, (prompts, (base, points)) in zip(axes, panels.items()):
        y = np.arange(len(points))
        xerr = _interval(points, metric)
        colors = ["#d9480f" if mode == Mode.SPEC else "#495057" for mode in points["mode"]]
        ax.errorbar(points[metric], y, xerr=xerr, fmt="none", ecolor="#868e96", elinewidth=1.2, capsize=3)
        ax.scatter(points[metric], y, c=colors, s=30, zorder=3)
        ax.axvline(1.0, color="grey", linestyle=":", linewidth=1)
        ax.set_yticks(y, [labels[i] for i in points.index], fontsize=7)
        n = int(points["n_prompts"].max())
        ax.set_xlabel(f"speed-up vs cloud-only in {plain_name(base)}, {base['tokens_per_s']:.1f} tok/s (×), "
                      f"95 % interval over {n} prompts", fontsize=8)
        ax.set_title(f"prompt set: {set_name(prompts)}", fontsize=10)
        ax.grid(alpha=0.3, axis="x")
    fig.tight_layout()
    return _save(fig, path)
