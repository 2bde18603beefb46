"""The fleet report (`specbench report` on a `specbench fleet` folder): the capacity curve, the batch
sizes the server ran, the per-batch cost curve, and the capacity model that extrapolates it. Reads
DIR's raw files through bench/derive/fleet_summary.py; measures nothing; the capacity model
it prints is bench/derive/capacity.py's.
"""
from __future__ import annotations

import datetime
import json
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from bench.derive.capacity import capacity_model, distance_check, edge_profile
from bench.derive.fleet_summary import cost_curve, folder_runtime, level_table, read_fleet, runtime_of, summarize_fleet
from bench.read.report import page
from bench.read.report.fonts import subplots
from specdec.settings import Mode

COLORS = {"spec": "#4C72B0", "cloud": "#C44E52"}
NAMES = {"spec": "speculative (edges draft, server verifies)", "cloud": "cloud-only serving"}

CAPACITY_READ = (
    "Across: N, the edges served at once by one server. Solid, left axis: tokens per second the server delivered to "
    "all its clients together (bars: min to max over repeats). Dashed, right axis: what one edge got (median tokens/s "
    "of its generations). Blue is speculative decoding (each client an edge drafting and the server verifying its "
    "blocks); red is the same N clients served cloud-only (the server generates every token). Batching shows as a "
    "solid line that rises while the dashed one stays flat; where the dashed line falls, each edge pays for sharing. "
    "Grey, left axis, not measured: the spec throughput two closed forms predict from this fleet's own inputs, the "
    "paper's saturated factor 1 + γ·t_d/t_v times the measured cloud-only throughput (crosses), and our cost model's "
    "server of N edges for every N (dotted); their error is tabled under Scale on paper.")
DISTANCE_READ = (
    "The spec server throughput two closed forms predict, against what was measured at each N (error = predicted / "
    "measured − 1). Paper: Speculation at a Distance (arXiv 2606.25091) says a saturated server carries "
    "1 + γ·t_d/t_v times the clients of cloud-only serving, applied here to the measured cloud-only throughput at the "
    "same N. Ours: bench/derive/costmodel.py's server_tokens_per_s, N edges in lockstep sharing one forward per cycle, "
    "from the fitted cost curve of this runtime and one edge alone.")
BATCH_READ = (
    "How many sessions each server forward carried, per fleet size: bars are the share of forwards with that many "
    "rows. A window of 0 ms batches only what queued while the previous forward ran.")
COST_READ = (
    "Every server forward of the fleet: across, the token ids it fed (all rows), up, its seconds; colour, its rows. "
    "The line is the least-squares fit a + b·tokens the capacity model uses: a is what a forward costs for reading the "
    "weights once, b what each extra token adds once the matmuls are busy. On a memory-bound forward b·tokens stays "
    "small beside a (batching is nearly free); where the points bend up, the forward has turned compute-bound.")


def _save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def plot_capacity(summary: pd.DataFrame, path: Path, predicted: dict[str, pd.DataFrame] | None = None) -> Path | None:
    """The measured curves per (runtime, mode), and per runtime the two closed forms' predicted spec
    throughput (`predicted`: distance_check's curves by runtime)."""
    if summary.empty:
        return None
    fig, left = subplots(figsize=(7.5, 4.6))
    right = left.twinx()
    several = summary["cloud_runtime"].nunique() > 1
    markers = dict(zip(sorted(summary["cloud_runtime"].unique()), "o^vD<>"))
    for (runtime, mode), rows in summary.groupby(["cloud_runtime", "mode"]):
        rows = rows.sort_values("clients")
        name = f"{NAMES[mode]}, {runtime}" if several else NAMES[mode]
        y = rows["server_accepted_tokens_per_s"]
        error = [y - rows["server_accepted_tokens_per_s_min"], rows["server_accepted_tokens_per_s_max"] - y]
        left.errorbar(rows["clients"], y, yerr=error, color=COLORS[mode], marker=markers[runtime], capsize=3,
                      label=f"{name}: server tok/s")
        right.plot(rows["clients"], rows["edge_tokens_per_s_p50"], color=COLORS[mode], marker="s", linestyle="--",
                   label=f"{name}: per-edge tok/s")
    for runtime, curve in (predicted or {}).items():
        suffix = f", {runtime}" if several else ""
        left.plot(curve["clients"], curve["ours"], color="grey", linestyle=":", label=f"spec by our cost model{suffix}")
        left.plot(curve["clients"], curve["paper"], color="grey", marker="x", linestyle="none",
                  label=f"spec by 1 + γ·t_d/t_v × cloud-only{suffix}")
    left.set_xscale("log", base=2)
    left.set_xticks(sorted(summary["clients"].unique()), [str(n) for n in sorted(summary["clients"].unique())])
    left.set_xlabel("clients N (edges sharing one server)")
    left.set_ylabel("server: tokens/s delivered to all clients")
    right.set_ylabel("per edge: median tokens/s of a generation")
    left.set_ylim(bottom=0)
    right.set_ylim(bottom=0)
    handles = [h for ax in (left, right) for h in ax.get_legend_handles_labels()[0]]
    labels = [label for ax in (left, right) for label in ax.get_legend_handles_labels()[1]]
    left.legend(handles, labels, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2, frameon=False)
    left.grid(alpha=0.3)
    return _save(fig, path)


def plot_batch_sizes(summary: pd.DataFrame, path: Path) -> Path | None:
    if summary.empty:
        return None
    modes = sorted(summary["mode"].unique())
    fig, axes = subplots(1, len(modes), figsize=(5.5 * len(modes), 3.8), squeeze=False)
    for ax, mode in zip(axes[0], modes):
        rows = summary[summary["mode"] == mode].sort_values("clients")
        width = 0.8 / max(len(rows), 1)
        for i, (_, row) in enumerate(rows.iterrows()):
            hist = np.array(json.loads(row["batch_hist"]), dtype=float)
            if hist.sum():
                ax.bar(np.arange(1, hist.size + 1) + (i - len(rows) / 2) * width, hist / hist.sum(), width,
                       label=f"N = {row['clients']}")
        ax.set_title(NAMES[mode], fontsize=10)
        ax.set_xlabel("rows (sessions) in a forward")
        ax.set_ylabel("share of forwards")
        ax.legend(fontsize=8)
    return _save(fig, path)


def plot_cost_curve(batches: list[dict], fit: dict, path: Path) -> Path | None:
    if not batches:
        return None
    tokens = np.array([b["tokens"] for b in batches], dtype=float)
    seconds = np.array([b["forward_s"] for b in batches], dtype=float)
    rows = np.array([b["rows"] for b in batches], dtype=float)
    fig, ax = subplots(figsize=(7, 4.4))
    points = ax.scatter(tokens, seconds * 1e3, c=rows, cmap="viridis", s=12, alpha=0.7)
    fig.colorbar(points, ax=ax, label="rows in the forward")
    if not math.isnan(fit["a_s"]):
        x = np.linspace(0, tokens.max(), 50)
        ax.plot(x, (fit["a_s"] + fit["b_s_per_token"] * x) * 1e3, color="black",
                label=f"fit: {fit['a_s'] * 1e3:.1f} ms + {fit['b_s_per_token'] * 1e3:.2f} ms/token (R² {fit['r2']:.2f})")
        ax.legend(fontsize=8)
    ax.set_xscale("symlog", linthresh=10)
    ax.set_xlabel("token ids fed by the forward (all rows)")
    ax.set_ylabel("forward time (ms)")
    ax.grid(alpha=0.3)
    return _save(fig, path)


def findings(summary: pd.DataFrame) -> list[str]:
    """What the curve says in words: throughput gained by batching, and where cloud-only catches up."""
    lines = []
    spec = summary[summary["mode"] == Mode.SPEC].sort_values("clients")
    if len(spec) > 1:
        last = spec.iloc[-1]
        spread = (f" (over repeats {last['throughput_vs_smallest_min']:.2f}–{last['throughput_vs_smallest_max']:.2f})"
                  if last.get("repeats", 1) > 1 else " (one repeat: no spread)")
        lines.append(f"Speculative: the server delivered {last['throughput_vs_smallest']:.2f}× the tokens/s at N = "
                     f"{last['clients']} as at N = {spec.iloc[0]['clients']}{spread}; each edge got "
                     f"{last['edge_tokens_per_s_p50']:.2f} tok/s (median) against {spec.iloc[0]['edge_tokens_per_s_p50']:.2f}.")
    if "throughput_vs_cloud_only" in spec:
        both = spec.dropna(subset=["throughput_vs_cloud_only"])
        behind = both[both["throughput_vs_cloud_only"] <= 1.0]
        if both.empty:
            pass
        elif behind.empty:
            lines.append("Cloud-only serving did not catch up with speculative serving at any measured N.")
        elif behind.iloc[0]["clients"] == both.iloc[0]["clients"]:
            lines.append(f"Cloud-only serving delivered at least as many tokens/s as speculative serving from the smallest "
                         f"N on: spec/cloud-only {both.iloc[0]['throughput_vs_cloud_only']:.2f}× at N = "
                         f"{both.iloc[0]['clients']}, {both.iloc[-1]['throughput_vs_cloud_only']:.2f}× at N = "
                         f"{both.iloc[-1]['clients']}.")
        else:
            first = behind.iloc[0]
            lines.append(f"Cloud-only serving caught up at N = {first['clients']}: spec/cloud-only "
                         f"{first['throughput_vs_cloud_only']:.2f}× there (at N = {both.iloc[0]['clients']}: "
                         f"{both.iloc[0]['throughput_vs_cloud_only']:.2f}×).")
    return lines


def scale_on_paper(runtime: str, records: list[dict], batches: list[dict], summary: pd.DataFrame,
                   config: dict) -> dict:
    """One runtime's fitted cost curve, capacity model and closed-form check (its own forwards only:
    a folder served by several --cloud-url servers fits each apart)."""
    fit = cost_curve(batches)
    edge = edge_profile(records, summary, config["link"], config["edge_replay"])
    check, model, assumptions = capacity_model(fit, edge, summary)
    curve, distance, inputs = distance_check(fit, edge, summary, int(config["k"]))
    shown = distance.round({"server tok/s measured": 2, "paper: cloud-only × factor": 2, "ours: server_tokens_per_s": 2,
                            "paper error": 3, "ours error": 3})
    return {"runtime": runtime, "fit": fit, "curve": curve, "check": page.table_html(check) if not check.empty else "",
            "model": page.table_html(model) if not model.empty else "", "assumptions": assumptions,
            "distance": page.table_html(shown) if not shown.empty else "", "distance_inputs": inputs}


def build_fleet_report(results_dir: Path, out: Path, embed: bool = False) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    for stale in (out / "figures").glob("*.png"):
        stale.unlink()
    records, _, batches = read_fleet(results_dir)
    summary = summarize_fleet(results_dir)
    identity = json.loads((results_dir / "fleet.json").read_text(encoding="utf-8"))
    config = identity["config"]
    default = folder_runtime(results_dir)
    runtimes = sorted(summary["cloud_runtime"].unique()) if not summary.empty else []
    scales = [scale_on_paper(runtime, [r for r in records if runtime_of(r, default) == runtime],
                             [b for b in batches if runtime_of(b, default) == runtime],
                             summary[summary["cloud_runtime"] == runtime], config) for runtime in runtimes]
    figures = []
    for name, title, read, draw in (
            ("capacity", "Capacity: server throughput and per-edge rate against N", CAPACITY_READ,
             lambda p: plot_capacity(summary, p, {s["runtime"]: s["curve"] for s in scales if not s["curve"].empty})),
            ("batch_sizes", "Batch sizes the server ran", BATCH_READ, lambda p: plot_batch_sizes(summary, p)),
            ("cost_curve", "Per-batch cost curve", COST_READ,
             lambda p: plot_cost_curve(batches, scales[0]["fit"] if len(scales) == 1 else cost_curve(batches), p))):
        path = draw(out / "figures" / f"{name}.png")
        if path is not None:
            figures.append({"title": title, "read": read, "src": page.image_src(path, out, embed)})
    shown = ["cloud_runtime", "mode", "clients", "repeats", "server_accepted_tokens_per_s", "server_accepted_tokens_per_s_min",
             "server_accepted_tokens_per_s_max", "throughput_vs_smallest", "throughput_vs_cloud_only",
             "edge_tokens_per_s_p50", "edge_tokens_per_s_p90", "verify_latency_p50_s", "verify_latency_p99_s",
             "server_queue_p50_s", "server_compute_p50_s", "mean_batch_size", "cloud_busy_fraction",
             "accepted_tokens_per_cloud_s", "replay_mismatches"]
    table = summary[[c for c in shown if c in summary]].round(3) if not summary.empty else summary
    shared = {r.get("cores_shared") for r in records if r.get("edge_kind") == "process"}
    notes = []
    if shared - {None}:
        notes.append(f"Real edge processes shared this machine's {shared.pop()} cores with each other and with the "
                     "server: per-edge rates are lower than on separate devices, and they fall with N partly for that.")
    mismatches = int(summary["replay_mismatches"].sum()) if "replay_mismatches" in summary else 0
    if mismatches:
        notes.append(f"{mismatches} replayed verdicts differed from the recording ({config['dtype']}, cloud runtime "
                     f"{', '.join(runtimes)}): in bfloat16 a batched forward may round a near-tie differently; in "
                     "float32 it is a server bug.")
    context = {
        "title": f"specbench fleet report: {results_dir.resolve().name}",
        "source": str(results_dir), "generated": datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"),
        "runtimes": ", ".join(runtimes) or default,
        "settings": [(k, page.value_text(k, v)) for k, v in config.items()],
        "table": page.table_html(table, "points"), "figures": figures, "notes": notes,
        "findings": findings(summary) if not summary.empty else [],
        "scales": scales, "several": len(scales) > 1, "distance_read": DISTANCE_READ,
        "levels": len(level_table(results_dir)),
    }
    index = out / "index.html"
    index.write_text(page.render(context, "fleet.html.j2"), encoding="utf-8")
    return index


def is_fleet_folder(results_dir: Path) -> bool:
    return (Path(results_dir) / "fleet.json").is_file()

