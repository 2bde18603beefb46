"""The `specbench report` subcommand, for bench/cli.py to register."""
from __future__ import annotations

import argparse
from pathlib import Path

from bench.read.report.build import build_report
from specdec.errors import InputError


def add_report_parser(subparsers) -> argparse.ArgumentParser:
    """Register `report` on the `specbench` subparsers; the parser's `func` default is cmd_report."""
    p = subparsers.add_parser(
        "report", help="HTML report (Pareto fronts, recommended settings, heat maps) from a results directory",
        description="Read a `specbench sweep` or `specbench run` results directory and write index.html with its "
                    "figures beside it. Only reads results; measures nothing.",
    )
    p.add_argument("results", type=Path, metavar="RESULTS_DIR", help="the --out folder of a sweep or run")
    p.add_argument("--out", type=Path, help="report folder (default: reports/<results dir name>)")
    p.add_argument("--profile", type=Path, help="a `specbench profile` folder to link (found automatically when "
                                                "RESULTS_DIR/profile or profiles/<results dir name> exists)")
    p.add_argument("--embed", action="store_true", help="put the figures inside index.html (one file to mail)")
    p.add_argument("--samples", type=int, default=3, help="prompts per set shown side by side (default 3)")
    p.set_defaults(func=cmd_report)
    return p


def cmd_report(args: argparse.Namespace) -> int:
    if args.samples < 0:
        raise InputError(f"--samples must be >= 0, got {args.samples}")
    index = build_report(args.results, args.out, profile=args.profile, embed=args.embed, samples_per_set=args.samples)
    print(index)
    return 0
