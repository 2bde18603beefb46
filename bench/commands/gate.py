"""`specbench gate`: the command line of the regression gate (bench/measure/gate.py measures and
judges; bench/derive/gate_verdict.py holds the rules). The workload (and with it transformers, ~2.5 s to
import) is imported only when a gate runs, not on every `specbench` start."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from bench.core.folder import writable_file
from bench.derive.gate_verdict import (
    TOLERANCES,
    Suite,
    baseline_path,
    choose_baseline,
    environment_notes,
    machine_of,
    other_machine,
    read_gate_file,
    verdict,
    write_gate_file,
)
from bench.measure.gate import _quiet_transformers, judge, measure, timing_summary
from specdec.errors import InputError
from specdec.machine import describe, fingerprint
from specdec.models.registry import is_fetched
from specdec.settings import choices, parse


def add_gate_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("gate", help="regression gate: deterministic metrics and timing ratios vs a baseline")
    p.add_argument("--suite", choices=sorted(choices(Suite)), default=Suite.TINY,
                   help="tiny: in-process random pair, fp32 (seconds); real: the Qwen2.5-Coder pair, bf16 (minutes)")
    p.add_argument("--baseline", type=Path,
                   help="baseline JSON (default: bench/baselines/<suite>/<this machine's class>.json, else another "
                        "class's for the deterministic metrics alone)")
    p.add_argument("--update", action="store_true",
                   help="measure and rewrite the baseline of this machine's class (the only way it changes)")
    p.add_argument("--save", type=Path, help="also write this run's measurements here (for `specbench compare`)")
    p.add_argument("--verbose", action="store_true", help="print every check (default: judged timing checks and failures)")
    p.set_defaults(func=cmd_gate)
    return p


def cmd_gate(args: argparse.Namespace, wrap=None) -> int:
    from bench.measure.workload import CLOUD_ALIAS, EDGE_ALIAS, SUITES

    suite = parse(Suite, args.suite, "suite")  # argparse checked the word: a Suite from here on
    here = fingerprint()
    path, missing = args.baseline, None
    if path is None and not args.update:
        choice = choose_baseline(suite, here["machine_class"])
        path, missing = choice.path, None if choice.own_class else no_baseline_line(suite, here)
    if args.save:
        writable_file(args.save)  # before minutes of measuring, not after
    baseline = None
    if not args.update:
        baseline = read_gate_file(path)  # bad input fails before minutes of measuring
        if baseline["suite"] != suite:
            raise InputError(f"baseline {path} is for suite {baseline['suite']!r}: pass --suite {baseline['suite']}")
    if suite == Suite.REAL:
        if not (is_fetched(EDGE_ALIAS) and is_fetched(CLOUD_ALIAS)):
            raise InputError(f"the real suite needs the model pair: run `specbench models fetch {EDGE_ALIAS} {CLOUD_ALIAS}`")
    _quiet_transformers()
    workload = SUITES[suite]()
    _say(f"gate: measuring the {suite} suite ({len(workload.prompts)} prompts x {workload.max_new_tokens} tokens, "
         f"{workload.repeats} repeats) ...")
    if baseline is None:  # --update
        current = measure(workload, wrap=wrap, log=_say)
    else:
        current, checks = judge(baseline, workload, TOLERANCES[suite], wrap=wrap, log=_say)
    if args.save:
        write_gate_file(args.save, current)
    print(timing_summary(current))
    if baseline is None:  # --update
        # named after the machine the record carries (environment.fingerprint): never another class's file
        path = path or baseline_path(suite, (machine_of(current) or here)["machine_class"])
        write_gate_file(path, current)
        print(f"baseline written: {path}")
        return 0
    if other := other_machine(machine_of(baseline), machine_of(current)):
        print(missing or f"note: timing ratios not judged: {other} (a baseline measured here, `--update`, judges them)")
    for check in checks:
        if args.verbose or not check.ok or (check.kind == "timing" and check.judged):
            print(check.line())
    for note in environment_notes(baseline, current):
        print(f"note: environment differs from the baseline's ({note})")
    if (load := max(current["load_average_1min"])) > (os.cpu_count() or 1):
        print(f"note: load average {load:.1f} on {os.cpu_count()} cores during the run: "
              "other processes may have moved the timing ratios")
    ok, line = verdict(checks)
    print(line)
    return 0 if ok else 1


def no_baseline_line(suite: str, here: dict) -> str:
    """The one line a gate without a baseline of this machine's class prints: which class, and the fix."""
    return (f"note: timing not judged: no {suite} baseline for {describe(here)}; "
            f"add one: specbench gate --suite {suite} --update")


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
