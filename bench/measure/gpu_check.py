"""The GPU check's driver (bench/gpu/check.sh runs it; docs/gpu.md): on one machine with a CUDA GPU and no
network, in one call of at most 8 minutes, it runs the CUDA-marked tests, measures the cost curve of the
Qwen2.5-1.5B and -7B architectures (bench/gpu/*.json, random bf16 weights: timing does not read the values)
the verify cycles of chains and token trees and the fleet's capacity, and writes at most 9 files under
RESULTS, each naming the GPU:

    environment.json   the GPU, CUDA, torch, transformers, the commit, the settings, the measured bandwidth
    cuda_tests.txt     `pytest tests/test_cuda.py -m cuda`, its output
    cost_curve.csv     per model x mode x rows x tokens: a forward after CONTEXT cached tokens per row, raw
                       times (CUDA events) and their median, p10, p90; written row by row, so a cut run keeps them
    tree_costs.csv     per model x cache x shape: a verify cycle of the backend itself after CONTEXT cached tokens (a
                       step, a chain of k, a token tree of width x depth: forward_tree then commit_path), raw times and
                       their median, p10, p90, and the median in steps of that cache; written row by row (and in
                       cost_summary.json's tree_agreement: a 4 x 4 tree's and a chain's rows against their steps)
    cost_summary.json  derived (bench/derive/gpu_costs.py): floors, steps per mode, issue 44's targets, the fleet's capacity
    fleet_results.jsonl, fleet_levels.jsonl, fleet_summary.csv
                       `specbench fleet` of recorded CPU edges (bench/gpu/recorded-code) against the 7B architecture
                       with random weights on the GPU, keeping their recorded verdicts (--follow-verdicts): spec beside
                       cloud-only serving at N = 1, 8, 64 (FLEET), once per server cache (FLEET_CACHES: the
                       dynamic cache, then the static one with captured graphs), in the last --fleet-s seconds

Modes: eager (transformers' DynamicCache, as the dynamic backend and the server run), static (the static cache
eagerly), graphs (its CUDA-graph replay: specdec/backends/cuda_graphs.py). Shapes run most useful first (1 and
k + 1 tokens at 1, 8 and 64 rows), and the curve stops at the time budget, writing what it has.

    python -m bench.measure.gpu_check RESULTS [--budget-s 300] [--models qwen2.5-1.5b,qwen2.5-7b]
    python -m bench.measure.gpu_check RESULTS --dry-run     # the CPU, tiny configs, few shapes: its commands run

The tree stage is bench/measure/gpu_trees.py; what the stages share (the architectures, the timer, the dry run's
settings) bench/measure/gpu_timing.py.
"""
from __future__ import annotations

import argparse
import csv
import datetime
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from bench.derive.fleet_summary import summarize_fleet
from bench.derive.gpu_costs import capacity, graph_bound, spread, summarize
from bench.measure.gpu_timing import CONFIGS, CONTEXT, DRY, WARM_UPS, build, timed
from bench.measure.gpu_trees import tree_costs
from specdec.backends.cuda_graphs import CapturedSteps
from specdec.backends.devices import check_device, is_cuda
from specdec.backends.hf_util import cache_kwarg
from specdec.backends.static_cache import StaticKV, static_forward
from specdec.errors import SpecdecError
from specdec.models.architecture import PREFIX as ARCH

MODELS = ("qwen2.5-1.5b", "qwen2.5-7b")
ROWS = (1, 2, 4, 8, 16, 32, 64)
TOKENS = (1, 2, 3, 5, 9, 16)  # a step, and verify blocks of k + 1 for k = 1, 2, 4, 8, 15
FIRST = [(r, t) for t in (1, 5) for r in (1, 8, 64)]  # measured before the rest of the grid
REPEATS = 12
TESTS = ["tests/test_cuda.py", "-m", "cuda", "-q", "-p", "no:cacheprovider"]
TESTS_TIMEOUT_S = 180
# What the CUDA tests import beyond torch, transformers and pytest: wheels of the ones a GPU machine lacks travel
# beside the check (bench/gpu/check.sh installs $SPECBENCH_WHEELS/*.whl; docs/gpu.md).
NEEDED = ("websockets", "msgspec", "gguf", "psutil", "tqdm", "safetensors", "soundfile", "soxr", "jiwer")
VERSIONS = ("torch", "transformers", "websockets")
# The fleet's capacity (docs/gpu.md): replayed edges of the real pair (Qwen2.5-Coder 0.5B drafting, 1.5B verifying, on a
# CPU: bench/gpu/recorded-code) against a server of the 7B architecture with random weights that keeps their recorded
# verdicts, spec beside cloud-only serving. The recording's settings are the fleet's (a replay must match them).
RECORDING = CONFIGS / "recorded-code"
RECORDED = ["--prompts", "code", "--max-new-tokens", "128", "--policy", "greedy", "--entropy-threshold", "0", "--k", "4",
            "--dtype", "bfloat16"]
FLEET: dict[str, Any] = {"model": "qwen2.5-7b", "clients": "1,8,64", "repeats": 2, "limit": 1, "max_batch": 64}
DRY_FLEET: dict[str, Any] = {"clients": "1", "repeats": 1, "limit": 1, "max_batch": 8}
# The server's caches, each a fleet of its own: transformers' DynamicCache (eager), then one static cache of its
# sessions, whose forwards replay as captured CUDA graphs (specdec/backends/static_slots.py).
FLEET_CACHES = ("dynamic", "static")
FLEET_LEAVE_S = 15  # what the fleets leave of the budget for the summary
CURVE_COLUMNS = ["gpu", "model", "mode", "rows", "tokens", "context", "repeats", "median_ms", "p10_ms", "p90_ms", "times_ms"]


def streamed_bytes(model) -> int:
    """The bytes one step reads: every weight but the embedding tables (a head tied to them counted once, as the head)."""
    seen, total = set(), 0
    for module in model.modules():
        if isinstance(module, torch.nn.Embedding):
            continue
        for parameter in module.parameters(recurse=False):
            if id(parameter) not in seen:
                seen.add(id(parameter))
                total += parameter.numel() * parameter.element_size()
    return total


def bandwidth_gbs(device: str, size_bytes: int) -> float:
    """Memory read GB/s: the fastest of 5 sums over a bf16 buffer of `size_bytes` (past any cache)."""
    buffer = torch.ones(size_bytes // 2, dtype=torch.bfloat16, device=device)
    buffer.sum()
    best = min(timed(lambda: buffer.sum(), device, 1)[0] for _ in range(5))
    return size_bytes / (best / 1e3) / 1e9


def forwards(model, mode: str, rows: int, tokens: int, context: int, device: str):
    """A callable running one [rows, tokens] forward after `context` cached positions per row, in `mode`, and
    leaving the cache as it found it."""
    from transformers import DynamicCache

    kwarg, config = cache_kwarg(model.forward), model.config
    ids = torch.randint(0, config.vocab_size, (rows, tokens), device=device)
    positions = torch.arange(context, context + tokens, device=device).expand(rows, tokens)
    if mode == "eager":  # transformers' own cache, every row at `context` cached positions (values do not matter)
        kv = StaticKV(config, context, next(model.parameters()).dtype, torch.device(device), batch=rows)
        cache = DynamicCache(config=config)
        for layer, (keys, values) in enumerate(zip(kv.keys, kv.values)):
            cache.update(keys, values, layer)

        def run():
            model(input_ids=ids, position_ids=positions, **{kwarg: cache}, use_cache=True)
            cache.crop(-tokens)  # back to `context` positions

        return run
    kv = StaticKV(config, context + 2 * max(TOKENS), next(model.parameters()).dtype, torch.device(device), batch=rows)
    if mode == "static":
        return lambda: static_forward(model, kwarg, kv, ids, positions)
    captured = CapturedSteps(lambda i, p: static_forward(model, kwarg, kv, i, p), torch.device(device), kv.capacity)
    return lambda: captured(ids, context)


@dataclass(frozen=True)
class Timing:
    """How every shape of a curve is timed: on `device`, after `context` cached tokens per row, `repeats` timed
    forwards after `warm_ups`."""

    device: str
    context: int
    warm_ups: int
    repeats: int


def measure(model, name: str, mode: str, rows: int, tokens: int, timing: Timing) -> dict:
    """One cost_curve.csv row: `timing.repeats` timed forwards after its warm-ups (a graph is captured there, kernels
    chosen)."""
    context, device, repeats = timing.context, timing.device, timing.repeats
    run = forwards(model, mode, rows, tokens, context, device)
    timed(run, device, timing.warm_ups)
    times = timed(run, device, repeats)
    median, low, high = spread(times)
    return {"model": name, "mode": mode, "rows": rows, "tokens": tokens, "context": context, "repeats": repeats,
            "median_ms": round(median, 4), "p10_ms": round(low, 4), "p90_ms": round(high, 4),
            "times_ms": " ".join(f"{t:.4f}" for t in times)}


def curve(models: list[str], out: Path, device: str, gpu: str | None, dry: bool, deadline: float,
          repeats: int) -> tuple[list[dict], dict[str, int], dict[str, str]]:
    """Measure and append cost_curve.csv rows until the deadline; -> (rows, each model's streamed bytes, what did not
    run: a mode that raised, recorded once and not run again for that model, and the budget's end)."""
    rows_axis, tokens_axis = (DRY["rows"], DRY["tokens"]) if dry else (ROWS, TOKENS)
    context, warm_ups = (DRY["context"], DRY["warm_ups"]) if dry else (CONTEXT, WARM_UPS)
    timing = Timing(device, context, warm_ups, repeats)
    shapes = [s for s in FIRST if s[0] in rows_axis and s[1] in tokens_axis]
    shapes += [(r, t) for t in tokens_axis for r in rows_axis if (r, t) not in shapes]
    modes = ("graphs", "eager", "static") if is_cuda(device) else ("eager", "static")
    measured: list[dict] = []
    sizes: dict[str, int] = {}
    failed: dict[str, str] = {}
    with (out / "cost_curve.csv").open("w", newline="", encoding="utf-8") as sink:
        writer = csv.DictWriter(sink, CURVE_COLUMNS)
        writer.writeheader()
        for name in models:
            model = build(name, device, dry) if time.monotonic() < deadline else None
            if model is None:
                failed.setdefault("budget", f"the time budget ended before {name}")
                break
            sizes[name] = streamed_bytes(model)
            with torch.inference_mode():
                for (rows, tokens), mode in ((shape, mode) for shape in shapes for mode in modes):
                    if f"{name} {mode}" in failed:
                        continue
                    if time.monotonic() > deadline:
                        failed.setdefault("budget", f"the time budget ended before {name} {mode} {rows}x{tokens}")
                        break
                    try:
                        row = {"gpu": gpu, **measure(model, name, mode, rows, tokens, timing)}
                    except Exception as e:  # a mode that fails (a capture, memory): recorded, not run again
                        failed[f"{name} {mode}"] = f"{type(e).__name__}: {first_line(e)}"
                        row = {"gpu": gpu, "model": name, "mode": mode, "rows": rows, "tokens": tokens,
                               "context": context, "repeats": repeats, "times_ms": f"error: {failed[f'{name} {mode}']}"}
                    else:
                        measured.append(row)
                    writer.writerow(row)
                    sink.flush()
            del model
            if is_cuda(device):
                torch.cuda.empty_cache()
    return measured, sizes, failed


def fleet_command(arch: str, out: Path, device: str, dry: bool, kv_cache: str = "dynamic") -> list[str]:
    """`specbench fleet` of the recorded edges against the architecture `arch` (a config file) on `device`."""
    settings = {**FLEET, **(DRY_FLEET if dry else {})}
    return [sys.executable, "-m", "bench.cli", "fleet", "--edge-replay", str(RECORDING), "--follow-verdicts",
            "--cloud", f"{ARCH}{arch}", "--cloud-device", device, "--kv-cache", kv_cache, "--clients", settings["clients"],
            "--repeats", str(settings["repeats"]), "--limit", str(settings["limit"]), "--max-batch",
            str(settings["max_batch"]), "--out", str(out), *RECORDED]


def fleet(results: Path, device: str, gpu: str | None, dry: bool, deadline: float) -> dict:
    """The fleet once per server cache (FLEET_CACHES), each in an equal share of the time left until `deadline`
    (killed there: its results are written as produced). Their raw records and levels and their summaries go to
    fleet_* (each row names its kv_cache); -> per cache, what the capacity says (bench/derive/gpu_costs.py)."""
    caches = {}
    with tempfile.TemporaryDirectory() as scratch:
        arch = CONFIGS / f"{FLEET['model']}.json"
        if dry:  # a tiny qwen2 with the real vocabulary: the recorded token ids must fit
            arch = Path(scratch) / "tiny.json"
            real = json.loads((CONFIGS / f"{FLEET['model']}.json").read_text(encoding="utf-8"))
            arch.write_text(json.dumps({**real, **{k: v for k, v in DRY["config"].items() if k != "vocab_size"}}))
        summaries = []
        for index, cache in enumerate(FLEET_CACHES):
            share = (deadline - time.monotonic()) / (len(FLEET_CACHES) - index)
            out = Path(scratch) / f"fleet-{cache}"
            command = fleet_command(str(arch), out, device, dry, cache)
            print("$ " + " ".join(command[2:]), flush=True)
            try:
                code = subprocess.run(command, timeout=max(share, 1.0)).returncode
            except subprocess.TimeoutExpired:
                code = 124
            table = summarize_fleet(out) if (out / "levels.jsonl").is_file() else pd.DataFrame()  # a killed fleet wrote none
            summaries.append(table.assign(kv_cache=cache))
            for name in ("results.jsonl", "levels.jsonl"):
                if (out / name).is_file():
                    with (results / f"fleet_{name}").open("a", encoding="utf-8") as sink:
                        sink.write((out / name).read_text(encoding="utf-8"))
            caches[cache] = {"exit_code": code, **capacity(table)}
        pd.concat(summaries).to_csv(results / "fleet_summary.csv", index=False)
    return {"model": FLEET["model"], "gpu": gpu, "caches": caches}


def first_line(error: Exception) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else ""


def run_tests(out: Path, gpu: str | None, timeout_s: float) -> int:
    """The CUDA-marked tests (all skipped where torch sees no GPU), their output kept with the GPU's name on top."""
    try:
        done = subprocess.run([sys.executable, "-m", "pytest", *TESTS], capture_output=True, text=True, timeout=timeout_s)
        code, text = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as e:  # its output so far comes as bytes, text mode or not
        output = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else e.stdout or ""
        code, text = 124, f"{output}\ntimed out after {timeout_s:g} s"
    header = f"gpu: {gpu}\n$ pytest {' '.join(TESTS)}\nexit code {code}\n\n"
    (out / "cuda_tests.txt").write_text(header + text, encoding="utf-8")
    return code


def versions() -> dict[str, str | None]:
    """The versions imported (torch, transformers), or installed (the rest; None: not installed)."""
    import transformers

    found: dict[str, str | None] = {"torch": torch.__version__, "transformers": transformers.__version__}
    for name in VERSIONS:
        try:
            found.setdefault(name, metadata.version(name))
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def environment(device: str, gpu: str | None, args: argparse.Namespace) -> dict:
    # A copied tree (the GPU machine's) may carry another commit's .git, or none: the caller names its commit.
    commit = os.environ.get("SPECBENCH_COMMIT")
    try:
        commit = commit or subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                                          timeout=5).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        commit = None
    props = torch.cuda.get_device_properties(device) if is_cuda(device) else None
    return {"gpu": gpu, "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "device": device, "dry_run": args.dry_run, "cuda": torch.version.cuda, "versions": versions(),
            "missing_packages": [name for name in NEEDED if importlib.util.find_spec(name) is None],
            "gpu_memory_bytes": props.total_memory if props else None, "git_commit": commit,
            "models": args.models, "context": DRY["context"] if args.dry_run else CONTEXT, "repeats": args.repeats}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.measure.gpu_check", description=__doc__.split("\n\n")[0])
    parser.add_argument("results", type=Path, help="folder for the result files (made if missing)")
    parser.add_argument("--dry-run", action="store_true", help="the CPU, tiny configs, few shapes: prove the commands run")
    parser.add_argument("--device", help="default cuda (cpu with --dry-run)")
    parser.add_argument("--models", default=",".join(MODELS), help="configs in bench/gpu/, comma-separated")
    parser.add_argument("--budget-s", type=float, default=420.0,
                        help="start no measurement after this many seconds from the start (the tests' included)")
    parser.add_argument("--repeats", type=int, default=None, help=f"timed forwards per shape (default {REPEATS})")
    parser.add_argument("--skip-tests", action="store_true", help="no CUDA tests")
    parser.add_argument("--skip-fleet", action="store_true", help="no fleet capacity")
    parser.add_argument("--skip-curve", action="store_true", help="no cost curve (cost_curve.csv)")
    parser.add_argument("--trees-s", type=float, default=60.0,
                        help="seconds for the verify cycles of chains and token trees (tree_costs.csv; 0: none)")
    parser.add_argument("--fleet-s", type=float, default=260.0,
                        help="seconds kept for the fleets at the end of the budget (the curve stops that much earlier)")
    args = parser.parse_args(argv)
    start = time.monotonic()
    args.device = args.device or ("cpu" if args.dry_run else "cuda")
    args.repeats = args.repeats or (DRY["repeats"] if args.dry_run else REPEATS)
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    try:
        check_device(args.device, "--device")
        if missing := [m for m in args.models if not (CONFIGS / f"{m}.json").is_file()]:
            raise SpecdecError(f"no config bench/gpu/{missing[0]}.json: use one of {', '.join(MODELS)}")
    except SpecdecError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    args.results.mkdir(parents=True, exist_ok=True)
    gpu = torch.cuda.get_device_name(args.device) if is_cuda(args.device) else None
    size = (64 << 20) if args.dry_run else (2 << 30)
    found = {**environment(args.device, gpu, args), "bandwidth_gbs": round(bandwidth_gbs(args.device, size), 1)}
    (args.results / "environment.json").write_text(json.dumps(found, indent=1) + "\n", encoding="utf-8")
    print(f"gpu: {gpu}, bandwidth {found['bandwidth_gbs']} GB/s", flush=True)
    if found["missing_packages"]:
        print(f"missing for the CUDA tests: {', '.join(found['missing_packages'])} (put their wheels in $SPECBENCH_WHEELS)",
              flush=True)
    tests = 0 if args.skip_tests else run_tests(args.results, gpu, TESTS_TIMEOUT_S)
    print(f"cuda tests: exit code {tests}", flush=True)
    fleet_s = 0.0 if args.skip_fleet else args.fleet_s
    trees, agreed = tree_costs(args.models, args.results, args.device, gpu, args.dry_run, time.monotonic() + args.trees_s,
                               args.repeats) if args.trees_s > 0 else ([], [])
    for each in agreed:
        print(f"{each['model']} {each['cache']}: rows against their steps: tree {each['tree']}, chain {each['chain']}",
              flush=True)
    for row in trees:
        print(f"{row['model']} {row['cache']} {row['shape']} {row['width']}x{row['depth']}: {row['median_ms']} ms = "
              f"{row['steps']} steps", flush=True)
    rows, sizes, failed = ([], {}, {}) if args.skip_curve else curve(
        args.models, args.results, args.device, gpu, args.dry_run, start + args.budget_s - fleet_s, args.repeats)
    summary = summarize(rows, sizes, found["bandwidth_gbs"], gpu)
    if not args.skip_fleet:
        summary["fleet"] = fleet(args.results, args.device, gpu, args.dry_run, start + args.budget_s - FLEET_LEAVE_S)
        for cache, measured in summary["fleet"]["caches"].items():
            measured["graph_bound"] = graph_bound(measured, rows, FLEET["model"])
            if measured["exit_code"]:
                failed[f"fleet {cache}"] = f"the fleet exited with {measured['exit_code']} (124: cut at the budget)"
    summary.update(failed=failed, complete=not failed, tree_agreement=agreed)
    (args.results / "cost_summary.json").write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    for name, model in summary["models"].items():
        print(f"{name}: floor {model['floor_ms']} ms, step {model['step_ms']} ms", flush=True)
    for cache, measured in summary.get("fleet", {}).get("caches", {}).items():
        for clients, level in measured["levels"].items():
            print(f"fleet ({cache} cache) N={clients}: spec/cloud-only throughput {level['spec_over_cloud']}", flush=True)
    return 1 if tests else 0


if __name__ == "__main__":
    raise SystemExit(main())
