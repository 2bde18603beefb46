"""`specbench compare BASELINE CURRENT`: the command line of bench/read/compare.py."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench.derive.gate_verdict import show_value
from bench.read.compare import compare_paths, gate_verdict, machine_note, plot, write_html


def add_compare_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("compare", help="compare two results folders or two gate JSON files (HTML + PNG, verdict)")
    p.add_argument("baseline", type=Path, help="results directory (run or sweep) or gate JSON")
    p.add_argument("current", type=Path, help="same kind as BASELINE")
    p.add_argument("--out", type=Path, help="output folder (default: reports/compare-<baseline>-vs-<current>)")
    p.set_defaults(func=cmd_compare)
    return p


def cmd_compare(args: argparse.Namespace) -> int:
    rows = compare_paths(args.baseline, args.current)
    out = args.out or Path("reports") / f"compare-{_name(args.baseline)}-vs-{_name(args.current)}"
    out.mkdir(parents=True, exist_ok=True)
    passed, line = gate_verdict(rows)
    note = machine_note(args.baseline, args.current)
    plot(rows, out / "compare.png")
    write_html(rows, args.baseline, args.current, line, passed, out / "compare.html", note)
    if note:
        print(note)
    for r in rows:
        if not r.ok:
            print(f"FAIL {r.point}: {r.metric} {show_value(r.baseline)} -> {show_value(r.current)} ({r.rule})")
    print(line)
    print(f"report: {out / 'compare.html'}", file=sys.stderr)
    return 0 if passed else 1


def _name(path: Path) -> str:
    return (path.stem if path.is_file() else path.resolve().name) or "root"
