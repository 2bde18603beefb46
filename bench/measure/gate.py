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
                 show a drop beyond the between-run margin with 95 % confidence (bench/derive/gate_verdict.py);
                 an undecided drop gets more repeats first. Absolute tokens/s are never gated.

The baseline (bench/baselines/<suite>/<machine class>.json) changes only through `--update`; its format and the
rules that judge it are bench/derive/gate_verdict.py's. Exit codes: 0 pass, 1 a metric moved (each printed
from -> to), 2 bad input (missing or malformed baseline).

The workload (and with it transformers, ~2.5 s to import) is imported only when a gate runs, not
on every `specbench` start.
"""
from __future__ import annotations

import contextlib
import dataclasses
import gc
import os
import statistics
import sys
from collections.abc import Callable

from bench.core.records import environment
from bench.derive import metrics
from bench.derive.gate_verdict import FORMAT, compare

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
