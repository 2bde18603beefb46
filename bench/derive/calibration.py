"""A machine's calibration file, read and derived: what `specbench calibrate` (bench/measure/calibrate.py)
measured on one machine class, $SPECBENCH_HOME/calibration/<machine_class>.json.

    {"schema": 1, "fingerprint": specdec.machine.fingerprint(), "bandwidth_gbs": 20.1,
     "versions": {"torch": ..., "transformers": ..., "llama_cpp": ... or null}, "created": ISO date, "threads": 2,
     "entries": [{"model", "runtime", "threads", "step_ms", "step_ms_p10", "step_ms_p90",
                  "block_steps": {"1": 1.0, ..., "9": ...}, "weight_bytes", "floor_ms", "error", ...}],
     "compute_gmacs": 330.5 or null}

An entry per (model, runtime, threads). `step_ms`: a token step after a 128-token cache, the median over
rounds of each round's median step (p10-p90 over rounds); `block_steps[n]`: an n-token block (k + 1 = n)
in token steps, the ratio taken within each round, median over rounds (n = 1 is the step itself);
`weight_bytes`: what a step must read (bench/measure/calibrate.py's `streamed_weight_bytes`);
`floor_ms` = weight_bytes / bandwidth, the step no kernel can beat on this machine's memory, at the best of the
file's `bandwidth_gbs` and the entry's own (read around its rounds, in its process; absent from older files). An entry
whose runtime failed holds `error` (one line) and None for its timings. Besides these, an entry keeps
`dtype`, `model_stamp` and its raw `rounds` (step_s, block_s), so every number re-derives from the file, and
the prompt's: `prefill_s` (an 800-token prompt, each round) and `prompt_macs_per_token` (the model's decoder
Linears). `compute_gmacs`, where a kernel path runs: the kernels' int8 multiply-adds a second with weights in
cache, so `compute_gmacs / prompt_macs_per_token` is the prompt rate a prefill on them cannot beat (its roof,
beside the step's floor; absent from files written before it).
"""
from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from bench.derive.runtime_cost_table import block_steps, spread, step_seconds
from specdec.errors import ConfigError
from specdec.machine import describe, fingerprint

SCHEMA = 1
FIELDS = ("schema", "fingerprint", "bandwidth_gbs", "versions", "created", "threads", "entries")
ENTRY_FIELDS = ("model", "runtime", "threads", "step_ms", "step_ms_p10", "step_ms_p90", "block_steps",
                "weight_bytes", "floor_ms", "error")
SHOWN_BLOCKS = ("2", "5", "9")  # k + 1 for k = 1, 4, 8 in the printed table


def entry_of(measured: dict, bandwidth_gbs: float) -> dict:
    """An entry from what one child measured: {model, runtime, threads, dtype, weight_bytes, rounds,
    model_stamp, error}; its timings derived here, never in the measuring process."""
    entry = {key: measured.get(key) for key in ("model", "runtime", "threads")}
    if measured.get("error"):
        return {**entry, "step_ms": None, "step_ms_p10": None, "step_ms_p90": None, "block_steps": None,
                "weight_bytes": measured.get("weight_bytes"), "floor_ms": None, "error": measured["error"],
                "dtype": measured.get("dtype"), "model_stamp": measured.get("model_stamp"), "rounds": []}
    rounds = measured["rounds"]
    bandwidth_gbs = max(bandwidth_gbs, measured.get("bandwidth_gbs") or 0)  # the memory's best, at start or around the step
    step, low, high = spread(step_seconds(rounds))
    blocks = {"1": 1.0, **{str(n): _shown(statistics.median(ratios)) for n, ratios in block_steps(rounds).items()}}
    return {**entry, "step_ms": _shown(step * 1e3), "step_ms_p10": _shown(low * 1e3), "step_ms_p90": _shown(high * 1e3),
            "block_steps": blocks, "weight_bytes": measured["weight_bytes"],
            "floor_ms": _shown(measured["weight_bytes"] / (bandwidth_gbs * 1e9) * 1e3), "error": None,
            "dtype": measured.get("dtype"), "model_stamp": measured.get("model_stamp"), "rounds": rounds,
            "method": measured.get("method"), "block_vs_steps": measured.get("block_vs_steps"),
            "prefill_tokens_per_s": (_shown(measured["prefill_tokens"] / statistics.median(measured["prefill_s"]))
                                     if measured.get("prefill_s") else None),
            "prefill_s": measured.get("prefill_s"), "prefill_tokens": measured.get("prefill_tokens"),
            "prompt_macs_per_token": measured.get("prompt_macs_per_token"), "bandwidth_gbs": measured.get("bandwidth_gbs")}


def best_bandwidth(data: dict) -> float | None:
    """The fastest the memory was read anywhere in the file: at the calibration's start or around any entry's rounds.
    A floor computed from less is no lower bound (the AMD EPYC of 2026-12-01 read 32 GB/s at the start and 61 around
    the kernels' rounds minutes later: a floor of 30 ms ruled llama.cpp out where the true one was 16)."""
    readings = [data.get("bandwidth_gbs") or 0, *((e.get("bandwidth_gbs") or 0) for e in data.get("entries", []))]
    return max(readings) or None


def _shown(value: float) -> float:
    """Four significant digits: the file stays readable, and a tiny model's 0.003 ms floor keeps its size."""
    return float(f"{value:.4g}")


def find_entry(data: dict, model: str, runtime: str, threads: int | None = None) -> dict | None:
    """The entry of (model, runtime) at `threads` (None: the file's own thread count), or None."""
    threads = data["threads"] if threads is None else threads
    return next((e for e in data["entries"] if (e["model"], e["runtime"], e["threads"]) == (model, runtime, threads)), None)


# --- reading ---------------------------------------------------------------------------------
def read_calibration(path: Path, any_machine: bool = False) -> dict:
    """The calibration file at `path`, validated: its schema and fields, and (unless `any_machine`) that
    it was measured on this machine's class. ConfigError with one line naming the problem and the fix."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"no calibration file at {path}: run `specbench calibrate`") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        why = f"{e.msg}, line {e.lineno}" if isinstance(e, json.JSONDecodeError) else str(e)
        raise ConfigError(damaged(path, f"not JSON: {why}")) from None
    if problem := _problem(data):
        raise ConfigError(damaged(path, problem))
    if not any_machine and (found := data["fingerprint"])["machine_class"] != (here := fingerprint())["machine_class"]:
        raise ConfigError(f"calibration file {path} was measured on {describe(found)}, this machine is {describe(here)}: "
                          "run `specbench calibrate`")
    return data


def damaged(path: Path, why: str) -> str:
    return f"calibration file {path} is damaged ({why}): delete it or run `specbench calibrate --force`"


def _problem(data) -> str | None:
    """What is wrong with a calibration file's contents, or None."""
    if not isinstance(data, dict):
        return "not a JSON object"
    if data.get("schema") != SCHEMA:
        return f"schema {data.get('schema')!r}, this version reads {SCHEMA}"
    if missing := [key for key in FIELDS if key not in data]:
        return f"missing {', '.join(missing)}"
    if not isinstance(data["fingerprint"], dict) or not isinstance(data["fingerprint"].get("machine_class"), str):
        return "its fingerprint has no machine_class"
    if not (_number(data["bandwidth_gbs"]) and data["bandwidth_gbs"] > 0):
        return f"bandwidth_gbs {data['bandwidth_gbs']!r} is not a positive number"
    if not isinstance(data["versions"], dict) or not isinstance(data["entries"], list):
        return "versions must be an object and entries a list"
    for i, entry in enumerate(data["entries"]):
        if not isinstance(entry, dict) or (missing := [key for key in ENTRY_FIELDS if key not in entry]):
            return f"entry {i} " + (f"has no {missing[0]}" if isinstance(entry, dict) else "is not an object")
        if not (isinstance(entry["model"], str) and isinstance(entry["runtime"], str) and isinstance(entry["threads"], int)):
            return f"entry {i} needs a model and runtime name and a thread count"
        if entry["error"] is None and not (
                all(_number(entry[key]) for key in ("step_ms", "step_ms_p10", "step_ms_p90", "floor_ms"))
                and isinstance(entry["block_steps"], dict) and all(_number(v) for v in entry["block_steps"].values())):
            return f"entry {i} ({entry['model']}, {entry['runtime']}) has no error and no timings"
    return None


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


# --- showing ---------------------------------------------------------------------------------
def prefill_roof(data: dict, entry: dict) -> str:
    """The prompt rate the measured int8 multiply-add rate allows this entry's model (its Linears' multiply-adds a
    token; attention's few per cent left out), or "-" where either is unknown."""
    compute, macs = data.get("compute_gmacs"), entry.get("prompt_macs_per_token")
    return f"{compute * 1e9 / macs:.0f}" if compute and macs else "-"


def table(data: dict) -> str:
    """The machine line, then one row per entry: step ms [p10-p90], floor ms, step/floor, blocks in steps, the
    5-token block (a k = 4 verify) in steps of the model's fastest plain decoding here (which one: named under the
    table), block vs steps, and the prompt rate."""
    compute = data.get("compute_gmacs")
    lines = [f"machine: {describe(data['fingerprint'])}; memory read {data['bandwidth_gbs']:.1f} GB/s"
             + (f"; int8 multiply-adds {compute:.0f} G/s (the kernels' Linear, weights in cache)" if compute else ""),
             "runtime | model | threads | step ms [p10-p90] | floor ms | step/floor | "
             + " | ".join(f"k+1={n} (steps)" for n in SHOWN_BLOCKS)
             + " | k+1=5 (fastest steps) | block vs steps max |Δlogit| | prefill tok/s | prefill roof tok/s",
             "--- | --- | --- | --- | --- | --- | " + " | ".join("---" for _ in SHOWN_BLOCKS) + " | --- | --- | --- | ---"]
    fastest: dict[tuple, dict] = {}  # (model, threads) -> its entry with the fastest step
    for e in data["entries"]:
        key = (e["model"], e["threads"])
        if not e["error"] and (key not in fastest or e["step_ms"] < fastest[key]["step_ms"]):
            fastest[key] = e
    for e in sorted(data["entries"], key=lambda e: (e["runtime"], e["model"], e["threads"])):
        head = f"{e['runtime']} | {e['model']} | {e['threads']}"
        if e["error"]:
            lines.append(f"{head} | error: {e['error']}")
            continue
        blocks = " | ".join(f"{e['block_steps'][n]:.2f}" if n in e["block_steps"] else "-" for n in SHOWN_BLOCKS)
        best = fastest[e["model"], e["threads"]]
        in_fastest = (f"{e['step_ms'] * e['block_steps']['5'] / best['step_ms']:.2f}" if "5" in e["block_steps"]
                      else "-")
        prefill = e.get("prefill_tokens_per_s")
        lines.append(f"{head} | {e['step_ms']:.1f} [{e['step_ms_p10']:.1f}-{e['step_ms_p90']:.1f}] | {e['floor_ms']:.1f} | "
                     f"{e['step_ms'] / e['floor_ms'] if e['floor_ms'] else math.inf:.2f} | {blocks} | {in_fastest} | "
                     f"{'-' if e.get('block_vs_steps') is None else format(e['block_vs_steps'], '.3g')} | "
                     f"{'-' if prefill is None else format(prefill, '.0f')} | {prefill_roof(data, e)}")
    named = sorted({(m, t, e["runtime"], e["step_ms"]) for (m, t), e in fastest.items()})
    lines += [f"fastest plain decoding of {m} at {t} threads: {r}, {ms:.1f} ms a token" for m, t, r, ms in named]
    return "\n".join(lines)
