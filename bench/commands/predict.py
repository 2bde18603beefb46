"""`specbench predict`: the cost model (bench/derive/costmodel.py) against a results folder, or on a
user's own numbers.

    specbench predict RESULTS_DIR
        fits the inputs from the folder's baselines and other points (bench/derive/costfit.py: never a
        point's own timings), predicts every spec point, writes RESULTS_DIR/predictions.csv and prints
        the median and largest |error|
    specbench predict --edge-ms-per-token 30 --verify-cost 40,2 --rtt-ms 20,50,150 --bandwidth-mbps 10 \\
                      --acceptance-from RESULTS_DIR
        the best k per link, its speed-up against cloud-only and co-located speculation, and whether
        drafting ahead pays
"""
from __future__ import annotations

import argparse
import math
from enum import StrEnum
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bench.core.network import escalation_bytes
from bench.core.point import COLUMNS, Point
from bench.core.records import read_records
from bench.derive.calibration import find_entry, read_calibration
from bench.derive.costfit import acceptance, acceptance_group, columns_key, predict_point, spec_points
from bench.derive.costmodel import CostInputs, Link, cloud_only, colocated, drafting_ahead, sequential
from bench.derive.runtime_choice import verify_cost_ms
from bench.derive.summary import summarize
from bench.measure.calibrate import calibration_path
from specdec.errors import ConfigError, InputError
from specdec.machine import fingerprint
from specdec.settings import choices, parse


class Cores(StrEnum):
    """predict's --cores: where the split points' edge and server ran, overriding what their records say."""

    SHARED = "shared"  # on the same cores (one machine emulating two)
    SPLIT = "split"  # on cores of their own (a sweep's split_cores disjoint)


USER_FLAGS = ("edge_ms_per_token", "verify_cost", "rtt_ms", "bandwidth_mbps")
# what every finished record of `specbench run` / `sweep` holds and the summary reads from each one
OK_FIELDS = ("text", "tokens", "new_tokens", "latency_s")


def add_predict_parser(sub) -> None:
    p = sub.add_parser("predict", help="the cost model: predict a results folder's spec points from its baselines, "
                                       "or where speculation pays on your own numbers")
    p.add_argument("results", nargs="?", type=Path, help="a results folder (run or sweep) to predict")
    p.add_argument("--cores", choices=choices(Cores), default=None,
                   help="folder mode: whether the split points' edge and server shared cores or had their own; "
                        "default: as each point's records say (split_cores; older records: shared)")
    p.add_argument("--edge-ms-per-token", help="your edge: ms per drafted token (forward + sampling)")
    p.add_argument("--verify-cost", help="your cloud: A,B for a verify forward of A + B·tokens ms")
    p.add_argument("--rtt-ms", help="round-trip times to try, comma-separated, e.g. 20,50,150")
    p.add_argument("--bandwidth-mbps", help="the link's rate each way, Mbit/s")
    p.add_argument("--colocated-ms-per-token", help="the draft model on the cloud's cores, ms per token "
                                                    "(default: the edge's)")
    p.add_argument("--acceptance-from", type=Path, help="a results folder whose spec points give the acceptance per k")
    p.add_argument("--calibrated", metavar="CLOUD:RUNTIME,EDGE:RUNTIME",
                   help="take --verify-cost and --edge-ms-per-token from this machine's calibration (`specbench "
                        "calibrate`): the cloud's block curve fitted as A + B·tokens, the edge's token step")
    p.set_defaults(func=cmd_predict)


def cmd_predict(args: argparse.Namespace) -> int:
    if args.calibrated is not None:
        if args.verify_cost is not None or args.edge_ms_per_token is not None:
            raise ConfigError("--calibrated gives --verify-cost and --edge-ms-per-token: give one or the other")
        args.verify_cost, args.edge_ms_per_token = calibrated_costs(args.calibrated)
    user = [name for name in USER_FLAGS if getattr(args, name) is not None]
    if args.results is not None and (user or args.acceptance_from or args.colocated_ms_per_token is not None):
        raise ConfigError("give a RESULTS_DIR, or your own numbers with --acceptance-from, not both")
    if args.results is None and args.cores is not None:
        raise ConfigError("--cores applies to a RESULTS_DIR's split points: give the folder, or leave --cores out")
    if args.results is not None:
        cores = None if args.cores is None else parse(Cores, args.cores, "--cores")  # argparse checked the word
        return predict_folder(args.results, None if cores is None else cores == Cores.SHARED)
    if len(user) < len(USER_FLAGS) or args.acceptance_from is None:
        raise ConfigError("predict needs a RESULTS_DIR, or all of --edge-ms-per-token, --verify-cost A,B, --rtt-ms, "
                          "--bandwidth-mbps and --acceptance-from RESULTS_DIR")
    return predict_user(args)


def calibrated_costs(text: str) -> tuple[str, str]:
    """`CLOUD:RUNTIME,EDGE:RUNTIME` -> (--verify-cost "A,B", --edge-ms-per-token "T") from this machine's
    calibration file, measured beside the user's question instead of another machine's numbers."""
    pairs = [part.strip().rpartition(":") for part in text.split(",")]
    if len(pairs) != 2 or not all(model and runtime for model, _, runtime in pairs):
        raise ConfigError(f"--calibrated {text!r}: need CLOUD:RUNTIME,EDGE:RUNTIME, e.g. "
                          "qwen2.5-coder-1.5b:torch-int8t,qwen2.5-coder-0.5b:llamacpp")
    data = read_calibration(calibration_path(fingerprint()["machine_class"]))
    found = []  # the cloud's entry, then the edge's
    for model, _, runtime in pairs:
        entry = find_entry(data, model, runtime)
        if entry is None or entry.get("error"):
            why = f" ({entry['error']})" if entry else ""
            raise ConfigError(f"this machine's calibration has no working {model} in {runtime}{why}: run `specbench "
                              f"calibrate --models {model} --runtimes {runtime}`")
        found.append(entry)
    a_ms, b_ms = verify_cost_ms(found[0])
    return f"{a_ms:.6g},{b_ms:.6g}", f"{found[1]['step_ms']:.6g}"


def _records(folder: Path) -> list[dict]:
    path = folder / "results.jsonl"
    if not folder.exists():
        raise InputError(f"{folder} does not exist: give a folder written by `specbench run` or `specbench sweep`")
    if folder.is_file():
        raise InputError(f"{folder} is a file: give the folder that holds results.jsonl ({folder.parent})")
    if not path.is_file():
        raise InputError(f"{folder} has no results.jsonl: give a folder written by `specbench run` or `specbench sweep`")
    records = read_records(path)
    if not records:
        raise InputError(f"{path} holds no finished record: run `specbench sweep` into {folder} (or wait for it)")
    for number, record in enumerate(records, start=1):
        missing = [f for f in OK_FIELDS if f not in record]
        if record.get("status", "ok") == "ok" and missing:
            raise InputError(f"{path}: record {number} (id {record['id']!r}) has no {missing[0]!r} field: not a record "
                             "specbench wrote; restore the file, or delete that line")
    return records


def predict_folder(folder: Path, cores_shared: bool | None = None) -> int:
    records = _records(folder)
    points = spec_points(records)
    if not points:
        raise InputError(f"{folder} has no spec points to predict: rerun the sweep with --mode edge,cloud,spec")
    summary = summarize(records)
    measured = {columns_key(row[c] for c in COLUMNS): row for _, row in summary.iterrows()}
    rows: list[dict] = []
    left_out: list[tuple[str, str]] = []  # (label, why) of points whose inputs the folder lacks
    for point in points:
        row = measured[columns_key(point.get(c) for c in COLUMNS)]
        try:
            predicted = predict_point(records, point, cores_shared)
        except InputError as e:
            if len(left_out) + 1 == len(points) and not rows:
                raise  # nothing to predict at all: the one line says what to rerun
            left_out.append((Point.from_row(point).label(), str(e)))
            continue
        rows.append({**{c: row[c] for c in COLUMNS}, "label": Point.from_row(point).label(),
                     "measured_tokens_per_s": row["tokens_per_s"],
                     "measured_tokens_per_s_ci_low": row["tokens_per_s_ci_low"],
                     "measured_tokens_per_s_ci_high": row["tokens_per_s_ci_high"],
                     "predicted_tokens_per_s": predicted, "error": predicted / row["tokens_per_s"] - 1})
    table = pd.DataFrame(rows)
    partial = folder / "predictions.csv.partial"  # renamed when whole: Ctrl-C never leaves half a table
    table.to_csv(partial, index=False)
    partial.replace(folder / "predictions.csv")
    errors = table["error"].abs()
    worst = table.loc[errors.idxmax()]
    print(table[["label", "measured_tokens_per_s", "predicted_tokens_per_s", "error"]].to_string(index=False))
    print(f"{len(table)} spec points: median |error| {errors.median():.1%}, largest {errors.max():.1%} "
          f"({worst['label']}: measured {worst['measured_tokens_per_s']:.3g}, predicted "
          f"{worst['predicted_tokens_per_s']:.3g} tok/s)")
    for label, why in left_out:  # e.g. a model drafter's point in a sweep with no edge-only decoding
        print(f"left out {label}: {why}")
    print(f"predictions: {folder / 'predictions.csv'}")
    return 0


def _numbers(flag: str, text: str, count: int | None = None, zero_last: bool = False) -> list[float]:
    """Positive finite numbers from a comma-separated flag value (the last may be 0 with `zero_last`:
    a flat verify curve); anything else is one ConfigError."""
    parts = [p.strip() for p in str(text).split(",")]
    try:
        values = [float(p) for p in parts]
    except ValueError:
        values = []
    allowed = [v > 0 or (zero_last and i == len(values) - 1 and v == 0) for i, v in enumerate(values)]
    if not values or not all(math.isfinite(v) for v in values) or not all(allowed) or (count and len(values) != count):
        shape = {None: "positive numbers", 1: "a positive number"}.get(
            count, f"{count} positive numbers separated by a comma")
        shape += " (the last may be 0)" if zero_last else ""
        raise ConfigError(f"{flag} {text!r}: need {shape}, e.g. {'40,2' if count == 2 else '30'}")
    return values


def predict_user(args: argparse.Namespace) -> int:
    edge_s = _numbers("--edge-ms-per-token", args.edge_ms_per_token, 1)[0] / 1e3
    a_ms, b_ms = _numbers("--verify-cost", args.verify_cost, 2, zero_last=True)
    rtts_s = [v / 1e3 for v in _numbers("--rtt-ms", args.rtt_ms)]
    rate_bps = _numbers("--bandwidth-mbps", args.bandwidth_mbps, 1)[0] * 1e6
    coloc_s = (_numbers("--colocated-ms-per-token", args.colocated_ms_per_token, 1)[0] / 1e3
               if args.colocated_ms_per_token is not None else None)
    records = [r for r in _records(args.acceptance_from) if r.get("status", "ok") == "ok"]
    by_k: dict[int, dict] = {}  # k -> the first spec point's acceptance group (its pair, prompts, policy)
    for point in spec_points(records):
        by_k.setdefault(int(point["k"]), point)
    if not by_k:
        raise InputError(f"{args.acceptance_from} has no spec points to take acceptance from: run a sweep with "
                         "--mode spec and the --k values you want to try")
    base: dict[str, Any] = {"draft_step_s": edge_s, "verify_a_s": a_ms / 1e3, "verify_b_s_per_token": b_ms / 1e3,
                            "colocated_draft_step_s": coloc_s}
    measured = {}  # k -> (acceptance, tokens per generation)
    for k, point in sorted(by_k.items()):
        group = acceptance_group(records, point)
        measured[k] = (acceptance(group), float(np.mean([r["new_tokens"] for r in group])))
    near = max(colocated(CostInputs(**base, acceptance=a, output_tokens=n)).tokens_per_s for a, n in measured.values())
    for rtt_s in rtts_s:
        rates = {}  # k -> (best split tok/s, drafting ahead pays)
        for k, (accept, tokens) in measured.items():
            up, down = escalation_bytes(k + 1, 0, 2)
            x = CostInputs(**base, acceptance=accept, output_tokens=tokens, link=Link(rtt_s, rate_bps, rate_bps),
                           up_bytes_per_call=up, down_bytes_per_call=down)
            plain = cloud_only(x).tokens_per_s
            seq, ahead = sequential(x).tokens_per_s, drafting_ahead(x).tokens_per_s
            rates[k] = (max(seq, ahead), ahead > seq)
        k = max(rates, key=lambda key: rates[key][0])
        rate, pays = rates[k]
        print(f"rtt {rtt_s * 1e3:g} ms: best k = {k}, {rate:.3g} tok/s; x{rate / plain:.2f} vs cloud-only "
              f"({plain:.3g} tok/s), x{rate / near:.2f} vs co-located speculation ({near:.3g} tok/s at its best k); "
              f"drafting ahead {'pays' if pays else 'does not pay'} at k = {k}")
    first = next(iter(by_k.values()))
    print(f"acceptance from {args.acceptance_from} (k = {', '.join(map(str, sorted(by_k)))}; "
          f"{Point.from_row(first).label()} and its like); edge and server on their own machines; prefill not counted")
    return 0

