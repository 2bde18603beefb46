"""The soak report (`specbench report` on a soak's folder, bench/measure/serving/soak.py): its checks and
the server's health over time, faults marked. Reads the rows through bench/derive/soak_summary.py;
measures nothing."""
from __future__ import annotations

import datetime
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt

from bench.derive.soak_summary import read_soak, summarize_soak
from bench.read.report import page
from bench.read.report.fonts import subplots
from specdec.errors import InputError

READ = (
    "Across: seconds since the soak started. Shaded: the fault window (an edge SIGKILLed and restarted at each red "
    "line, the server stopped for 5 s in the grey band, a client that vanished at the start, one that reads slowly "
    "throughout). Top to bottom: the server's resident memory; its open file descriptors and threads; its live "
    "sessions and connections (the sampler's own left out; a gap: the server did not answer within a second); its "
    "asyncio tasks; each finished generation's slowest verify wait (dots) with failed generations as red crosses. "
    "A healthy server comes back to the left of the window's levels after each fault and ends where it began.")
FAULT_COLORS = {"edge_kill": "#C44E52", "vanish": "#8172B2", "slow_reader": "#CCB974", "server_stop": "#8C8C8C"}


def plot_soak(rows: list[dict], path: Path) -> Path:
    samples = [r for r in rows if r["kind"] == "sample"]
    faults = [r for r in rows if r["kind"] == "fault"]
    generations = [r for r in rows if r["kind"] == "generation"]
    t = [s["t"] for s in samples]
    fig, axes = subplots(5, 1, figsize=(11, 12), sharex=True)
    axes[0].plot(t, [s["rss_bytes"] / 2**20 for s in samples], color="#4C72B0")
    axes[0].set_ylabel("RSS (MiB)")
    axes[1].plot(t, [s["fds"] for s in samples], label="open FDs", color="#4C72B0")
    axes[1].plot(t, [s["threads"] for s in samples], label="threads", color="#55A868")
    axes[1].legend(loc="upper left", fontsize=8)

    def live(name: str) -> list[float]:
        return [s[name] if s[name] is not None else float("nan") for s in samples]

    axes[2].plot(t, live("sessions"), label="sessions", color="#4C72B0")
    axes[2].plot(t, live("connections"), label="connections", color="#DD8452")
    axes[2].legend(loc="upper left", fontsize=8)
    axes[3].plot(t, live("tasks"), color="#937860")
    axes[3].set_ylabel("asyncio tasks")
    ok = [g for g in generations if g["status"] == "ok" and g.get("verify_wait_s")]
    axes[4].scatter([g["t"] for g in ok], [max(g["verify_wait_s"]) * 1e3 for g in ok], s=6, color="#4C72B0")
    failed = [g for g in generations if g["status"] != "ok"]
    if failed:
        top = max([max(g["verify_wait_s"]) * 1e3 for g in ok] or [1.0])
        axes[4].scatter([g["t"] for g in failed], [top] * len(failed), marker="x", color="#C44E52", label="failed")
        axes[4].legend(loc="upper left", fontsize=8)
    axes[4].set_ylabel("slowest verify wait (ms)")
    axes[4].set_xlabel("seconds since the soak started")
    for ax in axes:
        for fault in faults:
            color = FAULT_COLORS.get(fault["fault"], "#999999")
            if "until" in fault:
                ax.axvspan(fault["t"], fault["until"], color=color, alpha=0.12 if fault["fault"] != "server_stop" else 0.35, lw=0)
            else:
                ax.axvline(fault["t"], color=color, lw=0.8, alpha=0.7)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return path


def build_soak_report(results_dir: Path, out: Path, embed: bool = False) -> Path:
    rows = read_soak(results_dir)
    if not rows:
        raise InputError(f"{results_dir} holds no finished soak (an interrupted one has no `end` row): rerun the soak")
    summary = summarize_soak(rows)
    out.mkdir(parents=True, exist_ok=True)
    figure = plot_soak(rows, out / "figures" / "soak.png")
    config = json.loads((results_dir / "soak.json").read_text(encoding="utf-8"))["config"]
    context = {"title": f"specbench soak report: {results_dir.resolve().name}", "source": str(results_dir),
               "generated": datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"),
               "duration": f"{summary['duration_s']:.0f}", "generations": summary["generations"],
               "checks": summary["checks"], "read": READ, "figure": page.image_src(figure, out, embed),
               "settings": [(k, page.value_text(k, v)) for k, v in config.items()]}
    index = out / "index.html"
    index.write_text(page.render(context, "soak.html.j2"), encoding="utf-8")
    return index


def is_soak_folder(results_dir: Path) -> bool:
    return (Path(results_dir) / "soak.json").is_file()
