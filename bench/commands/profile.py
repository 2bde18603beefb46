"""`specbench profile`: the command line of bench/measure/profiling.py (where the time of one
`specbench run` goes)."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bench.commands.options import add_run_options, engine_from_args, inputs_from_args, run_argv
from bench.core.prompts import load_prompts
from bench.core.records import ResultsFile, environment
from bench.measure.profiling import py_spy_passes, time_split, torch_ops
from bench.measure.run import run
from specdec.errors import InputError


def add_profile_parser(subparsers) -> argparse.ArgumentParser:
    """Register `profile` on the `specbench` subparsers; the parser's `func` default is cmd_profile."""
    p = subparsers.add_parser(
        "profile", help="profile one run: py-spy flame graph + speedscope, torch.profiler operator table",
        description="Run `specbench run` under py-spy and the engine under torch.profiler. --out is the profile "
                    "folder (e.g. profiles/NAME); the run's results go to OUT/run.",
    )
    add_run_options(p)
    p.add_argument("--native", action="store_true", help="py-spy: also sample C/C++ frames (torch kernels)")
    p.add_argument("--rate", type=int, default=100, help="py-spy samples per second (default 100)")
    p.add_argument("--op-prompts", type=int, default=1, help="prompts generated under torch.profiler (default 1)")
    p.add_argument("--no-py-spy", action="store_true", help="skip the py-spy passes (torch.profiler table only)")
    p.set_defaults(func=cmd_profile)
    return p


def cmd_profile(args: argparse.Namespace) -> int:
    if args.op_prompts < 1:
        raise InputError(f"--op-prompts must be >= 1, got {args.op_prompts}")
    if args.rate < 1:
        raise InputError(f"--rate must be >= 1 sample per second, got {args.rate}")

    def say(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    engine, inputs = engine_from_args(args, log=say), inputs_from_args(args)  # validated before anything runs
    records = load_prompts(inputs.prompts)[: inputs.limit]
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)

    py_spy = py_spy_passes(args, out, lambda run_dir: run_argv(args, run_dir), log=say)
    if py_spy["status"] != "ok":
        say(f"py-spy {py_spy['status']}: {py_spy['reason']}; going on with the run and the torch.profiler table")
    run(engine, args.prompts, out / "run", progress=False, limit=args.limit)  # whatever py-spy's pass left undone
    say(f"torch.profiler: {min(args.op_prompts, len(records))} prompt(s) after one warm-up")
    ops = torch_ops(engine, records[: args.op_prompts], out)

    split = time_split(ResultsFile(out / "run" / "results.jsonl").read())
    options = [*(["--native"] if args.native else []), "--rate", str(args.rate), "--op-prompts", str(args.op_prompts),
               *(["--no-py-spy"] if args.no_py_spy else [])]
    status = {"command": ["specbench", "profile", *run_argv(args, out), *options], "py_spy": py_spy,
              "torch_profiler": {"prompts": [r.id for r in records[: args.op_prompts]], "warmup_prompts": 1},
              "time_split": split, "environment": environment()}
    (out / "profile.json").write_text(json.dumps(status, indent=2, ensure_ascii=False), encoding="utf-8")

    for name, what in (("flamegraph.svg", "flame graph (open in a browser)"),
                       ("speedscope.json", "speedscope (https://www.speedscope.app, or: npx speedscope FILE)"),
                       ("torch_ops.csv", "torch operators by self CPU time"),
                       ("run/results.jsonl", "the run's results")):
        if (out / name).exists():
            say(f"  {out / name}: {what}")
    if split.get("latency_s"):
        say(f"time split: edge {split.get('edge_fraction', 0):.0%}, cloud {split.get('cloud_fraction', 0):.0%}, "
            f"engine overhead {split.get('overhead_fraction', 0):.0%}; top op {ops.iloc[0]['op']} "
            f"({ops.iloc[0]['self_cpu_percent']:.0f}% of self CPU)")
    print(out)
    return 0
