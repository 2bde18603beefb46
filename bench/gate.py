"""`specbench gate`: a performance and correctness regression gate on a fixed workload.

One process runs the workload (bench/workload.py) and measures two kinds of numbers:

  deterministic  per mode: sha256 of the output token ids, new tokens, text health; spec mode:
                 acceptance rate, cloud-call rate; invariants (spec == cloud, HF assisted == spec
                 under greedy). Compared exactly (hashes, counts, flags) or within `rate_abs`.
  timing         tokens/s RATIOS between modes measured in the same run (spec/cloud, edge/cloud,
                 spec/HF assisted), each the median over `repeats` interleaved passes, so machine
                 speed cancels. Higher is better; a ratio fails when it falls below
                 baseline * (1 - timing_rel). Absolute tokens/s are recorded, never gated.

The baseline (bench/baselines/<suite>.json) changes only through `--update`. Exit codes: 0 pass,
1 a metric moved (each printed from -> to), 2 bad input (missing or malformed baseline).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import json
import math
import os
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from bench import metrics
from specdec.errors import InputError

BASELINES = Path(__file__).parent / "baselines"
FORMAT = 1
RATIOS = {  # name -> (numerator mode, denominator mode)
    "spec_vs_cloud": ("spec", "cloud"),
    "edge_vs_cloud": ("edge", "cloud"),
    "spec_vs_hf_assisted": ("spec", "hf_assisted"),
}
REQUIRED = ("format", "suite", "workload", "deterministic", "timing")


@dataclass(frozen=True)
class Tolerance:
    rate_abs: float = field(metadata={"help": "largest |current - baseline| of a deterministic float"})
    timing_rel: float = field(metadata={"help": "a ratio fails below baseline * (1 - timing_rel)"})

    def __post_init__(self) -> None:
        if not self.rate_abs >= 0:
            raise ValueError(f"rate_abs must be >= 0, got {self.rate_abs}")
        if not 0 < self.timing_rel < 1:
            raise ValueError(f"timing_rel must be in (0, 1), got {self.timing_rel}")


# tiny: fp32 on a fixed in-process pair: bit-reproducible on one machine and torch version.
# real: bf16 is just as reproducible on one machine (same kernels, same thread count: repeated runs
#   gave identical hashes), so rates are exact there too; the baseline is per machine: another
#   CPU's bf16 kernels may flip near-tie argmaxes, which the hash reports (re-run --update there).
# timing_rel: the worst drop over repeated runs on unchanged code, with the 2 cores oversubscribed
#   by other processes, was < 8 %; 25 % leaves 3x margin (bench/baselines/README.md).
TOLERANCES = {"tiny": Tolerance(rate_abs=1e-9, timing_rel=0.25), "real": Tolerance(rate_abs=1e-9, timing_rel=0.25)}


@dataclass(frozen=True)
class Check:
    metric: str
    kind: str  # "workload" | "deterministic" | "timing"
    baseline: object
    current: object
    ok: bool
    rule: str  # the tolerance applied, in words
    note: str = ""

    def line(self) -> str:
        status = "ok  " if self.ok else "FAIL"
        moved = f"{show_value(self.baseline)} -> {show_value(self.current)}"
        if self.kind == "timing" and _finite(self.baseline) and _finite(self.current) and self.baseline:
            moved += f" ({self.current / self.baseline - 1:+.1%})"
        note = f"  [{self.note}]" if self.note else ""
        return f"{status} {self.kind:13} {self.metric:32} {moved}  ({self.rule}){note}"


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def show_value(value) -> str:
    if isinstance(value, str) and len(value) == 64:
        return value[:12]  # a sha256
    if isinstance(value, float):
        return f"{value:.6g}"
    return json.dumps(value) if not isinstance(value, str) else value


# --- measuring -------------------------------------------------------------------------------
def measure(workload, wrap=None, log: Callable[[str], object] = print) -> dict:
    """Run `workload` once untimed (its outputs are the deterministic ones), then `repeats` timed
    passes. Modes are interleaved per prompt, in an order rotated every prompt and repeat, so
    load from other processes (bursty, on a scale of seconds) hits every mode alike: interleaving
    whole passes instead left the tiny suite's ratios varying by +-30 % between runs here."""
    from bench.records import environment
    from bench.workload import HF_ASSISTED, MODES, Pair, mode_metrics

    load_start = os.getloadavg()[0]
    with Pair(workload, wrap, log=log) as pair:
        first = {mode: pair.run(mode) for mode in MODES}
        tokens_per_s: dict[str, list[float]] = {mode: [] for mode in MODES}
        identical = True
        with collector_paused():
            for r in range(workload.repeats):
                outputs: dict[str, list] = {mode: [] for mode in MODES}
                for i, text in enumerate(workload.prompts):
                    shift = (r + i) % len(MODES)
                    for mode in MODES[shift:] + MODES[:shift]:
                        outputs[mode].append(pair.generate(mode, text))
                for mode, done in outputs.items():
                    identical &= [o.tokens for o in done] == [o.tokens for o in first[mode]]
                    tokens_per_s[mode].append(mode_metrics(done)["tokens_per_s"])
    per_mode = {mode: mode_metrics(outputs) for mode, outputs in first.items()}
    deterministic = {}
    for mode, values in per_mode.items():
        deterministic.update({f"{mode}.{k}": v for k, v in values.items() if k != "tokens_per_s"})
    tokens = {mode: [o.tokens for o in outputs] for mode, outputs in first.items()}
    deterministic["spec_equals_cloud"] = tokens["spec"] == tokens["cloud"]
    deterministic[f"{HF_ASSISTED}_equals_spec"] = tokens[HF_ASSISTED] == tokens["spec"]
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
        "tokens_per_s": tokens_per_s,
        "tokens": tokens,
        "load_average_1min": [load_start, os.getloadavg()[0]],  # at start and end, for the reader
    }


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


# --- comparing -------------------------------------------------------------------------------
def compare(baseline: dict, current: dict, tolerance: Tolerance) -> list[Check]:
    """Every gated metric of `current` against `baseline`."""
    checks = []
    base_w, now_w = (json.loads(json.dumps(r["workload"])) for r in (baseline, current))  # tuples -> lists
    for key in sorted(base_w.keys() | now_w.keys()):
        if key != "repeats" and base_w.get(key) != now_w.get(key):
            checks.append(Check(f"workload.{key}", "workload", base_w.get(key), now_w.get(key), False, "must match",
                                "the workload changed: re-measure with --update"))
    for metric in sorted(baseline["deterministic"].keys() | current["deterministic"].keys()):
        base, now = baseline["deterministic"].get(metric), current["deterministic"].get(metric)
        if isinstance(base, float) and _finite(now):
            ok = abs(now - base) <= tolerance.rate_abs
            rule = f"±{tolerance.rate_abs:g}"
        else:
            ok, rule = base == now, "exact"
        checks.append(Check(metric, "deterministic", base, now, ok, rule))
    for metric in sorted(baseline["timing"].keys() | current["timing"].keys()):
        base, now = baseline["timing"].get(metric), current["timing"].get(metric)
        rule = f">= {1 - tolerance.timing_rel:.0%} of baseline"
        if not (_finite(base) and _finite(now)):
            checks.append(Check(metric, "timing", base, now, False, rule, "missing"))
            continue
        ok = now >= base * (1 - tolerance.timing_rel)
        note = "improved beyond tolerance: consider --update" if now > base * (1 + tolerance.timing_rel) else ""
        checks.append(Check(metric, "timing", base, now, ok, rule, note))
    return checks


def environment_notes(baseline: dict, current: dict) -> list[str]:
    """Differences that can legitimately move deterministic metrics (kernels, versions)."""
    keys = ("torch", "transformers", "machine", "cpu_count", "torch_threads")
    base, now = baseline.get("environment") or {}, current.get("environment") or {}
    return [f"{k}: baseline {base.get(k)!r}, now {now.get(k)!r}" for k in keys if k in base and base.get(k) != now.get(k)]


# --- baseline files --------------------------------------------------------------------------
def default_baseline(suite: str) -> Path:
    return BASELINES / f"{suite}.json"


def read_gate_file(path: Path) -> dict:
    """A gate JSON (baseline or saved run), validated; InputError naming the problem otherwise."""
    fix = "regenerate it with `specbench gate --update`"
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise InputError(f"no gate file at {path}: create the baseline with `specbench gate --update`") from None
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"cannot read gate file {path}: {e}") from None
    except json.JSONDecodeError as e:
        raise InputError(f"gate file {path} is not valid JSON ({e.msg}, line {e.lineno}): {fix}") from None
    if not isinstance(data, dict):
        raise InputError(f"gate file {path} must hold a JSON object: {fix}")
    if missing := [key for key in REQUIRED if key not in data]:
        raise InputError(f"gate file {path} is malformed (missing {', '.join(missing)}): {fix}")
    if data["format"] != FORMAT:
        raise InputError(f"gate file {path} has format {data['format']!r}, this version reads {FORMAT}: {fix}")
    if data["suite"] not in TOLERANCES:
        raise InputError(f"gate file {path} names unknown suite {data['suite']!r}: use one of {', '.join(TOLERANCES)}")
    for key in ("workload", "deterministic", "timing"):
        if not isinstance(data[key], dict):
            raise InputError(f"gate file {path} is malformed ({key!r} must be an object): {fix}")
    return data


def write_gate_file(path: Path, record: dict) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n")


def verdict(checks: list[Check]) -> tuple[bool, str]:
    failed = [c.metric for c in checks if not c.ok]
    if failed:
        names = ", ".join(failed[:4]) + (f" and {len(failed) - 4} more" if len(failed) > 4 else "")
        return False, f"gate FAILED: {len(failed)} of {len(checks)} checks moved ({names})"
    return True, f"gate passed: {len(checks)} checks"


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
    from bench.workload import CLOUD_ALIAS, EDGE_ALIAS, SUITES

    path = args.baseline or default_baseline(args.suite)
    baseline = None
    if not args.update:
        baseline = read_gate_file(path)  # bad input fails before minutes of measuring
        if baseline["suite"] != args.suite:
            raise InputError(f"baseline {path} is for suite {baseline['suite']!r}: pass --suite {baseline['suite']}")
    if args.suite == "real":
        from specdec.models.registry import is_fetched

        if not (is_fetched(EDGE_ALIAS) and is_fetched(CLOUD_ALIAS)):
            raise InputError(f"the real suite needs the model pair: run `specbench models fetch {EDGE_ALIAS} {CLOUD_ALIAS}`")
    _quiet_transformers()
    workload = SUITES[args.suite]()
    _say(f"gate: measuring the {args.suite} suite ({len(workload.prompts)} prompts x {workload.max_new_tokens} tokens, "
         f"{workload.repeats} repeats) ...")
    current = measure(workload, wrap=wrap, log=_say)
    if args.save:
        write_gate_file(args.save, current)
    print(timing_summary(current))
    if args.update:
        write_gate_file(path, current)
        print(f"baseline written: {path}")
        return 0
    checks = compare(baseline, current, TOLERANCES[args.suite])
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
    return f"tokens/s (median): {rates}\nratios (median [min-max] over repeats): {ratios}"


def _quiet_transformers() -> None:
    """Assisted generation warns per call about a deprecated config path inside transformers."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
