"""`specbench run`: one configuration over a prompt set (bench/measure/run.py)."""
from __future__ import annotations

import argparse
import math
import sys

from bench.commands.options import add_run_options, engine_from_args, inputs_from_args
from bench.derive import metrics
from bench.measure.run import run
from specdec.settings import Mode


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def add_run_parser(sub) -> None:
    add_run_options(sub.add_parser("run", help="generate for a prompt set with one configuration"))


def cmd_run(args: argparse.Namespace) -> int:
    engine, inputs = engine_from_args(args, log=_say), inputs_from_args(args)
    rows = run(engine, inputs.prompts, args.out, limit=inputs.limit, max_audio_s=inputs.max_audio_s, turns=inputs.turns)
    ok = [r for r in rows if r["status"] == "ok"]
    if ok:
        t = metrics.totals(ok)
        line = (f"{len(ok)} prompts, {t['new_tokens']} tokens in {t['latency_s']:.1f} s "
                f"({metrics.tokens_per_s(t):.1f} tok/s)")
        if args.mode == Mode.SPEC:
            rate = metrics.acceptance_rate(t)
            line += (f", acceptance {'n/a' if math.isnan(rate) else f'{rate:.2f}'}, "
                     f"cloud calls {t['cloud_calls']}/{t['cycles']} cycles")
        _say(line)
    else:
        _say(f"nothing to do: every prompt already has a result in {args.out}")
    _say(f"results: {args.out / 'results.jsonl'}")
    return 0
