"""`specbench sweep`: a grid of settings x prompt sets under edge caps (bench/measure/sweep.py)."""
from __future__ import annotations

import argparse
import sys

from bench.commands.options import add_sweep_options, sweep_from_args
from bench.core.records import read_records
from bench.derive.scores import read_scores
from bench.derive.summary import summarize, terminal_table
from bench.measure.sweep import run_sweep


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def add_sweep_parser(sub) -> None:
    add_sweep_options(sub.add_parser("sweep", help="a grid of settings x prompt sets, resumable, under edge caps"))


def cmd_sweep(args: argparse.Namespace) -> int:
    counts = run_sweep(sweep_from_args(args), args.out)
    summary = summarize(read_records(args.out / "results.jsonl"), read_scores(args.out))
    _say(", ".join(f"{n} {status}" for status, n in sorted(counts.items())))
    if not summary.empty:
        _say(terminal_table(summary))
        _say("[low-high]: 95 % interval over prompts (bootstrap); overlapping intervals do not separate two points")
    _say(f"summary: {args.out / 'summary.csv'}")
    return 0
