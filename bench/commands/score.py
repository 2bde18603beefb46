"""`specbench score`: the cloud's NLL of every output in a results folder (bench/measure/nll.py)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench.core.folder import writer
from bench.core.records import read_records
from bench.derive.scores import SCORES, read_scores
from bench.derive.summary import summarize
from bench.measure.nll import score
from specdec.backends.base import DTYPES
from specdec.errors import InputError


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def add_score_parser(sub) -> None:
    p = sub.add_parser("score", help="cloud NLL of every output in a results folder (resumable); "
                                     "summaries and reports then show it")
    p.add_argument("results", type=Path, help="the --out folder of `specbench run` or `sweep`")
    p.add_argument("--model", help="scoring model (default: the results' cloud model)")
    p.add_argument("--dtype", choices=tuple(DTYPES), default="float32")


def cmd_score(args: argparse.Namespace) -> int:
    if not (args.results / "results.jsonl").is_file():  # before the lock, which would make the folder
        raise InputError(f"{args.results / 'results.jsonl'} not found: score a folder written by `specbench run` or "
                         "`sweep`")
    with writer(args.results):  # appends nll.jsonl, rewrites summary.csv: not while a sweep writes the folder
        counts = score(args.results, args.model, args.dtype, log=_say)
        _say(f"scored {counts['scored']} outputs ({counts['already']} already scored, {counts['skipped']} audio "
             f"prompts skipped): {args.results / SCORES}")
        summary_csv = args.results / "summary.csv"
        if summary_csv.exists():  # a sweep folder: its summary gains the cloud_nll column
            summarize(read_records(args.results / "results.jsonl"), read_scores(args.results)).to_csv(summary_csv,
                                                                                                     index=False)
            _say(f"summary: {summary_csv}")
    return 0
