"""The report's "Where speculation pays" section (computed by bench/derive/regions.py and costfit.py).

The map, one panel per runtime pairing and prompt set: the cost model fitted from the folder's
baselines and other points (costfit.fit_inputs), evaluated over RTT × α (regions.rate_grid), each cell
coloured by the fastest of the ways that emit the cloud's tokens (split, co-located, cloud-only) and
hatched where edge-only is faster still; the closed-form boundaries (regions.*_rtt_bound_s) drawn as
lines; every measured spec point on top at its link's RTT and its measured α (regions.alpha_of),
filled with the colour of the fastest way *measured* among its alternatives, ringed where the model
picks another. The scatter: every spec point's predicted (costfit.predict_point) vs measured tokens/s.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.artist import Artist
from matplotlib.colors import ListedColormap
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter

from bench.core.network import NO_LINK, profile
from bench.core.point import COLUMNS, Deployment
from bench.derive.costfit import acceptance, acceptance_group, columns_key, fit_inputs, predict_from, predict_point, spec_points
from bench.derive.costmodel import CostInputs, cloud_only, colocated
from bench.derive.regions import (
    LOSSLESS,
    ahead_colocated_rtt_bound_s,
    alpha_of,
    fastest,
    rate_grid,
    split_cloud_rtt_bound_s,
    winners,
)
from bench.derive.summary import PLACED, baseline, fastest_cloud, plain_label
from bench.read.report.fonts import subplots
from bench.read.report.inputs import ReportInputs
from bench.read.report.page import image_src
from bench.read.report.pareto import set_name
from specdec.core.drafters import NEEDS_MODEL
from specdec.errors import ConfigError, InputError
from specdec.settings import Mode

COLORS = {"split": "#4C72B0", "co-located": "#55A868", "cloud-only": "#C44E52", "edge-only": "#8172B2"}
RTT_MAX_MS, RTT_CELLS, ALPHA_CELLS = 300.0, 61, 41
MAP_READ = (
    "One panel per runtime pairing (edge → cloud) and prompt set. Across: the round trip to the cloud; up: the "
    "textbook acceptance α per draft position (i.i.d., Leviathan et al.). Each cell is coloured by the deployment the "
    "cost model, fitted from this folder's baselines, finds fastest among those that emit the cloud's tokens: split "
    "(the edge drafts across the link, at the better of sequential and drafting ahead), co-located (both models on "
    "the cloud's cores) and cloud-only; hatched where edge-only (the edge's own, different text) is faster still, "
    "and cross-hatched the other way where the cloud model's plain decoding in another runtime, measured faster than "
    "this pairing's cloud-only and named above the panel, beats every way of the contest. "
    "Speculative deployments are taken at their best measured k. Lines: the closed forms of \"Speculation at a "
    "Distance\" in the model's symbols, at the k named in the panel — solid, split = cloud-only (left of it split "
    "beats cloud-only); dashed, split drafting ahead = co-located (left of it split wins). Dots (split) and squares "
    "(co-located, drawn at RTT 0) are measured points at their link's RTT and measured α, filled with the fastest way "
    "measured among their own alternatives; a thick ring marks a point where the model, fitted for it as `specbench "
    "predict` fits it (its own k and measured outcomes), picks another among those same alternatives. A filled colour "
    "unlike the region around it is a disagreement: the model misses a cost there (see the scatter), the acceptance "
    "is not i.i.d. as the map assumes, or the point sits near a boundary its interval does not clear.")
SCATTER_READ = (
    "Every spec point's tokens/s predicted from the baselines and the other points only (never its own timings; "
    "`specbench predict`) against what it measured, coloured by runtime pairing. On the solid line the model is "
    "exact; the bands are ±5 % and ±15 %. Below the line the model is too pessimistic, above it too optimistic.")


# A missing baseline, inputs the model refuses, or records written before a field the fit reads: the
# section says why and the rest of the report goes on.
UNFITTABLE = (InputError, ConfigError, KeyError)


def _why(error: Exception) -> str:
    if isinstance(error, KeyError):
        return f"the records lack {error.args[0]!r}, which the cost model reads: rerun the sweep with this version"
    return str(error)


@dataclass(frozen=True)
class Placed:
    """A measured spec point on the map."""

    label: str
    k: int
    split: bool
    rtt_s: float
    alpha: float
    measured: dict  # lossless way -> measured tokens/s (the point's own way and its alternatives)
    edge_tokens_per_s: float  # nan when there is no edge-only baseline
    region: str  # the map's colour at (RTT, α)
    model: str  # the model's fastest of `measured`'s ways, on the point's own fitted inputs

    @property
    def winner(self) -> str:
        return max(self.measured, key=lambda way: self.measured[way])


@dataclass(frozen=True)
class Panel:
    pairing: str
    prompts: str
    inputs: CostInputs
    ks: tuple[int, ...]
    line_k: int
    ways: tuple[str, ...]  # the lossless ways in the contest (split only when a split point was measured)
    link_text: str
    placed: tuple[Placed, ...]
    # the fastest cloud-only measured on the prompts when it ran in another runtime than this pairing's cloud and
    # beat that cloud's own: (its name, tok/s); the map cross-hatches where it beats every lossless way
    faster_cloud: tuple[str, float] | None = None


def pairing_of(row) -> str:
    return f"{row.get('edge_runtime') or '-'} → {row.get('cloud_runtime') or '-'}"


def _partners(summary: pd.DataFrame, row: pd.Series) -> pd.DataFrame:
    """A split point's co-located alternatives: the same settings but where it ran (colocated or inproc)."""
    match = (summary["mode"] == Mode.SPEC) & summary["deployment"].isin([Deployment.COLOCATED, Deployment.INPROC])
    for column in COLUMNS:
        if column not in PLACED:
            match &= summary[column] == row[column]
    return summary[match]


def measured_ways(summary: pd.DataFrame, row: pd.Series) -> tuple[dict, float]:
    """(lossless way -> measured tokens/s, edge-only tokens/s) for a spec point's summary row."""
    split = row["deployment"] == Deployment.SPLIT
    found = {"split" if split else "co-located": float(row["tokens_per_s"])}
    if split and len(_partners(summary, row)):
        found["co-located"] = float(_partners(summary, row)["tokens_per_s"].max())
    rates = {mode: baseline(summary, mode, row)["tokens_per_s"] for mode in (Mode.CLOUD, Mode.EDGE)}
    if len(rates[Mode.CLOUD]):
        found["cloud-only"] = float(rates[Mode.CLOUD].iloc[0])
    return found, float(rates[Mode.EDGE].iloc[0]) if len(rates[Mode.EDGE]) else float("nan")


def faster_cloud_elsewhere(summary: pd.DataFrame, row: pd.Series) -> tuple[str, float] | None:
    """The fastest cloud-only measured on `row`'s prompts when it is not the cloud-only of `row`'s own cloud
    runtime and dtype and beats it: (`cloud-only in torch bfloat16`, tok/s), else None. The map's contest holds the
    pairing's own cloud-only; plain decoding in a faster runtime beats every cell its rate tops."""
    quickest, own = fastest_cloud(summary, row["prompts"]), baseline(summary, Mode.CLOUD, row)
    if quickest is None or (len(own) and quickest.name in own.index):
        return None
    if len(own) and float(quickest["tokens_per_s"]) <= float(own["tokens_per_s"].max()):
        return None
    return plain_label(quickest), float(quickest["tokens_per_s"])


def _rows_by_key(summary: pd.DataFrame) -> dict:
    return {columns_key(row[c] for c in COLUMNS): row for _, row in summary.iterrows()}


def _model_way(records: list[dict], point: dict, measured: dict, x: CostInputs, alpha: float, rtt_s: float) -> str:
    """The model's fastest of the ways `measured` has, judged as `predict` judges the point: on its own fitted
    inputs and measured outcome distribution (else the panel's, at α)."""
    try:
        own = fit_inputs(records, point)
    except UNFITTABLE:
        return fastest(x, alpha, (int(point["k"]),), rtt_s, tuple(w for w in LOSSLESS if w in measured))
    model = {"co-located": colocated(own).tokens_per_s, "cloud-only": cloud_only(own).tokens_per_s}
    if point.get("deployment") == Deployment.SPLIT:
        model["split"] = predict_from(own, point)
    return max((w for w in LOSSLESS if w in measured), key=lambda w: model[w])  # model has each way measured has


def build_panels(records: list[dict], summary: pd.DataFrame, labels: pd.Series) -> tuple[list[Panel], list[str]]:
    """The map's panels, and one line per reason a panel could not be fitted (predict's wording). The map
    is a drafting model's (its axes: the acceptance of its drafts, the link's RTT): draft-free drafters'
    points are not placed on it."""
    rows, panels, hints = _rows_by_key(summary), [], []
    points = [p for p in spec_points(records) if str(p.get("drafter") or "model") in NEEDS_MODEL]
    groups: dict[tuple, list[dict]] = {}
    for point in points:
        groups.setdefault((pairing_of(point), point["prompts"]), []).append(point)
    for (pairing, prompts), members in groups.items():
        x, failures = None, []
        for candidate in sorted(members, key=lambda p: p.get("deployment") != Deployment.SPLIT):  # a split point gives the link
            try:
                x, rep = fit_inputs(records, candidate), candidate
                break
            except UNFITTABLE as e:
                failures.append(_why(e))
        if x is None:  # no point of the panel could be fitted: the first reason says what to add
            hints.append(failures[0])
            continue
        if rep.get("deployment") != Deployment.SPLIT:  # the lines' split edge is hypothetical: on a machine of its own
            x = replace(x, cores_shared=False)
        ks = tuple(sorted({int(p["k"]) for p in members}))
        best = max(members, key=lambda p: rows[columns_key(p.get(c) for c in COLUMNS)]["tokens_per_s"])
        ways = LOSSLESS if any(p.get("deployment") == Deployment.SPLIT for p in members) else LOSSLESS[1:]
        placed = []
        for point in members:
            row = rows[columns_key(point.get(c) for c in COLUMNS)]
            try:
                alpha = alpha_of(acceptance(acceptance_group(records, point)))
            except UNFITTABLE:
                alpha = None
            if alpha is None:  # no block verified: nowhere on the acceptance axis
                continue
            rtt_s = profile(str(point.get("link") or NO_LINK)).rtt_s if point.get("deployment") == Deployment.SPLIT else 0.0
            measured, edge = measured_ways(summary, row)
            placed.append(Placed(labels[row.name], int(point["k"]), point.get("deployment") == Deployment.SPLIT, rtt_s, alpha,
                                 measured, edge, fastest(x, alpha, ks, rtt_s, ways),
                                 _model_way(records, point, measured, x, alpha, rtt_s)))
        link_text = str(rep.get("link")) if rep.get("deployment") == Deployment.SPLIT else "none measured"
        panels.append(Panel(pairing, prompts, x, ks, int(best["k"]), ways, link_text, tuple(placed),
                            faster_cloud_elsewhere(summary, rows[columns_key(best.get(c) for c in COLUMNS)])))
    return panels, list(dict.fromkeys(hints))


def _draw_panel(ax, panel: Panel, rtt_max_ms: float) -> None:
    rtts_ms = np.linspace(0.0, rtt_max_ms, RTT_CELLS)
    alphas = np.linspace(0.0, 1.0, ALPHA_CELLS)
    grid = rate_grid(panel.inputs, rtts_ms / 1e3, alphas, panel.ks, (*panel.ways, "edge-only"))
    winner = winners(grid, panel.ways)
    best = np.max(np.stack([grid[w] for w in panel.ways]), axis=0)
    cmap = ListedColormap([COLORS[w] for w in panel.ways])
    ax.pcolormesh(rtts_ms, alphas, winner, cmap=cmap, vmin=-0.5, vmax=len(panel.ways) - 0.5, shading="nearest",
                  alpha=0.45, linewidth=0, rasterized=True)
    edge_faster = (grid["edge-only"] > best).astype(float)
    if edge_faster.any():
        ax.contourf(rtts_ms, alphas, edge_faster, levels=[0.5, 1.5], colors="none", hatches=["///"])
    elsewhere = ""
    if panel.faster_cloud is not None:
        name, rate = panel.faster_cloud
        cloud_faster = (rate > best).astype(float)
        if cloud_faster.any():
            ax.contourf(rtts_ms, alphas, cloud_faster, levels=[0.5, 1.5], colors="none", hatches=["\\\\"])
        elsewhere = f"\n\\\\ where {name}, {rate:.1f} tok/s, is faster"
    fine = np.linspace(0.0, 1.0, 201)
    for bound, style in ((split_cloud_rtt_bound_s, "-"), (ahead_colocated_rtt_bound_s, "--")):
        rtt = np.array([bound(panel.inputs, float(a), panel.line_k) for a in fine]) * 1e3
        ax.plot(np.where((rtt >= 0) & (rtt <= rtt_max_ms), rtt, np.nan), fine, style, color="black", linewidth=1.1)
    for p in panel.placed:
        ax.scatter(p.rtt_s * 1e3, p.alpha, marker="o" if p.split else "s", s=58, color=COLORS[p.winner],
                   edgecolor="black", linewidth=2.6 if p.model != p.winner else 0.8, zorder=4, clip_on=False)
        ax.annotate(f"k{p.k}", (p.rtt_s * 1e3, p.alpha), xytext=(5, 3), textcoords="offset points", fontsize=7)
    ax.set_xlim(0, rtt_max_ms)
    ax.set_ylim(0, 1)
    ax.set_title(f"{panel.pairing} · {set_name(panel.prompts)}\nlines at k={panel.line_k}; link rates: {panel.link_text}"
                 f"{elsewhere}", fontsize=9)
    ax.set_xlabel("round trip (ms)")
    ax.set_ylabel("acceptance α per position")
    if "split" not in panel.ways:
        ax.text(0.5, 0.02, "no split point measured: split is left out and no round trip changes the rest;\n"
                "the lines say what a split edge would need", transform=ax.transAxes, ha="center", va="bottom",
                fontsize=7, bbox={"facecolor": "white", "alpha": 0.8, "linewidth": 0})


def plot_map(panels: list[Panel], path: Path) -> Path | None:
    if not panels:
        return None
    farthest = max((p.rtt_s * 1e3 for panel in panels for p in panel.placed), default=0.0)
    rtt_max_ms = max(RTT_MAX_MS, 1.15 * farthest)
    cols = min(len(panels), 3)
    rows = -(-len(panels) // cols)
    fig, axes = subplots(rows, cols, figsize=(5.0 * cols, 4.3 * rows), squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    for ax, panel in zip(axes.flat, panels):
        _draw_panel(ax, panel, rtt_max_ms)
    handles: list[Artist] = [Patch(color=COLORS[w], alpha=0.6, label=w) for w in LOSSLESS]
    handles += [Patch(facecolor="white", edgecolor="black", hatch="///", label="edge-only faster still"),
                Patch(facecolor="white", edgecolor="black", hatch="\\\\",
                      label="cloud-only in another runtime faster still (named above the panel)"),
                Line2D([], [], color="black", label="split = cloud-only (closed form)"),
                Line2D([], [], color="black", linestyle="--", label="split drafting ahead = co-located (closed form)"),
                Line2D([], [], marker="o", linestyle="", color="grey", markeredgecolor="black", label="split point"),
                Line2D([], [], marker="s", linestyle="", color="grey", markeredgecolor="black", label="co-located point"),
                Line2D([], [], marker="o", linestyle="", color="white", markeredgecolor="black", markeredgewidth=2.6,
                       label="ring: the model picks another")]
    fig.tight_layout()
    fig.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=3, fontsize=8, frameon=False)
    return _save(fig, path)


def scatter_table(records: list[dict], summary: pd.DataFrame, labels: pd.Series) -> tuple[pd.DataFrame, list[str]]:
    """(label, pairing, measured, predicted, error per predictable spec point; why each other one was skipped)."""
    rows, table, skipped = _rows_by_key(summary), [], []
    for point in spec_points(records):
        row = rows[columns_key(point.get(c) for c in COLUMNS)]
        try:
            predicted = predict_point(records, point)
        except UNFITTABLE as e:
            skipped.append(_why(e))
            continue
        measured = float(row["tokens_per_s"])
        table.append({"label": labels[row.name], "pairing": pairing_of(point), "measured": measured,
                      "predicted": predicted, "error": predicted / measured - 1})
    return pd.DataFrame(table, columns=["label", "pairing", "measured", "predicted", "error"]), skipped


def scatter_caption(table: pd.DataFrame, skipped: list[str]) -> str:
    text = ""
    if len(table):
        worst = table.loc[table["error"].abs().idxmax()]
        text = (f"{len(table)} spec points: median |error| {table['error'].abs().median():.1%}, largest "
                f"{abs(worst['error']):.1%} ({worst['pairing']} {worst['label']}: measured {worst['measured']:.3g}, "
                f"predicted {worst['predicted']:.3g} tok/s).")
    if skipped:
        text += f" {len(skipped)} spec point(s) skipped, no prediction possible: {skipped[0]}"
    return text.strip()


def plot_scatter(table: pd.DataFrame, path: Path) -> Path | None:
    if table.empty:
        return None
    fig, ax = subplots(figsize=(6.4, 5.2))
    low = float(min(table["measured"].min(), table["predicted"].min())) / 1.3
    high = float(max(table["measured"].max(), table["predicted"].max())) * 1.3
    line = np.geomspace(low, high, 50)
    for band, shade in ((0.15, 0.12), (0.05, 0.22)):
        ax.fill_between(line, line * (1 - band), line * (1 + band), color="grey", alpha=shade, linewidth=0,
                        label=f"±{band:.0%}")
    ax.plot(line, line, color="black", linewidth=0.9, label="predicted = measured")
    for pairing, group in table.groupby("pairing", sort=False):
        ax.scatter(group["measured"], group["predicted"], s=34, label=pairing, edgecolor="black", linewidth=0.5, zorder=3)
    ax.set_xscale("log")
    ax.set_yscale("log")
    for axis in (ax.xaxis, ax.yaxis):  # 4, 6, 10 rather than 4×10⁰
        axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        axis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_xlim(low, high)
    ax.set_ylim(low, high)
    ax.set_xlabel("measured tokens/s")
    ax.set_ylabel("predicted tokens/s (baselines and other points only)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8, loc="upper left")
    return _save(fig, path)


def _save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def _point_line(p: Placed) -> str:
    ways = ", ".join(p.measured)
    where = f"RTT {p.rtt_s * 1e3:.0f} ms" if p.split else "co-located"
    text = (f"{p.label} ({where}, α {p.alpha:.2f}): in the {p.region} region; measured, the fastest of {ways} is "
            f"{p.winner}: " + ("the model agrees." if p.model == p.winner else f"the model says {p.model}."))
    if p.edge_tokens_per_s > p.measured[p.winner]:
        text += " Edge-only was faster still (the edge's own text)."
    return text


def section(inputs: ReportInputs, labels: pd.Series, out: Path, embed: bool) -> dict | None:
    """The section's figures (with their src for the page), hints and per-pairing text; None without spec points."""
    records, summary = inputs.ok_rows, inputs.summary
    if not spec_points(records):
        return None
    panels, hints = build_panels(records, summary, labels)
    table, skipped = scatter_table(records, summary, labels)
    figures = []
    for name, path, title, read in (
            ("paymap", plot_map(panels, out / "figures" / "where_speculation_pays.png"),
             "Where speculation pays: fastest deployment over round trip × acceptance", MAP_READ),
            ("predicted_vs_measured", plot_scatter(table, out / "figures" / "predicted_vs_measured.png"),
             "Cost model: predicted vs measured tokens/s", SCATTER_READ + " " + scatter_caption(table, skipped))):
        if path is not None:
            figures.append({"name": name, "title": title, "how_to_read": read, "src": image_src(path, out, embed)})
    pairings: dict[str, list[str]] = {}
    for panel in panels:
        lines = pairings.setdefault(panel.pairing, [])
        lines += [f"{set_name(panel.prompts)}: {_point_line(p)}" for p in panel.placed]
    return {"figures": figures, "hints": hints[:3] + ([f"… and {len(hints) - 3} more like these"] if len(hints) > 3 else []),
            "pairings": [{"name": name, "lines": lines} for name, lines in pairings.items()]}
