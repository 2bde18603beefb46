"""`specbench sweep`: a grid of settings x prompt sets under edge caps (bench/measure/sweep/sweep.py)."""
from __future__ import annotations

import argparse
import sys

from bench.commands.options import add_sweep_options, sweep_from_args
from bench.core.records import read_records
from bench.derive.scores import read_scores
from bench.derive.summary import summarize, terminal_table
from bench.measure.runtime_auto import AutoRuntimes
from bench.measure.sweep.sweep import CRASHES, crashed_out, run_sweep


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def add_sweep_parser(sub) -> None:
    add_sweep_options(sub.add_parser("sweep", help="a grid of settings x prompt sets, resumable, under edge caps"))


def cmd_sweep(args: argparse.Namespace) -> int:
    """Exit 0 when the folder holds a measurement (a record `ok`), even if some points failed, crashed
    out or went over the memory cap: those are results too, recorded and listed. Exit 1 when nothing
    was measured ok (every point failed, crashed or went over the cap): a script should not go on to
    a report of nothing."""
    chooser = AutoRuntimes()  # `auto` runtimes: chosen from this machine's calibration, measured once
    config = sweep_from_args(args, chooser)
    for choice in chooser.choices:
        _say(f"{choice.role} runtime: {', '.join(choice.runtimes)} ({choice.reason})")
    counts = run_sweep(config, args.out, machine=chooser.record())
    rows = read_records(args.out / "results.jsonl")
    summary = summarize(rows, read_scores(args.out))
    _say(", ".join(f"{n} {status}" for status, n in sorted(counts.items())))
    for label, line in crashed_out(rows).items():  # a native crash in a runtime: the point failed, not rerun
        _say(f"failed after {CRASHES} crashes: {label}: {line}")
    if not summary.empty:
        _say(terminal_table(summary))
        _say("[low-high]: 95 % interval over prompts (bootstrap); overlapping intervals do not separate two points")
    _say(f"summary: {args.out / 'summary.csv'}")
    if not counts.get("ok"):
        _say("nothing was measured ok: see the errors in results.jsonl")
        return 1
    return 0
