"""What one forward costs in each runtime on this machine: a decode step and a k+1-token verify
block, per model, runtime and thread count, timed interleaved (every configuration once per round,
the order rotated each round), so a ratio between runtimes is measured under the same conditions.

    python -m bench.measure.runtime_costs --models qwen2.5-coder-0.5b,qwen2.5-coder-1.5b \
        --runtimes A,B,C --threads 1,2 --rounds 5 --out runs/runtime_costs

Each timed forward feeds a block at a `--context`-token cache (the shipped `code` prompts' text,
tokenized, repeated to length) and is cropped back, so every block sees the same cache. Raw
timings go to OUT/costs.jsonl as they are taken (a rerun skips the rounds already there whole, every configuration at
its version: the runtime's packages and, for the kernels, their path and sources' digest, on the same machine class;
a round any configuration lacks is timed again for all of them, and ratios pair rows of one run only); the table
is derived from this run's configurations at their current version afterwards: ms per token step (median over rounds,
p10-p90), and a k+1-token block's cost in token steps for k = 1..8 (the ratio taken within a round, median and
spread). Rows of another version stay in the file and out of the table: a rerun after a kernel change times anew
(it used to print the timings of the sources before the change as if they were the new ones).
torch runs in `--dtype` (bf16 by default, the engine's CPU default); torch's dynamic int8 runtime is dynamic int8
Linear layers in fp32 (`@int8`); llama.cpp runs the registry's GGUF file as shipped (Q4_K_M).
`K:avx2` runs K, one of the kernels' runtimes, on one instruction-set path of the kernels (SPECBENCH_KERNELS while it
loads): the paths of one CPU timed interleaved, e.g. `--runtimes K:avx512-vnni,K:avx2`.

Each block size is timed `--block-repeats` times a round (3 by default; every size once, then again) and
the round keeps their median, as it does the step's 3: one timing a size made the block column noisy.

`--prefill N` also times, each round, one N-token prefill per configuration (a fresh cache, the first token's cost:
`prefill_s` in the row). With `--against R` (one of --runtimes, refused otherwise; default `llamacpp` when it is
timed), a second table gives each other runtime against R within each round (median [min-max] over rounds): its step
over R's, a 5-token block in R's steps (the issues' "block in plain llama.cpp steps"), and the prefill's speed-up over
R's. Which llama.cpp build this process loads is whatever `llama_cpp` it imports: `PYTHONPATH=DIR` puts another build
first (docs/runtimes.md builds one for AVX2 only, to compare instruction-set classes on one CPU).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import uuid
from pathlib import Path

import torch
from tqdm import tqdm

from bench.core.prompts import load_prompts
from bench.derive.runtime_cost_table import BLOCKS, against_table, read_rows, table
from bench.measure.versions import runtime_versions
from specdec.backends.devices import clock
from specdec.backends.prompt import Prompt
from specdec.errors import SpecdecError
from specdec.kernels import source_digest
from specdec.machine import fingerprint
from specdec.models.loading import load_model
from specdec.runtime_registry import declared, runtimes

STEP_REPEATS = 3  # token steps per round (their median is the round's step time)


def _configs(models: list[str], runtimes: list[str], threads: list[int]) -> list[tuple[str, str, int]]:
    return [(m, r, t) for m in models for r in runtimes for t in threads]


def context_ids(tokenizer, length: int) -> torch.Tensor:
    """`length` real token ids: the shipped `code` prompts' text, tokenized, repeated to length."""
    text = " ".join(p.prompt for p in load_prompts("code"))
    ids = tokenizer(text, return_tensors="pt").input_ids[0]
    while ids.numel() < length:
        ids = torch.cat([ids, ids])
    return ids[:length]


def prefilled(lm, context: int):
    """(the context's ids, a state whose cache holds them): what every timed block is fed after."""
    ids = context_ids(lm.tokenizer, context)
    state, _ = lm.backend.prefill(Prompt(ids), ids, keep=1)
    return ids, state


def _time_forward(backend, state, block: torch.Tensor, context: int) -> float:
    device = backend.device  # a CUDA forward is timed once its queue has drained
    start = clock(device)
    backend.forward(state, block, keep=block.numel())
    seconds = clock(device) - start
    backend.crop(state, context)
    return seconds


def time_round(backend, state, ids: torch.Tensor, context: int, prefill: torch.Tensor | None = None,
               block_repeats: int = 1) -> dict:
    """One round at the current thread count: a warm step, STEP_REPEATS timed steps, each block size in BLOCKS
    `block_repeats` times (every size once, then again), each cropped back to the `context`-token cache:
    {"step_s": [...], "block_s": {"n": s}}, s the median of a size's timings (all of them in "block_runs" when
    repeated); with `prefill` ids, also one prefill of them into a fresh cache ("prefill_s"), its state dropped.
    One timing a size made the block column as noisy as a single forward (a 5-token block read 1.72-1.94 steps
    over 7 rounds where the step's own spread was a few per cent)."""
    next_ids = ids[: max(BLOCKS)]  # any real ids: the cost does not depend on which
    _time_forward(backend, state, next_ids[:1], context)  # warm at these threads
    steps = [_time_forward(backend, state, next_ids[:1], context) for _ in range(STEP_REPEATS)]
    runs: dict[int, list[float]] = {n: [] for n in BLOCKS}
    for _ in range(block_repeats):
        for n in BLOCKS:
            runs[n].append(_time_forward(backend, state, next_ids[:n], context))
    timed: dict = {"step_s": steps, "block_s": {str(n): statistics.median(r) for n, r in runs.items()}}
    if block_repeats > 1:
        timed["block_runs"] = {str(n): r for n, r in runs.items()}
    if prefill is not None:
        start = clock(backend.device)
        fresh, _ = backend.prefill(Prompt(prefill), prefill, keep=1)
        timed["prefill_s"], timed["prefill_tokens"] = clock(backend.device) - start, prefill.numel()
        del fresh
    return timed


def version_of(runtime: str, installed: dict[str, str | None]) -> str:
    """What `runtime`'s timings depend on besides the machine: its packages' versions (`installed`), and for the
    kernels (`NAME:PATH` or the chosen path) the path and its sources' digest, plus this machine's class."""
    name, _, path = runtime.partition(":")
    versions = dict(installed)
    packages = declared(name).timed_packages
    if path and "kernels" in packages:
        versions["kernels"] = f"{path} {source_digest(path)}"
    listed = ", ".join(f"{package} {versions.get(package)}" for package in packages)
    return f"{listed}; machine {fingerprint(with_gpu=False)['machine_class']}"


def _load(model: str, runtime: str, dtype: str):
    """`runtime`, or `RUNTIME:PATH` for the kernels on one instruction-set path."""
    name, _, path = runtime.partition(":")
    before = os.environ.get("SPECBENCH_KERNELS")
    if path:
        os.environ["SPECBENCH_KERNELS"] = path
    try:
        return load_model(model, dtype, log=lambda m: print(m, file=sys.stderr), runtime=name)
    finally:
        if before is None:
            os.environ.pop("SPECBENCH_KERNELS", None)
        else:
            os.environ["SPECBENCH_KERNELS"] = before


def versions_of(args: argparse.Namespace) -> dict[str, str]:
    """Each runtime asked for -> its version now (version_of)."""
    installed = runtime_versions()
    return {runtime: version_of(runtime, installed) for runtime in args.runtimes.split(",")}


@torch.inference_mode()
def measure(args: argparse.Namespace, versions: dict[str, str]) -> Path:
    """Time what `args` asks for that the file holds no round of at its version (`versions`) yet."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "costs.jsonl"
    configs = _configs(args.models.split(","), args.runtimes.split(","), [int(t) for t in args.threads.split(",")])
    done = set()
    if path.exists():
        this_run = current(args, versions)
        for row in read_rows(path):
            if this_run(row):
                done.add((row["model"], row["runtime"], row["threads"], row["round"]))
    # A round is timed whole: where any configuration lacks it (new, or its version changed), every configuration
    # times it again in this run, so the round's rows stay interleaved. Resuming configuration by configuration set a
    # kernel change's new rows beside a reference timed minutes earlier in another run (llama.cpp's prefill against
    # the kernels' read 1.29-2.31x in one such table).
    whole = {r for r in range(args.rounds) if all((*config, r) in done for config in configs)}
    done = {key for key in done if key[3] in whole}
    run_id = uuid.uuid4().hex[:12]  # the rows of one invocation: a ratio pairs rows of one run only
    loaded, states = {}, {}
    for model, runtime, _ in configs:
        if (model, runtime) not in loaded:
            lm = _load(model, runtime, args.dtype)
            ids, state = prefilled(lm, args.context)
            long = context_ids(lm.tokenizer, args.prefill) if args.prefill else None
            if long is not None:
                lm.backend.prefill(Prompt(long), long, keep=1)  # untimed: the first long prefill sizes buffers
            loaded[(model, runtime)], states[(model, runtime)] = (lm, ids, long), state
    todo = [(r, c) for r in range(args.rounds) for c in range(len(configs)) if (*configs[c], r) not in done]
    with path.open("a") as sink, tqdm(total=len(todo), desc="forwards timed", unit="config") as bar:
        for round_ in range(args.rounds):
            order = configs[round_ % len(configs):] + configs[: round_ % len(configs)]  # rotate who goes first
            for model, runtime, threads in order:
                if (model, runtime, threads, round_) in done:
                    continue
                torch.set_num_threads(threads)
                (lm, ids, long), state = loaded[(model, runtime)], states[(model, runtime)]
                timed = time_round(lm.backend, state, ids, args.context, long, args.block_repeats)
                sink.write(json.dumps({"model": model, "runtime": runtime, "threads": threads, "round": round_,
                                       "dtype": args.dtype if declared(runtime.partition(":")[0]).dtyped else None,
                                       "context": args.context, "run": run_id,
                                       "version": versions[runtime], **timed}) + "\n")
                sink.flush()
                bar.update()
    return path


def current(args: argparse.Namespace, versions: dict[str, str]):
    """Whether a timing row is one of this run's configurations at its version now (the table's rows)."""
    models, threads = set(args.models.split(",")), {int(t) for t in args.threads.split(",")}
    return lambda row: (row["model"] in models and row["threads"] in threads
                        and row.get("version") == versions.get(row["runtime"])
                        and row.get("prefill_tokens", 0) == args.prefill)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.measure.runtime_costs", description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="qwen2.5-coder-0.5b,qwen2.5-coder-1.5b")
    parser.add_argument("--runtimes", default=",".join(r.name for r in runtimes() if r.calibrated),
                        help="comma-separated runtimes (default: what `specbench calibrate` measures by default)")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"), help="torch runtime only")
    parser.add_argument("--context", type=int, default=128, help="cached tokens each block is fed after")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--prefill", type=int, default=0, help="also time an N-token prefill each round (0: none)")
    parser.add_argument("--block-repeats", type=int, default=3,
                        help="timings of each block size a round, their median kept (the step is timed 3 times)")
    parser.add_argument("--against", default=None,
                        help="the runtime the second table compares every other with, round by round (one of --runtimes; "
                             "default: llamacpp when it is timed)")
    parser.add_argument("--out", default="runs/runtime_costs")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.context < 1 or args.block_repeats < 1:
        parser.error("--rounds, --context and --block-repeats must be >= 1")
    if args.against is not None and args.against not in args.runtimes.split(","):
        parser.error(f"--against {args.against!r} is not among --runtimes ({args.runtimes}): name one of them")
    args.against = args.against or "llamacpp"
    if args.prefill < 0:
        parser.error(f"--prefill must be a token count >= 0 (0: no prefill timed); got {args.prefill}")
    if not all(t.strip().isdigit() and int(t) >= 1 for t in args.threads.split(",")):
        parser.error(f"--threads must list whole numbers >= 1, e.g. 1,2; got {args.threads!r}")
    try:
        versions = versions_of(args)  # an unknown runtime is refused here, in one line
        path = measure(args, versions)
    except SpecdecError as e:  # an unknown model or runtime, a damaged file: one line, the timings so far kept
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(table(path, current(args, versions)))
    if args.against in args.runtimes.split(","):
        print()
        print(against_table(path, args.against, current(args, versions)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
