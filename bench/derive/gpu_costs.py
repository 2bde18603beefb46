"""What a GPU's cost curve says, derived from the raw timings bench/measure/gpu_check.py wrote (its
cost_curve.csv rows): the medians, each model's bandwidth floor, and issue 44's targets, as measured ratios.

    floor_ms      = streamed weight bytes / measured bandwidth: no step can read its weights faster
    step_ms       = a 1-row, 1-token forward after CONTEXT cached tokens, per mode (eager: transformers'
                    DynamicCache; static: the static cache eagerly; graphs: its captured replay)
    plain_ms      = the fastest plain step measured, min over the modes (the honest baseline: issue 44)
    block_steps   = a rows x tokens forward in the same mode's steps (1 = a block costs one step)

Targets (issue 44, on an H100 and the 7B): the graph-captured step <= 1.5 floors, a 5-token verify <= 1.3
graph-captured steps. Each is reported with the measured ratio; a mode or shape not measured is None.

The fleet's capacity (`capacity`, from a fleet's summary.csv: replayed edges against the architecture keeping
their recorded verdicts; one per server cache), per fleet size N:
    spec_over_cloud      server throughput, spec / cloud-only serving on the same server, paired by repeat:
                         median [min, max] (the target: >= 2 at N = 8)
    per_cloud_s_ratio    tokens delivered per second the server spent in forwards, spec / cloud-only: what the
                         ratio becomes where the server, not the edges, is what limits (a saturated server)
    graph_bound          N / (an N-row, 1-token graph-captured forward of the curve): the most tokens/s cloud-only
                         serving could deliver with captured steps and no server around them, and spec's measured
                         throughput over it (`spec_over_graph_bound`): modelled from measured forwards, a bound
"""
from __future__ import annotations

import statistics
from typing import Any

from specdec.settings import Mode

STEP_TARGET_FLOORS = 1.5
VERIFY_TOKENS = 5  # k = 4: the verify block of the shipped default
VERIFY_TARGET_STEPS = 1.3
FLEET_TARGET_CLIENTS, FLEET_TARGET_RATIO = 8, 2.0


def spread(times_ms: list[float]) -> tuple[float, float, float]:
    """(median, p10, p90) of raw timings."""
    ordered = sorted(times_ms)

    def pick(q: float) -> float:
        return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]

    return statistics.median(ordered), pick(0.1), pick(0.9)


def _median(rows: list[dict], model: str, mode: str, batch: int, tokens: int) -> float | None:
    found = [r["median_ms"] for r in rows if (r["model"], r["mode"], r["rows"], r["tokens"]) == (model, mode, batch, tokens)]
    return found[0] if found else None


def _ratio(top: float | None, bottom: float | None) -> float | None:
    return None if top is None or not bottom else round(top / bottom, 3)


def summarize(rows: list[dict], weight_bytes: dict[str, int], bandwidth_gbs: float, gpu: str | None) -> dict:
    """Per model: floor, steps per mode, the best plain step, the targets' ratios, and every block in steps."""
    models = {}
    for model, size in weight_bytes.items():
        floor_ms = size / (bandwidth_gbs * 1e9) * 1e3
        modes = sorted({r["mode"] for r in rows if r["model"] == model})
        steps = {mode: _median(rows, model, mode, 1, 1) for mode in modes}
        measured = [s for s in steps.values() if s is not None]
        graphs, verify = steps.get("graphs"), _median(rows, model, "graphs", 1, VERIFY_TOKENS)
        blocks = [{"mode": r["mode"], "rows": r["rows"], "tokens": r["tokens"],
                   "steps": _ratio(r["median_ms"], steps.get(r["mode"]))} for r in rows if r["model"] == model]
        models[model] = {
            "weight_bytes": size, "floor_ms": round(floor_ms, 4), "step_ms": steps,
            "plain_ms": min(measured) if measured else None,
            "step_floors": {mode: _ratio(s, floor_ms) for mode, s in steps.items()},
            "targets": {
                f"graph step <= {STEP_TARGET_FLOORS} floors": _verdict(_ratio(graphs, floor_ms), STEP_TARGET_FLOORS),
                f"{VERIFY_TOKENS}-token verify <= {VERIFY_TARGET_STEPS} graph steps": _verdict(_ratio(verify, graphs),
                                                                                             VERIFY_TARGET_STEPS)},
            "block_steps": blocks,
        }
    return {"gpu": gpu, "bandwidth_gbs": round(bandwidth_gbs, 1), "models": models}


def _verdict(ratio: float | None, target: float) -> dict:
    return {"measured": ratio, "target": target, "met": None if ratio is None else ratio <= target}


def capacity(table) -> dict:
    """Per fleet size, spec against cloud-only serving, from a fleet's summary (a pandas frame; empty: nothing ran)."""
    levels: dict[int, dict[str, Any]] = {}
    for clients in sorted(set(table["clients"])) if not table.empty else []:
        spec = table[(table["clients"] == clients) & (table["mode"] == Mode.SPEC)]
        cloud = table[(table["clients"] == clients) & (table["mode"] == Mode.CLOUD)]
        if spec.empty or cloud.empty:
            continue
        spec, cloud = spec.iloc[0], cloud.iloc[0]
        levels[int(clients)] = {
            "spec_tokens_per_s": round(float(spec["server_accepted_tokens_per_s"]), 2),
            "cloud_tokens_per_s": round(float(cloud["server_accepted_tokens_per_s"]), 2),
            "spec_over_cloud": _rounded(spec.get("throughput_vs_cloud_only")),
            "spec_over_cloud_min": _rounded(spec.get("throughput_vs_cloud_only_min")),
            "spec_over_cloud_max": _rounded(spec.get("throughput_vs_cloud_only_max")),
            "repeats": int(spec["repeats"]),
            "per_cloud_s_ratio": _ratio(spec["accepted_tokens_per_cloud_s"], cloud["accepted_tokens_per_cloud_s"]),
            "mean_batch_size": {"spec": _rounded(spec["mean_batch_size"]), "cloud": _rounded(cloud["mean_batch_size"])},
            "cloud_busy_fraction": {"spec": _rounded(spec["cloud_busy_fraction"]),
                                    "cloud": _rounded(cloud["cloud_busy_fraction"])},
            "server_disagreed": int(spec["replay_mismatches"]), "verifies": int(spec["verifies"]),
        }
    at_target = levels.get(FLEET_TARGET_CLIENTS, {}).get("spec_over_cloud")
    target = f"spec/cloud-only throughput >= {FLEET_TARGET_RATIO} at N = {FLEET_TARGET_CLIENTS}"
    return {"levels": levels, "target": {target: {"measured": at_target, "target": FLEET_TARGET_RATIO,
                                                  "met": None if at_target is None else at_target >= FLEET_TARGET_RATIO}}}


def graph_bound(fleet: dict, rows: list[dict], model: str) -> dict:
    """Per fleet size: cloud-only tokens/s with captured steps, N / (the N-row 1-token graphs forward), and spec's
    measured throughput over it; None where the curve has no such shape."""
    bounds = {}
    for clients, level in fleet.get("levels", {}).items():
        forward_ms = _median(rows, model, "graphs", int(clients), 1)
        tokens_per_s = None if not forward_ms else round(int(clients) / (forward_ms / 1e3), 2)
        bounds[int(clients)] = {"cloud_tokens_per_s": tokens_per_s,
                                "spec_over_graph_bound": _ratio(level["spec_tokens_per_s"], tokens_per_s)}
    return bounds


def _rounded(value) -> float | None:
    return None if value is None or value != value else round(float(value), 3)  # NaN: not measured
