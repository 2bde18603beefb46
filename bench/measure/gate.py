"""`specbench gate`: a performance and correctness regression gate on a fixed workload.

One process runs the workload (bench/measure/workload.py) and measures two kinds of numbers:

  deterministic  per mode: sha256 of the output token ids, new tokens, text health; spec mode:
                 acceptance rate, cloud-call rate; invariants (spec == cloud, HF assisted == spec,
                 transformers' greedy == our edge and cloud modes). Compared exactly (hashes,
                 counts, flags) or within `rate_abs`.
  timing         tokens/s RATIOS between modes measured in the same run, each per interleaved
                 repeat, so machine speed cancels: spec/cloud, edge/cloud, spec/HF assisted, and
                 edge/HF greedy and cloud/HF greedy, transformers' own loop on the same model as a
                 control that none of our code touches (a slower forward of ours moves them even
                 when it slows every mode alike). Higher is better. A ratio fails when its repeats
                 show a drop beyond the between-run margin with 95 % confidence (bench/derive/verdict.py);
                 an undecided drop gets more repeats first. Absolute tokens/s are never gated.

The baseline (bench/baselines/<suite>.json) changes only through `--update`; its format and the
rules that judge it are bench/derive/verdict.py's. Exit codes: 0 pass, 1 a metric moved (each printed
from -> to), 2 bad input (missing or malformed baseline).

The workload (and with it transformers, ~2.5 s to import) is imported only when a gate runs, not
on every `specbench` start.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import os
import statistics
import sys
from pathlib import Path
from typing import Callable

from bench.derive import metrics
from bench.core.folder import writable_file
from bench.core.records import environment
from bench.derive.verdict import (
    FORMAT,
    TOLERANCES,
    compare,
    default_baseline,
    environment_notes,
    read_gate_file,
    verdict,
    write_gate_file,
)
from specdec.errors import InputError
from specdec.models.registry import is_fetched

MORE_REPEATS = 3  # at most this many times the workload's repeats, when a drop is undecided
RATIOS = {  # name -> (numerator mode, denominator mode)
    "spec_vs_cloud": ("spec", "cloud"),
    "edge_vs_cloud": ("edge", "cloud"),
    "spec_vs_hf_assisted": ("spec", "hf_assisted"),
    "spec_vs_hf_assisted_defaults": ("spec", "hf_assisted_defaults"),
    "edge_vs_hf_greedy": ("edge", "hf_greedy_edge"),
    "cloud_vs_hf_greedy": ("cloud", "hf_greedy_cloud"),
}


# --- measuring -------------------------------------------------------------------------------
def measure(workload, wrap=None, log: Callable[[str], object] = print,
            more: Callable[[dict], bool] | None = None, max_repeats: int | None = None) -> dict:
    """Run `workload` once untimed (its outputs are the deterministic ones), then `repeats` timed
    passes. Modes are interleaved per prompt, in an order rotated every prompt and repeat, so
    load from other processes (bursty, on a scale of seconds) hits every mode alike: interleaving
    whole passes instead left the tiny suite's ratios varying by +-30 % between runs here.
    While `more(record)` says the record cannot decide yet, another `repeats` passes are added,
    up to `max_repeats` in all."""
    from bench.measure.workload import GATE_MODES, Pair

    load_start = os.getloadavg()[0]
    with Pair(workload, wrap, log=log) as pair:
        first = {mode: pair.run(mode) for mode in GATE_MODES}
        tokens_per_s: dict[str, list[float]] = {mode: [] for mode in GATE_MODES}
        identical = [True]
        _timed_passes(pair, first, tokens_per_s, identical, workload.repeats)
        record = _record(workload, first, tokens_per_s, identical[0], load_start)
        while more is not None and more(record) and len(tokens_per_s["spec"]) < (max_repeats or 0):
            log(f"gate: a ratio dropped past the margin but {len(tokens_per_s['spec'])} repeats cannot confirm it: "
                f"{workload.repeats} more")
            _timed_passes(pair, first, tokens_per_s, identical, workload.repeats)
            record = _record(workload, first, tokens_per_s, identical[0], load_start)
    return record


def _timed_passes(pair, first: dict, tokens_per_s: dict, identical: list, repeats: int) -> None:
    """`repeats` timed passes, appending each mode's tokens/s per pass."""
    modes = tuple(first)
    with collector_paused():
        for _ in range(repeats):
            r = len(tokens_per_s[modes[0]])
            outputs: dict[str, list] = {mode: [] for mode in modes}
            for i, text in enumerate(pair.workload.prompts):
                shift = (r + i) % len(modes)
                for mode in modes[shift:] + modes[:shift]:
                    outputs[mode].append(pair.generate(mode, text))
            for mode, done in outputs.items():
                identical[0] &= [o.tokens for o in done] == [o.tokens for o in first[mode]]
                tokens_per_s[mode].append(metrics.tokens_per_s(metrics.totals(o.counts() for o in done)))


def _record(workload, first: dict, tokens_per_s: dict, identical: bool, load_start: float) -> dict:
    from bench.measure.workload import HF_ASSISTED, HF_ASSISTED_DEFAULTS, HF_GREEDY, mode_metrics

    per_mode = {mode: mode_metrics(outputs) for mode, outputs in first.items()}
    deterministic = {}
    for mode, values in per_mode.items():
        deterministic.update({f"{mode}.{k}": v for k, v in values.items() if k != "tokens_per_s"})
    tokens = {mode: [o.tokens for o in outputs] for mode, outputs in first.items()}
    deterministic["spec_equals_cloud"] = tokens["spec"] == tokens["cloud"]
    deterministic[f"{HF_ASSISTED}_equals_spec"] = tokens[HF_ASSISTED] == tokens["spec"]
    deterministic[f"{HF_ASSISTED_DEFAULTS}_equals_spec"] = tokens[HF_ASSISTED_DEFAULTS] == tokens["spec"]
    for mode, role in HF_GREEDY.items():  # our plain decoding loop is transformers' greedy, token for token
        deterministic[f"{mode}_equals_{role}"] = tokens[mode] == tokens[role]
    deterministic["repeats_identical"] = identical
    repeats = {name: [metrics.speedup(a, b) for a, b in zip(tokens_per_s[num], tokens_per_s[den])]
               for name, (num, den) in RATIOS.items()}
    return {
        "format": FORMAT,
        "suite": workload.suite,
        "workload": dataclasses.asdict(workload),
        "environment": environment(),
        "deterministic": deterministic,
        "timing": {name: statistics.median(values) for name, values in repeats.items()},
        "timing_repeats": repeats,
        "tokens_per_s": {mode: list(values) for mode, values in tokens_per_s.items()},
        "tokens": tokens,
        "load_average_1min": [load_start, os.getloadavg()[0]],  # at start and end, for the reader
    }


def judge(baseline: dict, workload, tolerance, wrap=None, log: Callable[[str], object] = print,
          max_repeats: int | None = None) -> tuple[dict, list]:
    """Measure `workload` and judge it against `baseline`: (the run's record, its checks). A ratio
    that dropped past the margin without the confidence to say so gets more repeats, up to
    `max_repeats` (default 3x the workload's), before the verdict."""
    def undecided(record: dict) -> bool:
        return any(c.undecided for c in compare(baseline, record, tolerance) if c.kind == "timing")

    current = measure(workload, wrap=wrap, log=log, more=undecided,
                      max_repeats=max_repeats or MORE_REPEATS * workload.repeats)
    return current, compare(baseline, current, tolerance)


@contextlib.contextmanager
def collector_paused():
    """Timed passes run without Python's cyclic GC (collected once before): its pauses land at
    random points and would be timed as part of whichever mode they hit. Reference counting
    still frees everything acyclic, so memory stays flat over a few minutes of passes."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


# --- CLI -------------------------------------------------------------------------------------
def add_gate_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("gate", help="regression gate: deterministic metrics and timing ratios vs a baseline")
    p.add_argument("--suite", choices=sorted(TOLERANCES), default="tiny",
                   help="tiny: in-process random pair, fp32 (seconds); real: the Qwen2.5-Coder pair, bf16 (minutes)")
    p.add_argument("--baseline", type=Path, help="baseline JSON (default: bench/baselines/<suite>.json)")
    p.add_argument("--update", action="store_true", help="measure and rewrite the baseline (the only way it changes)")
    p.add_argument("--save", type=Path, help="also write this run's measurements here (for `specbench compare`)")
    p.add_argument("--verbose", action="store_true", help="print every check (default: timing checks and failures)")
    p.set_defaults(func=cmd_gate)
    return p


def cmd_gate(args: argparse.Namespace, wrap=None) -> int:
    from bench.measure.workload import CLOUD_ALIAS, EDGE_ALIAS, SUITES

    path = args.baseline or default_baseline(args.suite)
    if args.save:
        writable_file(args.save)  # before minutes of measuring, not after
    baseline = None
    if not args.update:
        baseline = read_gate_file(path)  # bad input fails before minutes of measuring
        if baseline["suite"] != args.suite:
            raise InputError(f"baseline {path} is for suite {baseline['suite']!r}: pass --suite {baseline['suite']}")
    if args.suite == "real":
        if not (is_fetched(EDGE_ALIAS) and is_fetched(CLOUD_ALIAS)):
            raise InputError(f"the real suite needs the model pair: run `specbench models fetch {EDGE_ALIAS} {CLOUD_ALIAS}`")
    _quiet_transformers()
    workload = SUITES[args.suite]()
    _say(f"gate: measuring the {args.suite} suite ({len(workload.prompts)} prompts x {workload.max_new_tokens} tokens, "
         f"{workload.repeats} repeats) ...")
    if args.update:
        current = measure(workload, wrap=wrap, log=_say)
    else:
        current, checks = judge(baseline, workload, TOLERANCES[args.suite], wrap=wrap, log=_say)
    if args.save:
        write_gate_file(args.save, current)
    print(timing_summary(current))
    if args.update:
        write_gate_file(path, current)
        print(f"baseline written: {path}")
        return 0
    for check in checks:
        if args.verbose or not check.ok or check.kind == "timing":
            print(check.line())
    for note in environment_notes(baseline, current):
        print(f"note: environment differs from the baseline's ({note})")
    if (load := max(current["load_average_1min"])) > (os.cpu_count() or 1):
        print(f"note: load average {load:.1f} on {os.cpu_count()} cores during the run: other processes may have moved the timing ratios")
    ok, line = verdict(checks)
    print(line)
    return 0 if ok else 1


def timing_summary(record: dict) -> str:
    rates = ", ".join(f"{mode} {statistics.median(v):.1f}" for mode, v in record["tokens_per_s"].items())
    ratios = ", ".join(f"{name} {record['timing'][name]:.3f} [{min(v):.3f}-{max(v):.3f}]"
                       for name, v in record["timing_repeats"].items())
    repeats = len(next(iter(record["timing_repeats"].values()), []))
    return f"tokens/s (median): {rates}\nratios (median [min-max] over {repeats} repeats): {ratios}"


def _quiet_transformers() -> None:
    """Assisted generation warns per call about a deprecated config path inside transformers."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
