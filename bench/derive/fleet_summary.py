"""A fleet's statistics, derived afterwards from its raw files (bench/measure/serving/fleet.py writes them):

- per level (mode, N, repeat): server throughput = tokens the clients received / the level's wall
  time; the edges' own rate (median, and `p90` = the rate 90 % of generations reach, i.e. the 10th
  percentile of tokens/s); verify round trips p50/p99 as the client measured them, and the server's
  share of one apart: queued (waiting for the model) and computing; the server's forwards (mean
  rows per forward, the share of wall time it spent in forwards);
- per (cloud runtime, mode, N): the median over repeats, with min and max where repeats > 1, and the ratios a user
  acts on, paired by repeat: throughput against N = 1, spec against cloud-only serving;
- the per-batch cost curve: forward seconds against the tokens a forward fed, fitted as
  a + b·tokens (least squares), which the capacity model extrapolates.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from bench.core.records import read_records
from specdec.runtime_registry import default_runtime
from specdec.settings import Mode

LEVELS, BATCHES = "levels.jsonl", "batches.jsonl"
UNKNOWN_RUNTIME = "unknown"  # a --cloud-url server that did not say what runs its model
METRICS = ("server_accepted_tokens_per_s", "server_verified_tokens_per_s", "edge_tokens_per_s_p50",
           "edge_tokens_per_s_p90", "verify_latency_p50_s", "verify_latency_p99_s", "server_queue_p50_s",
           "server_compute_p50_s", "mean_batch_size",
           "cloud_busy_fraction", "accepted_tokens_per_cloud_s")


def read_fleet(out: Path) -> tuple[list[dict], list[dict], list[dict]]:
    """(records, finished levels, forwards) of a fleet folder."""
    out = Path(out)

    def read(name: str) -> list[dict]:
        return read_records(out / name, ("mode", "clients")) if (out / name).is_file() else []

    return read_records(out / "results.jsonl"), read(LEVELS), read(BATCHES)


def folder_runtime(out: Path) -> str:
    """The cloud runtime of a fleet folder whose levels predate `cloud_runtime`: its own server ran the
    default (`serve`'s: llama.cpp for a .gguf model, else torch), a --cloud-url server is unknown."""
    identity = Path(out) / "fleet.json"
    config = json.loads(identity.read_text(encoding="utf-8")).get("config", {}) if identity.is_file() else {}
    if config.get("cloud_runtime"):
        return config["cloud_runtime"]
    cloud = config.get("cloud")
    return UNKNOWN_RUNTIME if not cloud else default_runtime(cloud)


def runtime_of(row: dict, default: str) -> str:
    """A level's, record's or forward's cloud runtime (`default` for one written before it was recorded)."""
    return row.get("cloud_runtime") or default


def level_stats(level: dict, records: list[dict], batches: list[dict]) -> dict:
    ok = [r for r in records if r["status"] == "ok"]
    wall = level["wall_s"]
    rates = np.array([r["tokens_per_s"] for r in ok], dtype=float)
    waits = np.array([w for r in ok for w in r.get("verify_wait_s", [])], dtype=float)
    queued = np.array([w for r in ok for w in r.get("server_queue_s", [])], dtype=float)
    computed = np.array([w for r in ok for w in r.get("server_compute_s", [])], dtype=float)
    rows = np.array([b["rows"] for b in batches], dtype=float)
    forward_s = sum(b["forward_s"] for b in batches)
    new_tokens = sum(r["new_tokens"] for r in ok)

    def quantile(values: np.ndarray, q: float) -> float:
        return float(np.quantile(values, q)) if values.size else math.nan

    return {
        "mode": level["mode"], "clients": level["clients"], "repeat": level["repeat"], "wall_s": wall,
        "cloud_runtime": level["cloud_runtime"],
        "generations": len(ok), "new_tokens": new_tokens,
        "server_accepted_tokens_per_s": new_tokens / wall,
        "server_verified_tokens_per_s": sum(r.get("positions", 0) for r in ok) / wall,
        "edge_tokens_per_s_p50": quantile(rates, 0.5),
        "edge_tokens_per_s_p90": quantile(rates, 0.1),  # the rate 90 % of generations reach
        "verify_latency_p50_s": quantile(waits, 0.5),
        "verify_latency_p99_s": quantile(waits, 0.99),
        "server_queue_p50_s": quantile(queued, 0.5),  # of a verify (or step): waiting for the model
        "server_compute_p50_s": quantile(computed, 0.5),  # ... and its forward
        "mean_batch_size": float(rows.mean()) if rows.size else math.nan,
        "cloud_busy_fraction": forward_s / wall,
        "accepted_tokens_per_cloud_s": new_tokens / forward_s if forward_s else math.nan,
        "forwards": len(batches),
        "batch_hist": json.dumps([int((rows == n).sum()) for n in range(1, int(rows.max()) + 1)] if rows.size else []),
        "replay_mismatches": sum(r.get("replay_mismatches", 0) for r in ok),
        "verifies": sum(r.get("verifies", 0) for r in ok),
        "tokens_match": (sum(bool(r.get("tokens_match")) for r in ok) / len(ok)
                         if ok and "tokens_match" in ok[0] else math.nan),
    }


def level_table(out: Path) -> pd.DataFrame:
    records, levels, batches = read_fleet(out)
    default = folder_runtime(out)
    rows = []
    for level in levels:
        run = level["level_run"]
        level = {**level, "cloud_runtime": runtime_of(level, default)}
        rows.append(level_stats(level, [r for r in records if r.get("level_run") == run],
                                [b for b in batches if b.get("level_run") == run]))
    return pd.DataFrame(rows)


def summarize_fleet(out: Path) -> pd.DataFrame:
    """One row per (cloud runtime, mode, N): medians over repeats, the spread of throughput, and paired
    ratios (within one runtime: a folder served by several --cloud-url servers keeps them apart)."""
    table = level_table(out)
    if table.empty:
        return table
    rows = []
    for (runtime, mode, clients), group in table.groupby(["cloud_runtime", "mode", "clients"], sort=True):
        levels = table[table["cloud_runtime"] == runtime]
        row = {"cloud_runtime": runtime, "mode": mode, "clients": int(clients), "repeats": len(group)}
        for metric in METRICS:
            row[metric] = float(group[metric].median())
        throughput = group["server_accepted_tokens_per_s"]
        row["server_accepted_tokens_per_s_min"], row["server_accepted_tokens_per_s_max"] = throughput.min(), throughput.max()
        row.update(generations=int(group["generations"].sum()), verifies=int(group["verifies"].sum()),
                   replay_mismatches=int(group["replay_mismatches"].sum()), tokens_match=group["tokens_match"].mean(),
                   batch_hist=json.dumps(_summed([json.loads(h) for h in group["batch_hist"]])))
        row.update(_paired(levels, mode, clients, "mode", mode, "clients", levels["clients"].min(), "vs_smallest"))
        if mode == Mode.SPEC:
            row.update(_paired(levels, mode, clients, "clients", clients, "mode", "cloud", "vs_cloud_only"))
        rows.append(row)
    return pd.DataFrame(rows)


def _summed(histograms: list[list[int]]) -> list[int]:
    """Histograms of different lengths added bin by bin ([i] = forwards of i+1 rows)."""
    width = max(map(len, histograms), default=0)
    return [sum(h[i] for h in histograms if i < len(h)) for i in range(width)]


def _paired(levels: pd.DataFrame, mode: str, clients: int, fixed: str, fixed_value, vary: str, other, name: str) -> dict:
    """server_accepted_tokens_per_s of this (mode, N) over that of `other` (another N or mode),
    paired by repeat: median, min and max of the per-repeat ratios."""
    this = levels[(levels["mode"] == mode) & (levels["clients"] == clients)].set_index("repeat")
    base = levels[(levels[fixed] == fixed_value) & (levels[vary] == other)].set_index("repeat")
    ratios = (this["server_accepted_tokens_per_s"] / base["server_accepted_tokens_per_s"]).dropna()
    if ratios.empty:
        return {}
    return {f"throughput_{name}": float(ratios.median()), f"throughput_{name}_min": float(ratios.min()),
            f"throughput_{name}_max": float(ratios.max())}


def cost_curve(batches: list[dict]) -> dict:
    """forward_s ≈ a + b·tokens over every logged forward (tokens = ids fed, all rows): the fixed
    cost of reading the weights once, and the cost per token once the matmuls are busy."""
    tokens = np.array([b["tokens"] for b in batches], dtype=float)
    seconds = np.array([b["forward_s"] for b in batches], dtype=float)
    if tokens.size < 3 or np.ptp(tokens) == 0:
        return {"a_s": math.nan, "b_s_per_token": math.nan, "r2": math.nan, "forwards": int(tokens.size)}
    design = np.stack([np.ones_like(tokens), tokens], axis=1)
    (a, b), *_ = np.linalg.lstsq(design, seconds, rcond=None)
    residual = seconds - design @ np.array([a, b])
    r2 = 1 - residual.var() / seconds.var() if seconds.var() else math.nan
    return {"a_s": float(a), "b_s_per_token": float(b), "r2": float(r2), "forwards": int(tokens.size),
            "tokens_max": float(tokens.max())}
