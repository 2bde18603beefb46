"""The split deployment's figures.

Network time, modelled vs measured: per split point, the time its generations really spent on the
link (waits minus the server's own time) against `bench.core.network`'s arithmetic for the same trace
and preset.

The timeline: for one prompt, a per-cycle Gantt chart of a sequential and an overlapped run side
by side (edge drafting, edge drafting ahead, in flight, server queue, server compute, edge
waiting). Built from the per-cycle clock the engine records (`t_start_s`,
`t_sent_s`, `t_reply_s`, `edge_wait_s`) and the server's own times (`server_queue_s`, `cloud_s`).
The edge cannot tell up from down inside a round trip: in-flight time is drawn half before and
half after the server's share, and the caption says so."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import pandas as pd

from bench.core.point import Deployment
from bench.read.report.fonts import subplots

NETWORK_READ = (
    "Each dot is a split point (mean over its prompts): across, the network time bench/core/network.py models from the "
    "bytes each verify sent and the link's RTT and rates; up, the time its generations really waited on the link "
    "(send to verdict, minus the server's queue and compute), through `specbench link`. On the line the model holds. "
    "Above it the real link costs more than the arithmetic (protocol framing, scheduling, the edge's own delays); "
    "in-process points have no measured link and are not shown.")

COLORS = {"drafting": "#4C72B0", "drafting ahead": "#8DA0CB", "waiting": "#DDDDDD", "in flight": "#F2B134",
          "server queue": "#C44E52", "server compute": "#55A868"}

READ = (
    "One prompt, two runs of the same point over the same link: the sequential edge (top pair of rows) waits for "
    "every verdict; the overlapped edge (bottom pair) guesses the cloud's bonus token and drafts the next block while "
    "the block in flight is verified. Each row pair is the edge (drafting, drafting ahead, waiting) and the "
    "link + cloud (in flight, server queue, server compute). In-flight time is the round trip minus the server's "
    "share, drawn half on each side of it: the edge cannot split up from down. Overlap pays where the blue fills the "
    "grey; where a block is rejected, the light-blue drafting ahead was thrown away.")


def segments(trace: list[dict]) -> dict[str, list[tuple[str, float, float]]]:
    """Per row ('edge', 'link + cloud'): (kind, start_s, duration_s) bars, from one record's trace."""
    edge, cloud = [], []
    for cycle in trace:
        if not cycle.get("escalated") or not cycle.get("t_reply_s"):
            continue
        sent, reply = cycle["t_sent_s"], cycle["t_reply_s"]
        edge.append(("drafting", cycle["t_start_s"], sent - cycle["t_start_s"]))
        waiting = cycle["edge_wait_s"] if cycle.get("ahead_guess") is not None else reply - sent
        if reply - waiting > sent:
            edge.append(("drafting ahead", sent, reply - waiting - sent))
        edge.append(("waiting", reply - waiting, waiting))
        server = cycle["server_queue_s"] + cycle["cloud_s"]
        flight = max(cycle["wait_s"] - server, 0.0) / 2  # wait_s: send -> the verdict's last byte arrived
        cloud += [("in flight", sent, flight), ("server queue", sent + flight, cycle["server_queue_s"]),
                  ("server compute", sent + flight + cycle["server_queue_s"], cycle["cloud_s"]),
                  ("in flight", sent + flight + server, flight)]
    return {"edge": edge, "link + cloud": cloud}


def pick_pair(rows: pd.DataFrame) -> tuple[dict, dict] | None:
    """A sequential and an overlapped split record of one prompt at otherwise equal settings."""
    split = rows[(rows.get("deployment") == Deployment.SPLIT) & (rows["status"] == "ok")] if "deployment" in rows else rows[:0]
    if split.empty or "overlap" not in split:
        return None
    keys = [c for c in ("prompts", "id", "k", "entropy_threshold", "policy", "link", "dtype") if c in split]
    for _, group in split.groupby(keys, dropna=False, sort=True):
        by_overlap = {r["overlap"]: r for r in group.to_dict("records") if r["overlap"] in (True, False)}  # not auto
        if True in by_overlap and False in by_overlap:
            return by_overlap[False], by_overlap[True]
    return None


def plot_timeline(rows: pd.DataFrame, path: Path) -> Path | None:
    pair = pick_pair(rows)
    if pair is None:
        return None
    fig, ax = subplots(figsize=(12, 3.6))
    labels, y = [], 0
    for name, record in zip(("sequential", "overlapped"), pair):
        for row, bars in segments(record["trace"]).items():
            for kind, start, width in bars:
                ax.barh(y, width, left=start, height=0.7, color=COLORS[kind], edgecolor="white", linewidth=0.3)
            labels.append(f"{name}: {row} ({record['latency_s']:.2f} s)" if row == "edge" else f"{name}: {row}")
            y += 1
    ax.set_yticks(range(len(labels)), labels)
    ax.invert_yaxis()
    ax.set_xlabel("seconds since the prompt started")
    first = pair[0]
    ax.set_title(f"prompt {first['id']} ({first['prompts']}), k={first.get('k')}, link {first.get('link') or 'none'}")
    handles = [plt.Rectangle((0, 0), 1, 1, color=color) for color in COLORS.values()]
    ax.legend(handles, COLORS.keys(), ncol=6, loc="upper center", bbox_to_anchor=(0.5, -0.22), frameon=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def plot_network(summary: pd.DataFrame, labels: pd.Series, path: Path) -> Path | None:
    if "link_s_mean" not in summary:
        return None
    data = summary[summary["link_s_mean"].notna() & summary["network_s_mean"].notna() & (summary["network_s_mean"] > 0)]
    if data.empty:
        return None
    fig, ax = subplots(figsize=(6.4, 4.8))
    for link, group in data.groupby("link", sort=True):
        ax.scatter(group["network_s_mean"], group["link_s_mean"], label=str(link), s=36)
        for index, row in group.iterrows():
            ax.annotate(labels[index], (row["network_s_mean"], row["link_s_mean"]), fontsize=7,
                        xytext=(3, 3), textcoords="offset points")
    top = float(max(data["network_s_mean"].max(), data["link_s_mean"].max())) * 1.1
    ax.plot([0, top], [0, top], color="black", linewidth=0.8)
    ax.set_xlim(0, top)
    ax.set_ylim(0, top)
    ax.set_xlabel("modelled network time per prompt (s)")
    ax.set_ylabel("measured link time per prompt (s)")
    ax.legend(title="link", fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path
