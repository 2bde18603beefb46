"""The `specbench` command line. Bad input: one line naming the problem and the fix, exit 2."""
from __future__ import annotations

import argparse
import math
import signal
import sys
import threading
from pathlib import Path

from bench.derive import metrics
from bench.read.compare import add_compare_parser, cmd_compare
from bench.commands.deploy import add_fleet_parser, add_link_parser, add_serve_parser, cmd_fleet, cmd_link, cmd_serve
from bench.measure.gate import add_gate_parser, cmd_gate
from bench.measure.nll import score
from bench.core.folder import os_error_line, writer
from bench.commands.options import add_run_options, add_sweep_options, engine_from_args, inputs_from_args, sweep_from_args
from bench.measure.profiling import add_profile_parser, cmd_profile
from bench.core.records import read_records
from bench.read.report.cli import add_report_parser, cmd_report
from bench.derive.scores import SCORES, read_scores
from bench.measure.run import run
from bench.derive.summary import summarize, terminal_table
from bench.measure.sweep import run_sweep
from specdec.backends.base import DTYPES
from specdec.errors import InputError, ModelError, SpecdecError
from specdec.models import fetch, registry


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def cmd_run(args: argparse.Namespace) -> int:
    engine, inputs = engine_from_args(args, log=_say), inputs_from_args(args)
    rows = run(engine, inputs.prompts, args.out, limit=inputs.limit, max_audio_s=inputs.max_audio_s)
    ok = [r for r in rows if r["status"] == "ok"]
    if ok:
        t = metrics.totals(ok)
        line = (f"{len(ok)} prompts, {t['new_tokens']} tokens in {t['latency_s']:.1f} s "
                f"({metrics.tokens_per_s(t):.1f} tok/s)")
        if args.mode == "spec":
            rate = metrics.acceptance_rate(t)
            line += (f", acceptance {'n/a' if math.isnan(rate) else f'{rate:.2f}'}, "
                     f"cloud calls {t['cloud_calls']}/{t['cycles']} cycles")
        _say(line)
    else:
        _say(f"nothing to do: every prompt already has a result in {args.out}")
    _say(f"results: {args.out / 'results.jsonl'}")
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    counts = run_sweep(sweep_from_args(args), args.out)
    summary = summarize(read_records(args.out / "results.jsonl"), read_scores(args.out))
    _say(", ".join(f"{n} {status}" for status, n in sorted(counts.items())))
    if not summary.empty:
        _say(terminal_table(summary))
        _say("[low-high]: 95 % interval over prompts (bootstrap); overlapping intervals do not separate two points")
    _say(f"summary: {args.out / 'summary.csv'}")
    return 0


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


def cmd_models(args: argparse.Namespace) -> int:
    if args.models_command == "list":
        for entry in registry.list_models():
            state = registry.state(entry.alias)
            source = f"derived: {entry.load_name}" if getattr(entry, "base", None) else entry.upstream
            print(f"{entry.alias:24} {entry.size / 1e6:8.0f} MB  {state:12} {source}  ({entry.license})")
        return 0
    if args.models_command == "verify":
        return cmd_verify(args.aliases)
    for alias in args.aliases or [e.alias for e in registry.list_models()]:
        registry.get(alias)
        print(fetch.fetch(alias, log=_say))
    return 0


def cmd_verify(aliases: list[str]) -> int:
    """Sizes and sha256 of every fetched model's files against those recorded when it was converted."""
    damaged = []
    for alias in aliases or [e.alias for e in registry.list_models() if not e.base]:
        entry = registry.get(alias)
        if registry.state(alias) == "not fetched":
            print(f"{alias:24} not fetched")
            continue
        problem = registry.damage(alias, hashes=True)
        recorded = "files" in (registry.read_marker(registry.model_dir(alias)) or {})
        ok = "ok" if recorded else "ok (safetensors headers only: fetched before sizes and hashes were recorded)"
        print(f"{alias:24} {'damaged: ' + problem if problem else ok}", flush=True)
        if problem:
            damaged.append(entry.base or alias)
    if damaged:
        raise ModelError(f"{len(damaged)} cached model(s) damaged ({', '.join(damaged)}): run `specbench models fetch "
                         f"{' '.join(damaged)}` to fetch them again")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specbench", description="edge-cloud speculative decoding: run, measure, compare")
    sub = parser.add_subparsers(dest="command", required=True)
    add_run_options(sub.add_parser("run", help="generate for a prompt set with one configuration"))
    add_sweep_options(sub.add_parser("sweep", help="a grid of settings x prompt sets, resumable, under edge caps"))
    add_report_parser(sub)
    add_profile_parser(sub)
    add_gate_parser(sub)
    add_compare_parser(sub)
    add_score_parser(sub)
    add_serve_parser(sub)
    add_link_parser(sub)
    add_fleet_parser(sub)
    models = sub.add_parser("models", help="the offline model registry")
    models_sub = models.add_subparsers(dest="models_command", required=True)
    models_sub.add_parser("list", help="registry aliases and whether they are fetched (and whole: file sizes)")
    verify = models_sub.add_parser("verify", help="check fetched models' files against the sizes and sha256 recorded "
                                                  "when they were converted (all fetched aliases by default)")
    verify.add_argument("aliases", nargs="*")
    fetch = models_sub.add_parser("fetch", help="install, verify and convert pinned weights (all aliases by default)")
    fetch.add_argument("aliases", nargs="*")
    return parser


COMMANDS = {"run": cmd_run, "sweep": cmd_sweep, "models": cmd_models, "report": cmd_report, "profile": cmd_profile,
            "gate": cmd_gate, "compare": cmd_compare, "score": cmd_score,
            "serve": cmd_serve, "link": cmd_link, "fleet": cmd_fleet}


def _stop(signum, frame) -> None:
    """SIGTERM stops a command as Ctrl-C does (a sweep stops its workers on the way out); a
    second SIGTERM kills at once."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _stop) if in_main_thread else None
    try:
        return COMMANDS[args.command](args)
    except SpecdecError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # the filesystem at the edges: an --out that is a file, read-only, full, not ours
        print(f"error: {os_error_line(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: results written so far are kept; rerun the same command to resume", file=sys.stderr)
        return 130
    finally:
        if in_main_thread:
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
