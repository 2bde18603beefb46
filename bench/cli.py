"""The `specbench` command line. Bad input: one line naming the problem and the fix, exit 2."""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from bench.compare import add_compare_parser, cmd_compare
from bench.gate import add_gate_parser, cmd_gate
from bench.profiling import add_profile_parser, cmd_profile
from bench.report.cli import add_report_parser, cmd_report
from bench.audio import MAX_SECONDS
from specdec.config import DecodeConfig, SpecConfig
from specdec.errors import SpecdecError


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None


def add_run_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--mode", choices=["edge", "cloud", "spec"], required=True)
    p.add_argument("--edge", help="edge (draft) model: registry alias, local directory or hub id")
    p.add_argument("--cloud", help="cloud (verify) model: registry alias, local directory or hub id")
    p.add_argument("--prompts", required=True,
                   help="JSONL file, JSON manifest, or a shipped set (zh-describe, zh-chat, en-chat, code, audio-samples)")
    p.add_argument("--out", required=True, type=Path, help="results directory")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--k", type=int, default=SpecConfig.k, help="draft tokens per block")
    p.add_argument("--entropy-threshold", type=_float, default=SpecConfig.entropy_threshold,
                   help="escalate a block iff its uncertainty >= this many nats (0 = always, inf = never)")
    p.add_argument("--accept-threshold", type=_float, default=SpecConfig.accept_threshold,
                   help="threshold policy: accept while p_cloud(draft) >= this probability")
    p.add_argument("--policy", choices=["threshold", "greedy", "sample"], default=SpecConfig.policy)
    p.add_argument("--verifier", choices=["cached", "stateless"], default=SpecConfig.verifier)
    p.add_argument("--uncertainty", choices=["max", "mean", "first"], default=SpecConfig.uncertainty)
    p.add_argument("--punct-trigger", type=_float, default=None,
                   help="also escalate blocks whose punctuation density exceeds this (seed 003: 0.4)")
    p.add_argument("--temperature", type=_float, default=0.0, help="0 = greedy")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="bfloat16")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--constraints", choices=["none", "zh"], default="none")
    p.add_argument("--no-chat-template", action="store_true", help="feed the prompt text raw")
    p.add_argument("--limit", type=int, help="only the first N prompts")
    p.add_argument("--max-audio-seconds", type=_float, default=MAX_SECONDS,
                   help="refuse longer clips (capped by the model's own window)")


def engine_from_args(args: argparse.Namespace):
    from specdec.engine import Engine

    spec = SpecConfig(
        k=args.k, entropy_threshold=args.entropy_threshold, accept_threshold=args.accept_threshold,
        policy=args.policy, verifier=args.verifier, uncertainty=args.uncertainty, punct_trigger=args.punct_trigger,
    )
    decode = DecodeConfig(max_new_tokens=args.max_new_tokens, temperature=args.temperature, seed=args.seed)
    return Engine(
        mode=args.mode, edge=args.edge, cloud=args.cloud, dtype=args.dtype, spec=spec, decode=decode,
        constraints=args.constraints, chat_template=not args.no_chat_template, log=_say,
    )


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def cmd_run(args: argparse.Namespace) -> int:
    from bench.run import run

    engine = engine_from_args(args)
    rows = run(engine, args.prompts, args.out, limit=args.limit, max_audio_s=args.max_audio_seconds)
    ok = [r for r in rows if r["status"] == "ok"]
    if ok:
        tokens = sum(r["new_tokens"] for r in ok)
        seconds = sum(r["latency_s"] for r in ok)
        line = f"{len(ok)} prompts, {tokens} tokens in {seconds:.1f} s ({tokens / seconds:.1f} tok/s)"
        if args.mode == "spec":
            drafted = sum(r["num_draft_tokens"] for r in ok)
            accepted = sum(r["num_accepted_tokens"] for r in ok)
            calls = sum(r["cloud_calls"] for r in ok)
            cycles = sum(r["cycles"] for r in ok)
            rate = f"{accepted / drafted:.2f}" if drafted else "n/a"
            line += f", acceptance {rate}, cloud calls {calls}/{cycles} cycles"
        _say(line)
    else:
        _say(f"nothing to do: every prompt already has a result in {args.out}")
    _say(f"results: {args.out / 'results.jsonl'}")
    return 0


def _listed(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def add_sweep_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", type=Path, help="TOML sweep config (keys as below, with underscores); flags override it")
    p.add_argument("--out", required=True, type=Path, help="results directory (rerun to resume)")
    p.add_argument("--edge")
    p.add_argument("--cloud")
    for axis in ("mode", "k", "entropy-threshold", "accept-threshold", "policy", "verifier", "dtype", "prompts"):
        p.add_argument(f"--{axis}", type=_listed, help="comma-separated values: one grid axis")
    p.add_argument("--max-new-tokens", type=int)
    p.add_argument("--temperature", type=_float)
    p.add_argument("--seed", type=int)
    p.add_argument("--constraints", choices=["none", "zh"])
    p.add_argument("--limit", type=int, help="first N prompts of each set")
    p.add_argument("--max-audio-s", type=_float, help="refuse longer audio clips (default 30 s)")
    p.add_argument("--network", help="none, wifi, 4g, 5g, or rtt=40ms,up=10mbit,down=50mbit")
    p.add_argument("--edge-cores", type=int, help="CPU cores of the edge worker")
    p.add_argument("--edge-memory-gb", type=_float, help="edge RSS cap (GiB); a point over it is recorded, the sweep goes on")
    p.add_argument("--rlimit-as", action="store_true", default=None, help="also cap the address space (RLIMIT_AS)")


def cmd_sweep(args: argparse.Namespace) -> int:
    from bench.records import ResultsFile
    from bench.nll import read_scores
    from bench.summary import summarize
    from bench.sweep import SweepConfig, run_sweep

    overrides = {k: v for k, v in vars(args).items() if k not in ("command", "config", "out", "func") and v is not None}
    config = SweepConfig.from_toml(args.config, **overrides) if args.config else SweepConfig.from_mapping(overrides)
    counts = run_sweep(config, args.out)
    summary = summarize(ResultsFile(args.out / "results.jsonl").read(), read_scores(args.out))
    summary.to_csv(args.out / "summary.csv", index=False)
    _say(", ".join(f"{n} {status}" for status, n in sorted(counts.items())))
    if not summary.empty:
        columns = [c for c in ("mode", "prompts", "k", "entropy_threshold", "tokens_per_s", "speedup_vs_cloud",
                               "acceptance_rate", "cloud_call_rate", "chrf_vs_cloud") if c in summary]
        _say(summary[columns].to_string(index=False, float_format=lambda x: f"{x:.3g}"))
    _say(f"summary: {args.out / 'summary.csv'}")
    return 0


def add_score_parser(sub) -> None:
    p = sub.add_parser("score", help="cloud NLL of every output in a results folder (resumable); "
                                     "summaries and reports then show it")
    p.add_argument("results", type=Path, help="the --out folder of `specbench run` or `sweep`")
    p.add_argument("--model", help="scoring model (default: the results' cloud model)")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")


def cmd_score(args: argparse.Namespace) -> int:
    from bench.nll import SCORES, score

    from bench.nll import read_scores
    from bench.records import read_records
    from bench.summary import summarize

    counts = score(args.results, args.model, args.dtype, log=_say)
    _say(f"scored {counts['scored']} outputs ({counts['already']} already scored, {counts['skipped']} audio "
         f"prompts skipped): {args.results / SCORES}")
    summary_csv = args.results / "summary.csv"
    if summary_csv.exists():  # a sweep folder: its summary gains the cloud_nll column
        summarize(read_records(args.results / "results.jsonl"), read_scores(args.results)).to_csv(summary_csv, index=False)
        _say(f"summary: {summary_csv}")
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    from specdec.models import registry

    if args.models_command == "list":
        for entry in registry.list_models():
            state = "fetched" if registry.is_fetched(entry.alias) else "not fetched"
            source = f"derived: {entry.load_name}" if getattr(entry, "base", None) else entry.upstream
            print(f"{entry.alias:24} {entry.size / 1e6:8.0f} MB  {state:12} {source}  ({entry.license})")
        return 0
    from specdec.models.fetch import fetch

    for alias in args.aliases or [e.alias for e in registry.list_models()]:
        registry.get(alias)
        print(fetch(alias, log=_say))
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
    models = sub.add_parser("models", help="the offline model registry")
    models_sub = models.add_subparsers(dest="models_command", required=True)
    models_sub.add_parser("list", help="registry aliases and whether they are fetched")
    fetch = models_sub.add_parser("fetch", help="install, verify and convert pinned weights (all aliases by default)")
    fetch.add_argument("aliases", nargs="*")
    return parser


COMMANDS = {"run": cmd_run, "sweep": cmd_sweep, "models": cmd_models, "report": cmd_report, "profile": cmd_profile,
            "gate": cmd_gate, "compare": cmd_compare, "score": cmd_score}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except SpecdecError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: results written so far are kept; rerun the same command to resume", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
