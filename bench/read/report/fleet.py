"""The fleet report (`specbench report` on a `specbench fleet` folder): the capacity curve, the batch
sizes the server ran, the per-batch cost curve, and the capacity model that extrapolates it. Reads
DIR's raw files through bench/derive/fleet_summary.py; measures nothing.

The capacity model (on paper, from measured inputs; printed beside it with its error against the
measured fleet sizes). A forward feeding T token ids costs tau = a + b·T (the fitted cost curve).
A spec generation of n tokens takes V = n/alpha verifies of m tokens each and one prefill of its P
prompt tokens; its edge spends E = V·(g + rtt) of its own. With N edges, B of them in each forward:

  server work per generation   W(B) = V·(a/B + b·m) + a/B + b·P
  generation time              L = max(E + q·(V·(a + b·m·B) + a + b·P),  N·W(B))
                               (the edge's own time plus its waits, q = 1 + rho·(1 - 1/N)/2 for
                               the half forward it finds running; or the server's saturation bound)
  rows per forward             B = N·(L - E)/L   (edges waiting), solved with L by iteration
  per-edge rate n/L, server throughput N·n/L.

Cloud-only serving is the same with E = 0, V = n verifies of m = 1 token and alpha = 1 (tokens are
streamed: no round trip per token).
"""
from __future__ import annotations

import datetime
import json
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from bench.derive.fleet_summary import cost_curve, level_table, read_fleet, summarize_fleet  # noqa: E402
from bench.core.network import profile  # noqa: E402
from bench.core.records import read_records  # noqa: E402
from bench.read.report import page  # noqa: E402

COLORS = {"spec": "#4C72B0", "cloud": "#C44E52"}
NAMES = {"spec": "speculative (edges draft, server verifies)", "cloud": "cloud-only serving"}
FLEET_SIZES = (100, 1000)
TARGETS = (0.8, 0.5)  # target per-edge rates, as fractions of one edge's measured rate alone

CAPACITY_READ = (
    "Across: N, the edges served at once by one server. Solid, left axis: tokens per second the server delivered to "
    "all its clients together (bars: min to max over repeats). Dashed, right axis: what one edge got (median tokens/s "
    "of its generations). Blue is speculative decoding (each client an edge drafting and the server verifying its "
    "blocks); red is the same N clients served cloud-only (the server generates every token). Batching shows as a "
    "solid line that rises while the dashed one stays flat; where the dashed line falls, each edge pays for sharing.")
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


def plot_capacity(summary: pd.DataFrame, path: Path) -> Path | None:
    if summary.empty:
        return None
    fig, left = plt.subplots(figsize=(7.5, 4.6))
    right = left.twinx()
    for mode, rows in summary.groupby("mode"):
        rows = rows.sort_values("clients")
        y = rows["server_accepted_tokens_per_s"]
        error = [y - rows["server_accepted_tokens_per_s_min"], rows["server_accepted_tokens_per_s_max"] - y]
        left.errorbar(rows["clients"], y, yerr=error, color=COLORS[mode], marker="o", capsize=3,
                      label=f"{NAMES[mode]}: server tok/s")
        right.plot(rows["clients"], rows["edge_tokens_per_s_p50"], color=COLORS[mode], marker="s", linestyle="--",
                   label=f"{NAMES[mode]}: per-edge tok/s")
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
    fig, axes = plt.subplots(1, len(modes), figsize=(5.5 * len(modes), 3.8), squeeze=False)
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
    fig, ax = plt.subplots(figsize=(7, 4.4))
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


def edge_profile(records: list[dict], summary: pd.DataFrame, link: str, replay: str | None) -> dict | None:
    """What one edge does alone (spec at the smallest N): tokens per verify (alpha), tokens fed per
    verify (m), its own time per verify (g: drafting, outside the wait), prompt and output lengths
    (P, n), and the link's RTT."""
    smallest = summary[summary["mode"] == "spec"]["clients"].min()
    alone = [r for r in records if r["mode"] == "spec" and r["status"] == "ok" and r["clients"] == smallest]
    verifies = sum(r["verifies"] for r in alone)
    if not verifies:
        return None
    prompts = [r["prompt_tokens"] for r in alone if r.get("prompt_tokens")]
    if not prompts and replay and (Path(replay) / "results.jsonl").is_file():  # older fleet records: the recording's
        prompts = [r["prompt_tokens"] for r in read_records(Path(replay) / "results.jsonl") if r.get("prompt_tokens")]
    edge_s = sum(r["latency_s"] - sum(r["verify_wait_s"]) for r in alone)
    return {"alpha": sum(r["new_tokens"] for r in alone) / verifies,
            "m": sum(r["positions"] for r in alone) / verifies,
            "g_s": max(edge_s, 0.0) / verifies, "rtt_s": profile(link).rtt_s,
            "P": float(np.mean(prompts)) if prompts else 0.0,
            "n": sum(r["new_tokens"] for r in alone) / len(alone)}


def predict(clients: int, fit: dict, edge: dict, cloud_only: bool = False) -> tuple[float, float]:
    """(per-edge tokens/s, server tokens/s) the model gives for `clients` at once (module docstring)."""
    a, b, n, P = fit["a_s"], fit["b_s_per_token"], edge["n"], edge["P"]
    alpha, m, own = (1.0, 1.0, 0.0) if cloud_only else (edge["alpha"], edge["m"], edge["g_s"] + edge["rtt_s"])
    verifies = n / alpha
    mine = verifies * own
    length = mine + verifies * (a + b * m) + a + b * P  # alone
    for _ in range(500):
        rows = min(max(clients * (length - mine) / length, 1.0), clients)
        work = verifies * (a / rows + b * m) + a / rows + b * P
        rho = min(clients * work / length, 1.0)
        waits = (1 + rho * (1 - 1 / clients) / 2) * (verifies * (a + b * m * rows) + a + b * P)
        length = 0.5 * length + 0.5 * max(mine + waits, clients * work)
    return n / length, clients * n / length


def capacity_model(fit: dict, edge: dict | None, summary: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame, list[str]]:
    """(the model against the measured fleet sizes, edges per server at target rates with the
    servers 100 / 1,000 edges need, the assumptions)."""
    if edge is None or math.isnan(fit["a_s"]) or fit["b_s_per_token"] <= 0:
        return pd.DataFrame(), pd.DataFrame(), []
    check = []
    for _, row in summary.sort_values(["mode", "clients"]).iterrows():
        rate, server = predict(int(row["clients"]), fit, edge, cloud_only=row["mode"] == "cloud")
        check.append({"mode": row["mode"], "clients": int(row["clients"]),
                      "per-edge tok/s measured": round(row["edge_tokens_per_s_p50"], 2),
                      "per-edge tok/s model": round(rate, 2),
                      "server tok/s measured": round(row["server_accepted_tokens_per_s"], 1),
                      "server tok/s model": round(server, 1),
                      "model / measured (server)": round(server / row["server_accepted_tokens_per_s"], 2)})
    alone = predict(1, fit, edge)[0]
    rows = []
    for share in TARGETS:
        target = share * alone
        row = {"target per-edge tok/s": f"{target:.2f} ({share:.0%} of one edge alone, modelled)"}
        for name, cloud_only in (("spec", False), ("cloud-only", True)):
            most = max_clients(fit, edge, target, cloud_only)
            row[f"edges per server ({name})"] = most
            for fleet in FLEET_SIZES:
                row[f"servers for {fleet:,} ({name})"] = math.ceil(fleet / most) if most else "—"
        rows.append(row)
    assumptions = [
        f"a forward costs a + b·tokens with a = {fit['a_s'] * 1e3:.1f} ms, b = {fit['b_s_per_token'] * 1e3:.3f} ms per "
        f"token (least squares over {fit['forwards']} measured forwards of up to {fit['tokens_max']:.0f} tokens, R² "
        f"{fit['r2']:.2f}); beyond that it is a straight line (compute-bound)",
        f"one edge alone: alpha = {edge['alpha']:.2f} tokens per verify, m = {edge['m']:.2f} tokens fed per verify, "
        f"g = {edge['g_s'] * 1e3:.0f} ms of its own per verify, rtt = {edge['rtt_s'] * 1e3:.0f} ms, prompts of "
        f"P = {edge['P']:.0f} tokens, generations of n = {edge['n']:.0f} tokens (this fleet's settings and prompts)",
        "closed loop; an edge waits for the forward it finds running (half of one on average, in proportion to the "
        "server's load) and then its own; unlimited --max-batch; KV-cache memory and the server's own overheads "
        "(protocol, sampling, policy) left out; one server = one copy of this machine",
        "cloud-only: one token per step per user, streamed (no round trip per token), the same cost curve",
        "the first table says how far the model is from what this fleet measured: trust the extrapolation no more",
    ]
    crossing = next((n for n in range(1, 4097) if predict(n, fit, edge, True)[1] >= predict(n, fit, edge)[1]), None)
    assumptions.append(f"by the model, cloud-only serving's throughput reaches speculative serving's at N = {crossing}"
                       if crossing else "by the model, cloud-only serving's throughput stays below speculative "
                                        "serving's up to N = 4,096")
    return pd.DataFrame(check), pd.DataFrame(rows), assumptions


def max_clients(fit: dict, edge: dict, target: float, cloud_only: bool, limit: int = 1 << 20) -> int:
    """The most clients whose modelled per-edge rate still reaches `target` (0: not even one)."""
    if predict(1, fit, edge, cloud_only)[0] < target:
        return 0
    low, high = 1, 2
    while high < limit and predict(high, fit, edge, cloud_only)[0] >= target:
        low, high = high, high * 2
    while high - low > 1:  # the rate falls with N: bisect
        middle = (low + high) // 2
        low, high = (middle, high) if predict(middle, fit, edge, cloud_only)[0] >= target else (low, middle)
    return low


def findings(summary: pd.DataFrame) -> list[str]:
    """What the curve says in words: throughput gained by batching, and where cloud-only catches up."""
    lines = []
    spec = summary[summary["mode"] == "spec"].sort_values("clients")
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


def build_fleet_report(results_dir: Path, out: Path, embed: bool = False) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    for stale in (out / "figures").glob("*.png"):
        stale.unlink()
    records, _, batches = read_fleet(results_dir)
    summary = summarize_fleet(results_dir)
    identity = json.loads((results_dir / "fleet.json").read_text(encoding="utf-8"))
    config = identity["config"]
    fit = cost_curve(batches)
    edge = edge_profile(records, summary, config["link"], config["edge_replay"])
    check, model, assumptions = capacity_model(fit, edge, summary)
    figures = []
    for name, title, read, draw in (
            ("capacity", "Capacity: server throughput and per-edge rate against N", CAPACITY_READ,
             lambda p: plot_capacity(summary, p)),
            ("batch_sizes", "Batch sizes the server ran", BATCH_READ, lambda p: plot_batch_sizes(summary, p)),
            ("cost_curve", "Per-batch cost curve", COST_READ, lambda p: plot_cost_curve(batches, fit, p))):
        path = draw(out / "figures" / f"{name}.png")
        if path is not None:
            figures.append({"title": title, "read": read, "src": page.image_src(path, out, embed)})
    shown = ["mode", "clients", "repeats", "server_accepted_tokens_per_s", "server_accepted_tokens_per_s_min",
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
        notes.append(f"{mismatches} replayed verdicts differed from the recording ({config['dtype']}): in "
                     "bfloat16 a batched forward may round a near-tie differently; in float32 it is a server bug.")
    context = {
        "title": f"specbench fleet report: {results_dir.resolve().name}",
        "source": str(results_dir), "generated": datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"),
        "settings": [(k, page.value_text(k, v)) for k, v in config.items()],
        "table": page.table_html(table, "points"), "figures": figures, "notes": notes,
        "findings": findings(summary) if not summary.empty else [],
        "model": page.table_html(model) if not model.empty else "", "assumptions": assumptions,
        "check": page.table_html(check) if not check.empty else "",
        "levels": len(level_table(results_dir)),
    }
    index = out / "index.html"
    index.write_text(page.render(context, "fleet.html.j2"), encoding="utf-8")
    return index


def is_fleet_folder(results_dir: Path) -> bool:
    return (Path(results_dir) / "fleet.json").is_file()

