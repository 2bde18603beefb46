"""Whether llama.cpp's extra buffer types run on this machine, asked once of a child process.

llama.cpp repacks weights into "extra buffer types" (its CPU repack kernels, and AMX tiles where the
CPU has AMX) unless `llama_model_params.use_extra_bufts` is off (llama.cpp's `--no-repack`). On an
Intel AMX machine llama-cpp-python 0.3.36 built with GCC 12 dies of SIGSEGV at the first decode of 2+
tokens: GCC 12's `_tile_loadconfig` inline asm lets the compiler drop the writes that fill the tile
configuration, so `ldtilecfg` faults (ollama #17249, fixed there by GCC 13; llama.cpp #20824 and
PR #26954). A crash in native code cannot be caught, so the question goes to a child, which loads
the GGUF with extra buffers and decodes blocks of PROBE_BLOCKS tokens: exit 0 = they work.

A child that passes, or dies of a crash signal, is a verdict kept in one JSON file (the loader passes
the model cache's) under the machine class, the llama.cpp build and the weight type: one probe per
machine, build and weight type, not per file. Anything else (a timeout, an error exit, a kill from
outside) says nothing about the kernels: extra buffers stay off for this load and the next asks again.
"""
from __future__ import annotations

import datetime
import json
import logging
import os
import struct
import subprocess
import sys
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType, LlamaFileType

from specdec.errors import NATIVE_CRASH_SIGNALS, ConfigError, signal_name
from specdec.machine import fingerprint
from specdec.settings import ExtraBuffers, choices

EXTRA_BUFFERS = choices(ExtraBuffers)  # the setting: probe first, llama.cpp's default, its --no-repack
PROBE_TIMEOUT_S = 180.0
PROBE_BLOCKS = (1, 2, 5, 9)  # tokens per decode: the AMX crash needs 2+
CACHE_FILE = "llamacpp_extra_buffers.json"

log = logging.getLogger(__name__)
_announced: set[str] = set()  # fallback reasons this process has logged


@dataclass(frozen=True)
class Verdict:
    works: bool  # load with extra buffers
    reason: str  # "probe passed", "probe died of SIGSEGV", "off by setting", ...


# --- the key: machine class, llama.cpp build, weight type ------------------------------------------
def build_id(llama_cpp) -> str:
    """The llama.cpp build: llama-cpp-python's version and the size and mtime of its shared libraries
    (a rebuild with another compiler or flags changes them; the version alone does not)."""
    lib = Path(llama_cpp.__file__).parent / "lib"
    found = {*lib.glob("*llama*"), *lib.glob("*ggml-cpu*")} if lib.is_dir() else set()
    files = sorted(f for f in found if f.suffix in (".so", ".dylib", ".dll"))  # not the .so.0 copies
    return " ".join([f"llama-cpp-python {llama_cpp.__version__}",
                     *(f"{f.name}:{f.stat().st_size}:{f.stat().st_mtime_ns}" for f in files)])


_SCALARS = {GGUFValueType.UINT8: "B", GGUFValueType.INT8: "b", GGUFValueType.UINT16: "H", GGUFValueType.INT16: "h",
            GGUFValueType.UINT32: "I", GGUFValueType.INT32: "i", GGUFValueType.FLOAT32: "f", GGUFValueType.BOOL: "?",
            GGUFValueType.UINT64: "Q", GGUFValueType.INT64: "q", GGUFValueType.FLOAT64: "d"}


def _read(f, code: str):
    size = struct.calcsize("<" + code)
    data = f.read(size)
    if len(data) < size:
        raise ValueError("the GGUF header ends early")
    return struct.unpack("<" + code, data)[0]


def _skip(f, kind: GGUFValueType) -> None:
    if kind == GGUFValueType.STRING:
        f.seek(_read(f, "Q"), os.SEEK_CUR)
    elif kind == GGUFValueType.ARRAY:
        item, count = GGUFValueType(_read(f, "I")), _read(f, "Q")
        if item in _SCALARS:
            f.seek(count * struct.calcsize("<" + _SCALARS[item]), os.SEEK_CUR)
        else:
            for _ in range(count):
                _skip(f, item)
    else:
        f.seek(struct.calcsize("<" + _SCALARS[kind]), os.SEEK_CUR)


def weight_type(path: Path) -> str:
    """The GGUF's `general.file_type` (MOSTLY_Q4_K_M, ...), else its tensors' types, read from the header
    in order. Not gguf.GGUFReader: it parses every field first, 20 s for a 151k-token vocabulary."""
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise ValueError("no GGUF magic")
        _read(f, "I")  # version
        n_tensors, n_fields = _read(f, "Q"), _read(f, "Q")
        for _ in range(n_fields):
            length = _read(f, "Q")
            if length > 1 << 16:  # a key is a short name; a damaged length would read the whole file
                raise ValueError("a GGUF key is longer than 64 KiB")
            key = f.read(length).decode("utf-8", "replace")
            kind = GGUFValueType(_read(f, "I"))
            if key == "general.file_type" and kind in _SCALARS:
                value = _read(f, _SCALARS[kind])
                try:
                    return LlamaFileType(value).name
                except ValueError:  # a type newer than this gguf package
                    return f"file_type {value}"
            _skip(f, kind)
        types: Counter[str] = Counter()
        for _ in range(n_tensors):  # name, dims, type, offset
            f.seek(_read(f, "Q"), os.SEEK_CUR)
            f.seek(8 * _read(f, "I"), os.SEEK_CUR)
            types[GGMLQuantizationType(_read(f, "I")).name] += 1
            f.seek(8, os.SEEK_CUR)
    return "tensors " + "+".join(sorted(types))


def probe_key(path: Path, build: str) -> str | None:
    """`MACHINE_CLASS | BUILD | WEIGHT_TYPE`; None for a damaged header (llama.cpp's own load names it)."""
    try:
        return f"{fingerprint()['machine_class']} | {build} | {weight_type(path)}"
    except (OSError, ValueError):
        return None


# --- the child, its verdict, the file that keeps it ---------------------------------------------
def child_argv(path: Path) -> list[str]:
    # -c, not -m: the package imports this module before runpy would run it as __main__
    return [sys.executable, "-c", f"import sys; from {__name__} import main; sys.exit(main(sys.argv[1:]))", str(path)]


def run_probe(argv: list[str], timeout_s: float = PROBE_TIMEOUT_S) -> tuple[Verdict, bool]:
    """(the verdict of the child `argv`, whether it is one to keep)."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return Verdict(False, f"probe timed out after {timeout_s:g} s"), False
    except OSError as e:
        return Verdict(False, f"probe could not start ({e})"), False
    if done.returncode == 0:
        return Verdict(True, "probe passed"), True
    if done.returncode < 0:  # a crash signal is the kernels' verdict; one from outside says nothing
        name = signal_name(-done.returncode)
        return Verdict(False, f"probe died of {name}"), name in NATIVE_CRASH_SIGNALS
    last = (done.stderr.strip().splitlines() or ["no message"])[-1]
    return Verdict(False, f"probe failed (exit {done.returncode}: {last})"), False


def read_cache(path: Path | None) -> dict[str, Verdict]:
    """The kept verdicts; a missing or damaged file (or entry) holds none, and the next probe rewrites it."""
    try:
        data = json.loads(path.read_text(encoding="utf-8")) if path is not None else {}
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {key: Verdict(entry["works"], entry["reason"]) for key, entry in data.items()
            if isinstance(entry, dict) and isinstance(entry.get("works"), bool) and isinstance(entry.get("reason"), str)}


def keep(path: Path, key: str, verdict: Verdict) -> None:
    """Add a verdict to the file, written whole and renamed into place (a reader never sees half of
    it). Two processes probing at once may each keep only their own: the other probes once more."""
    now = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    entries = {k: asdict(v) for k, v in read_cache(path).items()}
    entries[key] = {**asdict(verdict), "probed": now}
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(entries, indent=1, sort_keys=True), encoding="utf-8")
        os.replace(tmp, path)
    except OSError:  # an unwritable cache costs a probe next time, nothing more
        tmp.unlink(missing_ok=True)


def decide(setting: str, path: Path, build: str, cache: Path | None, argv: list[str] | None = None,
           timeout_s: float = PROBE_TIMEOUT_S) -> Verdict:
    """Whether to load `path` with extra buffers under `setting` (EXTRA_BUFFERS): auto asks the cache,
    else a probe child (`argv`, default `child_argv(path)`), and keeps a final verdict in `cache`."""
    if setting not in EXTRA_BUFFERS:
        raise ConfigError(f"unknown llamacpp_extra_buffers {setting!r}: use one of {', '.join(EXTRA_BUFFERS)}")
    if setting != ExtraBuffers.AUTO:
        return Verdict(setting == ExtraBuffers.ON, f"{setting} by setting")
    key = probe_key(path, build)
    if key is not None and (verdict := read_cache(cache).get(key)) is not None:  # None: a damaged header, never kept
        return verdict
    verdict, final = run_probe(argv or child_argv(path), timeout_s)
    if final and cache is not None and key is not None:
        keep(cache, key, verdict)
    return verdict


def announce(verdict: Verdict) -> None:
    """One log line per process and reason when auto left the extra buffers off (after the model loaded:
    a damaged file is the load's one-line error, not this)."""
    if verdict.works or verdict.reason == "off by setting" or verdict.reason in _announced:
        return
    _announced.add(verdict.reason)
    log.warning("llama.cpp runs without its extra buffer types (weight repacking, AMX) on this machine: %s "
                "(docs/runtimes.md; --llamacpp-extra-buffers on forces them)", verdict.reason)


def main(argv: list[str]) -> int:
    """The child: load the GGUF with extra buffers and decode PROBE_BLOCKS; 0 if every decode gave
    finite logits (a crash never returns)."""
    import llama_cpp

    [path] = argv
    logging.getLogger("llama-cpp-python").setLevel(logging.CRITICAL + 1)  # its load report is noise here
    llama_cpp.llama_backend_init()
    params = llama_cpp.llama_model_default_params()
    params.use_extra_bufts = True
    model = llama_cpp.llama_model_load_from_file(path.encode(), params)
    if not model:
        print(f"llama.cpp cannot load {path}", file=sys.stderr)
        return 2
    n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))
    cparams = llama_cpp.llama_context_default_params()
    cparams.n_ctx, cparams.n_batch, cparams.n_ubatch = 64, max(PROBE_BLOCKS), max(PROBE_BLOCKS)
    cparams.n_threads = cparams.n_threads_batch = os.cpu_count() or 1
    ctx = llama_cpp.llama_init_from_model(model, cparams)
    batch = llama_cpp.llama_batch_init(max(PROBE_BLOCKS), 0, 1)
    position = 0
    for n in PROBE_BLOCKS:
        for row in range(n):
            batch.token[row], batch.pos[row], batch.n_seq_id[row] = (position + row) % n_vocab, position + row, 1
            batch.seq_id[row][0], batch.logits[row] = 0, row == n - 1
        batch.n_tokens = n
        if llama_cpp.llama_decode(ctx, batch) != 0:
            print(f"llama_decode of {n} tokens failed", file=sys.stderr)
            return 3
        if not np.isfinite(np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, n - 1), shape=(n_vocab,))).all():
            print(f"a decode of {n} tokens gave non-finite logits", file=sys.stderr)
            return 4
        position += n
    llama_cpp.llama_batch_free(batch)
    llama_cpp.llama_free(ctx)
    llama_cpp.llama_model_free(model)
    return 0
