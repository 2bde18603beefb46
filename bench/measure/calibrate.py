"""`specbench calibrate`: this machine, measured once and kept. The harness's defaults were set on one
CPU; on another every runtime costs something else (docs/machines.md), so what a runtime costs here is
measured here:

  bandwidth   memory read GB/s with every core this process may use: the best of a few warm passes over a
              buffer of at least 1 GiB and 6x the last-level cache, read both by torch's `sum` and, where the
              vnni kernels run, by 1 to 16 interleaved 64-byte-load streams a thread (a weight pass reads many
              rows at once; one stream a thread read below a step); the best of all, since nothing reads faster
              than memory, so no step can beat the floor it sets; read again around each entry's rounds, in its
              process (a VM's memory drifts by a third over seconds), and an entry's floor set by the best reading
  compute     int8 multiply-adds a second of the kernels' Linear (this CPU's path) on 64 rows whose weights stay
              in cache, the best of a few calls: what a prefill computed by these kernels cannot beat, the prompt
              rate's roof beside the step's floor (absent where no kernel path runs)
  per entry   per model x runtime: a token step and the k+1-token blocks (k + 1 = 2..9) after a 128-token
              cache, `--rounds` rounds (bench/measure/runtime_costs.py's `time_round`), and the bytes a
              step must read, whose time at that bandwidth is the step's floor; an 800-token prompt's prefill,
              and the model's multiply-adds a prompt token (its decoder's Linears: the head runs for the last row)

Each (model, runtime) is measured in its own spawned process (bench/measure/launch.py's WorkerProcess), so
a runtime that cannot load, raises or crashes natively (llama.cpp's AMX kernels on GCC 12: docs/runtimes.md)
is one entry's `error` and the calibration goes on. Rounds run back to back in that process, not
interleaved with other entries (they live in other processes).

One file per machine class, $SPECBENCH_HOME/calibration/<machine_class>.json (its schema and reader:
bench/derive/calibration.py), reused until the machine class, a runtime's version (torch, transformers,
llama_cpp) or a model's weight files change; entries not yet there are measured and merged, `--force`
measures everything again.
"""
from __future__ import annotations

import datetime
import functools
import hashlib
import json
import os
import time
import tomllib
from collections.abc import Callable
from pathlib import Path

import torch
from tqdm import tqdm

from bench.derive.calibration import SCHEMA, entry_of, read_calibration
from bench.measure.launch import WorkerProcess, bind_to_parent, death_line
from bench.measure.runtime_costs import context_ids, prefilled, time_round
from bench.measure.versions import runtime_versions
from specdec.backends.prompt import Prompt
from specdec.errors import ConfigError, SpecdecError
from specdec.kernels import KernelError, kernels, pack
from specdec.machine import fingerprint
from specdec.models import registry
from specdec.models.derive import split_name
from specdec.models.loading import LoadedModel, load_model
from specdec.runtime_registry import declared
from specdec.runtime_registry import runtimes as all_runtimes

DEFAULT_CONFIG = Path(__file__).parent.parent / "configs" / "default.toml"  # its models are calibrate's default
ROUNDS = 3
CONTEXT = 128  # cached tokens every timed block is fed after
PREFILL = 800  # tokens of a timed prompt: about a Spec-Bench RAG question's, where the prompt rate decides the first token
PREFILL_CLOSE = 0.03  # two prefills this close settle the prompt rate (time_prefills)
TORCH_DTYPE = "bfloat16"  # runtime torch: the engine's CPU default (dynamic int8 computes in float32 whatever it is)
BANDWIDTH_BYTES = 1 << 30  # >= 1 GiB: far past any last-level cache (this machine reports 260 MiB of L3)
BANDWIDTH_REPEATS = 5
READ_STREAMS = (1, 2, 4, 8, 16)  # streams a thread for the kernels' read: the fastest count varies by processor


# What an entry's measurement is: bumped when what is measured, or a runtime's own code here, changes (2: a
# block against its steps, and torch's per-token int8 computing attention per query), so older entries are
# measured anew.
METHOD = 2


def default_models() -> list[str]:
    """The edge and cloud of the shipped default config (bench/configs/default.toml)."""
    config = tomllib.loads(DEFAULT_CONFIG.read_text(encoding="utf-8"))
    return [config["edge"], config["cloud"]]


def calibration_path(machine_class: str) -> Path:
    return registry.home() / "calibration" / f"{machine_class}.json"


def packages_of(runtime: str) -> tuple[str, ...]:
    return declared(runtime).timed_packages


def default_runtimes() -> tuple[str, ...]:
    """What `specbench calibrate` measures when no runtime is named (declarations with `calibrated`)."""
    return tuple(r.name for r in all_runtimes() if r.calibrated)


# --- the public entry point ------------------------------------------------------------------
def calibration(models: list[str], runtimes: list[str], threads: int, progress: bool = True, force: bool = False,
                rounds: int = ROUNDS) -> dict:
    """This machine's calibration file (bench/derive/calibration.py's schema) holding an entry for every
    model x runtime at `threads`: measured now where the file has none, or a stale one; the rest kept.
    ConfigError (one line) for an unknown runtime or a damaged file (unless `force`)."""
    runtimes = [declared(r).name for r in runtimes]
    if threads < 1 or rounds < 1:
        raise ConfigError(f"threads and rounds must be >= 1, got {threads} and {rounds}")
    here, versions = fingerprint(), runtime_versions()
    path = calibration_path(here["machine_class"])
    data = None if force or not path.exists() else read_calibration(path, any_machine=True)
    if data is not None and data["fingerprint"]["machine_class"] != here["machine_class"]:
        data = None  # another machine's file under this machine's name (copied): measure anew
    kept = [e for e in data["entries"] if fresh(e, data["versions"], versions)] if data else []
    have = {(e["model"], e["runtime"], e["threads"]) for e in kept}
    todo = [(m, r) for m in models for r in runtimes if (m, r, threads) not in have]
    if data is not None and not todo and len(kept) == len(data["entries"]):
        return data
    bandwidth = data["bandwidth_gbs"] if data else measure_bandwidth(threads)
    if data and data.get("compute_gmacs") and data["versions"].get("kernels") == versions.get("kernels"):
        compute = data["compute_gmacs"]  # the same kernels on the same machine: auto calibrates a runtime a call
    else:
        compute = measure_compute(threads)  # a second at most
    data = {"schema": SCHEMA, "fingerprint": here, "bandwidth_gbs": bandwidth, "versions": versions,
            "created": _now(), "threads": threads, "entries": kept, "compute_gmacs": compute}
    _write(path, data)
    with tqdm(todo, desc="calibrating", unit="entry", disable=not progress) as bar:
        for model, runtime in bar:
            bar.set_postfix_str(f"{model} in {runtime}")
            measured = {**measure_isolated(model, runtime, threads, rounds, bandwidth_bytes()),
                        "model_stamp": model_stamp(model, runtime), "prompt_macs_per_token": prompt_macs_per_token(model)}
            data["entries"].append(entry_of(measured, bandwidth))
            _write(path, data)  # each entry as it is measured: an interrupted calibration keeps it
    return data


def fresh(entry: dict, then: dict, now: dict) -> bool:
    """An entry still holds: it was measured by this METHOD, its runtime's packages are the versions it was
    measured with, and its model's weight files are the ones it was measured on (where both stamps are
    known). An entry that failed is kept as well: a crash is this machine's and these versions' (`--force`
    retries it)."""
    if not entry.get("error") and entry.get("method") != METHOD:
        return False
    if any(then.get(p) != now.get(p) for p in packages_of(entry["runtime"])):
        return False
    stamp = model_stamp(entry["model"], entry["runtime"])
    return stamp is None or entry.get("model_stamp") in (None, stamp)


def model_stamp(model: str, runtime: str) -> str | None:
    """A short hash of the model's weight files (names, sizes, modification times): a re-fetched or
    re-quantized model gets a new stamp. None where the files are not found here (a hub id, not fetched)."""
    try:
        base, _ = split_name(registry.expand(model))
        if registry.is_alias(base):
            where = registry.gguf_path(base) if declared(runtime).file_suffix else registry.model_dir(base)
        else:
            where = Path(base).expanduser()
    except SpecdecError:
        return None
    if where.is_file():
        files = [where]
    else:
        patterns = ("*.safetensors", "*.gguf", "*.bin")
        files = sorted(f for pattern in patterns for f in where.glob(pattern)) if where.is_dir() else []
    if not files:
        return None
    listed = [(f.name, (s := f.stat()).st_size, s.st_mtime_ns) for f in files]
    return hashlib.sha256(json.dumps(listed).encode()).hexdigest()[:12]


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def _write(path: Path, data: dict) -> None:
    """Whole or not at all: a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    partial.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    os.replace(partial, path)


# --- measuring -------------------------------------------------------------------------------
def measure_bandwidth(threads: int | None = None, size: int | None = None) -> float:
    """Memory read bandwidth, GB/s, with every core this process may use (`threads` only if more): a buffer of
    `size` bytes (`bandwidth_bytes()` when None) read BANDWIDTH_REPEATS times after one warm pass (pages touched, the
    kernel chosen), by torch's `sum` and, where the vnni kernels run, by their 64-byte loads in READ_STREAMS streams a
    thread; the fastest pass of all, since nothing makes a read faster than memory: a floor that a step beats is not a floor. (A
    `sum` at the calibration's 2 threads read 29.4 GB/s on the AMD EPYC of 2026-11-28, below what llama.cpp's step
    streamed; one stream a thread read 25.7 GB/s on the Xeon that day, under the int8 kernels' step's 27.2 GB/s;
    8 read 30.5-32, 16 29.6, 64 23.7.)"""
    cores = max(threads or 1, len(os.sched_getaffinity(0)))
    readers: list[Callable] = [lambda buffer: buffer.sum()]
    try:
        stream_read = kernels().stream_read
        readers += [functools.partial(stream_read, streams=count) for count in READ_STREAMS]
    except KernelError:  # no VNNI here: torch's sum alone
        pass
    previous = torch.get_num_threads()
    torch.set_num_threads(cores)
    try:
        buffer = torch.ones((size or bandwidth_bytes()) // 4, dtype=torch.float32)
        passes = []
        for read in readers:
            read(buffer)
            for _ in range(BANDWIDTH_REPEATS):
                start = time.perf_counter()
                read(buffer)
                passes.append(time.perf_counter() - start)
    finally:
        torch.set_num_threads(previous)
    return round(buffer.numel() * 4 / min(passes) / 1e9, 2)


# A child that has sent nothing this long is stopped and its entry is that error: a runtime that hangs (a deadlock in
# its native threads, a lock file left by a dead build) must not hold the calibration, or CI, for ever. An entry's
# longest honest work is a first conversion of the 1.5B (ONNX, OpenVINO: minutes) and a few seconds of timing.
ENTRY_LIMIT_S = 1800.0
EXIT_GRACE_S = 30.0  # after its entry, a child that has not exited in this long is stopped
COMPUTE_SHAPE = (64, 2048, 1536)  # rows, out, in: the 1.5B's q/k/v, 3 MB of int8 weights (cache-resident)
COMPUTE_REPEATS = 20


def measure_compute(threads: int | None = None) -> float | None:
    """int8 multiply-adds a second (G) of the kernels' Linear on this CPU's path, with every core this process may
    use: COMPUTE_SHAPE, weights in cache, the fastest of COMPUTE_REPEATS calls (what a prefill computed by these
    kernels cannot beat). None where no kernel path runs here."""
    try:
        ops = kernels()
    except KernelError:
        return None
    rows, out, inner = COMPUTE_SHAPE
    generator = torch.Generator().manual_seed(0)
    packed = pack.int8(torch.randn(out, inner, generator=generator) * 0.02)
    x = torch.randn(rows, inner, generator=generator)
    previous = torch.get_num_threads()
    torch.set_num_threads(max(threads or 1, len(os.sched_getaffinity(0))))
    try:
        calls = []
        for _ in range(COMPUTE_REPEATS + 1):
            start = time.perf_counter()
            ops.linear_int8(x, packed.weight, packed.scale, None, None, out, inner)
            calls.append(time.perf_counter() - start)
    finally:
        torch.set_num_threads(previous)
    return round(rows * out * inner / min(calls[1:]) / 1e9, 1)


def prompt_macs_per_token(model: str) -> int | None:
    """Multiply-adds of a prompt token in `model`'s decoder Linears (q, k, v, o, gate, up, down; the head runs for
    the last row only), from its config; None where the config is not found here or is not a Llama-style decoder."""
    try:
        from transformers import AutoConfig

        base, _ = split_name(registry.expand(model))
        config = AutoConfig.from_pretrained(registry.model_dir(base) if registry.is_alias(base) else base)
        hidden, heads, layers = config.hidden_size, config.num_attention_heads, config.num_hidden_layers
        head_dim = getattr(config, "head_dim", None) or hidden // heads
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        attention = hidden * (heads + 2 * kv_heads) * head_dim + heads * head_dim * hidden
        return int(layers * (attention + 3 * hidden * config.intermediate_size))
    except (SpecdecError, OSError, ValueError, AttributeError, TypeError):
        return None


def bandwidth_bytes() -> int:
    """At least BANDWIDTH_BYTES and 6x the last-level cache (sysfs), a multiple of 64 bytes."""
    largest = 0
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            text = (index / "size").read_text().strip()
            largest = max(largest, int(text[:-1]) * {"K": 1 << 10, "M": 1 << 20}.get(text[-1], 1) if text[-1] in "KM"
                          else int(text))
        except (OSError, ValueError):
            continue
    return max(BANDWIDTH_BYTES, 6 * largest) // 64 * 64


def streamed_weight_bytes(lm: LoadedModel) -> int:
    """The bytes one token step must read: a GGUF file's size (llama.cpp maps and reads it whole), or a
    torch model's weights without its embedding tables (a step reads one row of those; a head tied to
    them is counted as the head), a dynamic int8 Linear counted as its packed int8 weight and its bias."""
    if lm.runtime is not None and declared(lm.runtime).whole_file:
        return Path(lm.location).stat().st_size
    if lm.backend.streamed_bytes is not None:  # a converted runtime's graph says what it reads (onnxrt.py)
        return int(lm.backend.streamed_bytes)
    seen, total = set(), 0
    for module in lm.backend.model.modules():
        if isinstance(module, torch.nn.Embedding):
            continue
        if isinstance(module, torch.ao.nn.quantized.dynamic.Linear):
            for tensor in (module.weight(), module.bias()):
                total += tensor.numel() * tensor.element_size() if tensor is not None else 0
        for parameter in module.parameters(recurse=False):
            if id(parameter) not in seen:
                seen.add(id(parameter))
                total += parameter.numel() * parameter.element_size()
    return total


@torch.inference_mode()
def measure_entry(model: str, runtime: str, threads: int, rounds: int, read_bytes: int = 0) -> dict:
    """In this process: load `model` in `runtime`, time `rounds` rounds at `threads` threads. With `read_bytes`,
    the memory's bandwidth is read over a buffer that size just before the first round and just after the last (the
    rounds take a second or so each; a reading ~2 s), and the best reading kept (`bandwidth_gbs`): a VM's speed drifts
    by a third over seconds (the AMD EPYC of 2026-11-29: a reading a minute before read 32 GB/s, then the int8
    kernels' step streamed 38), so the step's floor is set by what the memory did around that step, not at the
    calibration's start."""
    torch.set_num_threads(threads)  # llama.cpp's backend takes its threads from torch's
    lm = load_model(model, TORCH_DTYPE, log=lambda message: None, runtime=runtime)
    ids, state = prefilled(lm, CONTEXT)
    readings = [measure_bandwidth(threads, read_bytes)] if read_bytes else []
    timed = [time_round(lm.backend, state, ids, CONTEXT) for _ in range(rounds)]  # ~1 s each: read around them all
    readings += [measure_bandwidth(threads, read_bytes)] if read_bytes else []
    return {"model": model, "runtime": runtime, "threads": threads, "dtype": TORCH_DTYPE if declared(runtime).dtyped else None,
            "weight_bytes": streamed_weight_bytes(lm), "rounds": timed, "error": None, "method": METHOD,
            "bandwidth_gbs": max(readings, default=None),
            "block_vs_steps": block_vs_steps(lm.backend, state, ids, CONTEXT),
            "prefill_tokens": PREFILL, "prefill_s": time_prefills(lm, PREFILL, rounds)}


def time_prefills(lm: LoadedModel, tokens: int, rounds: int, close: float = PREFILL_CLOSE) -> list[float]:
    """Seconds for a `tokens`-token prompt's prefill (its last row's logits), up to `rounds` times: the prompt rate.
    Stops after two when they agree within `close` (their median is the rate either way, and a third 800-token
    prefill of the 1.5B costs ~8 s of an entry's ~50 on 2 cores); a third settles two that disagree."""
    ids = context_ids(lm.tokenizer, tokens)
    seconds: list[float] = []
    while len(seconds) < rounds:
        start = time.perf_counter()
        lm.backend.prefill(Prompt(ids), ids, keep=1)
        seconds.append(time.perf_counter() - start)
        if len(seconds) == 2 and abs(seconds[0] - seconds[1]) <= close * min(seconds):
            break
    return seconds


def block_vs_steps(backend, state, ids: torch.Tensor, context: int, n: int = 5) -> float:
    """max |logit| difference between an n-token block's rows and the same n tokens fed as n one-token steps,
    after the `context`-token cache: 0.0 means the runtime's verify computes exactly its own plain decoding's
    logits, so greedy speculation verified there reproduces that decoding token for token (a lossless
    policy's text is the verifier's own). Measured, not assumed: it depends on the kernels a machine runs."""
    block = ids[:n]
    rows = backend.forward(state, block, keep=n)
    backend.crop(state, context)
    steps = torch.cat([backend.forward(state, block[i : i + 1], keep=1) for i in range(n)])
    backend.crop(state, context)
    return float((rows.float() - steps.float()).abs().max())


def _measure_child(model: str, runtime: str, threads: int, rounds: int, read_bytes: int, queue, parent_pid: int) -> None:
    """A spawned child's whole life: measure one entry, send it (or the one-line error instead)."""
    bind_to_parent(parent_pid)
    try:
        measured = measure_entry(model, runtime, threads, rounds, read_bytes)
    except SpecdecError as e:  # an unknown model, a runtime not installed, a damaged file: one line already
        measured = failed(model, runtime, threads, str(e))
    except Exception as e:  # a runtime's own error: recorded, and the calibration goes on
        measured = failed(model, runtime, threads, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    queue.put(("entry", measured))
    queue.put(("exit",))


def failed(model: str, runtime: str, threads: int, error: str) -> dict:
    return {"model": model, "runtime": runtime, "threads": threads, "error": error}


def measure_isolated(model: str, runtime: str, threads: int, rounds: int, read_bytes: int = 0,
                     target: Callable = _measure_child) -> dict:
    """One entry measured by `target` in a spawned process (the bandwidth read around its rounds over `read_bytes`,
    if any: measure_entry); a process that dies without sending it (a native crash, the kernel's OOM killer) is
    that entry's error."""
    worker = WorkerProcess(target, model, runtime, threads, rounds, read_bytes, ignore_sigint=True).start()
    measured = None
    try:
        for message in worker.messages(deadline=time.monotonic() + ENTRY_LIMIT_S):
            if message[0] == "entry":
                measured = message[1]
        if measured is None and worker.process.is_alive():  # silent past the limit: stopped on the way out
            return failed(model, runtime, threads, f"no result within {ENTRY_LIMIT_S:g} s, so it was stopped (a hang in "
                                                   f"the runtime): `specbench calibrate --runtimes {runtime}` retries it alone")
        code = worker.wait(EXIT_GRACE_S)  # a child stuck in its teardown is stopped
    finally:
        worker.stop()
    if measured is None:  # `a native crash (SIGSEGV)`, `killed (SIGKILL: ...)`, `exit code 1`
        measured = failed(model, runtime, threads, death_line(code) if code < 0 else f"no result ({death_line(code)})")
    return measured
