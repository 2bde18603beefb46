"""A folder built once from a model folder and kept beside it: the one rule of every converter
(convert_onnx, convert_openvino, convert_ct2).

    <model dir>/<name>/                           the artifact: what the build wrote, and its marker
    <model dir>/<name>/specbench-artifact.json    the marker, written last: the recipe (converter and tool
                                                  versions, options), the source files' size, mtime and
                                                  sha256, the artifact's files' size and sha256
    <model dir>/.<name>.lock                      an exclusive flock, held while the artifact is checked or built
    <model dir>/.<name>.tmp/                      a build in progress, renamed to <name>/ once its marker is written
    <model dir>/.<name>.old/                      the previous artifact, for the moment of the swap

`ensure` takes the lock (a second process waits, then finds the first one's artifact), checks the source
and reuses the artifact when its marker's recipe is the one asked for, the source files are those it
records (sizes and mtimes at every use; a file whose mtime moved is hashed again and its new mtime recorded)
and its own files are whole (sizes at every use, sha256 with `hashes`). Otherwise it builds: into the
temporary sibling, checks that the source did not change meanwhile, writes the marker, and swaps the folder
in by renames, so `<name>/` is only ever absent or complete.

One behaviour on damage. A missing, unreadable or damaged marker, or an artifact file missing or changed,
is rebuilt under the lock, with a line in the log: the artifact is derived data, the source it is derived
from has just been checked whole, and the swap-in means no build of ours leaves a half folder, so a damaged
one was changed by something else and "delete it and load again", the only advice a refusal could give,
is what the rebuild does. What cannot be rebuilt is the source: a file the build reads missing, or of
another size than the folder's own fetch marker records (other bytes with `rehash_source`), or a
safetensors file that is not whole, is refused in one line naming the file and the fix
(`specbench models fetch ALIAS` for a registry model, else restoring the file), and nothing is built.
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from specdec.errors import ModelError
from specdec.models import integrity, registry

Log = Callable[[str], object]
Build = Callable[[Path], dict | None]  # writes the artifact's files into the folder it is given; returns marker extras

MARKER = "specbench-artifact.json"
KEYS = ("recipe", "source", "files", "build_s")  # the marker's entries the helper owns


@dataclass(frozen=True)
class Artifact:
    """What a cached artifact is built from and where it lives."""

    source: Path  # the model folder it is built from
    name: str  # its folder's name inside `source`
    inputs: tuple[str, ...]  # the files of `source` the build reads: their sha256s are its fingerprint
    recipe: dict  # what else made it (converter and tool versions, options): another one rebuilds
    label: str = "conversion"  # what it is, in messages: "the {label} of {source.name}"
    required: tuple[str, ...] = ()  # files a finished build holds

    def __post_init__(self) -> None:
        object.__setattr__(self, "source", Path(self.source))
        if not self.inputs:
            raise ValueError(f"the {self.label} of {self.source} reads no files: name its inputs")
        if not self.name or "/" in self.name or self.name.startswith("."):
            raise ValueError(f"an artifact's folder is a plain name inside its model folder, got {self.name!r}")
        if overlap := set(KEYS) & set(self.recipe):
            raise ValueError(f"recipe keys {sorted(overlap)} are the marker's own")

    @property
    def folder(self) -> Path:
        return self.source / self.name


def ensure(artifact: Artifact, build: Build, log: Log = print, *, hashes: bool = False,
           rehash_source: bool = False) -> Path:
    """`artifact.folder`, built by `build` unless a whole one made by the same recipe from the same source is
    there. `hashes`: check the artifact's files' sha256 (else their sizes); `rehash_source`: hash the source
    files afresh (else only those whose mtime moved) and check them against their folder's fetch marker."""
    folder, source_dir = artifact.folder, artifact.source
    if not source_dir.is_dir():
        raise ModelError(f"model directory {str(source_dir)!r} does not exist: check the path")
    with locked(folder):
        if problem := source_problem(source_dir, artifact.inputs):
            raise source_error(artifact, problem)
        marker = registry.read_marker(folder, MARKER) if folder.is_dir() else None
        stale = _marker_problem(artifact, marker)
        vouching = marker if stale is None else None  # a marker of this recipe, whole (a missing one is a problem)
        source = fingerprint(source_dir, artifact.inputs,
                             None if vouching is None or rehash_source else vouching["source"])
        if rehash_source and (problem := source_problem(source_dir, artifact.inputs, source)):
            raise source_error(artifact, problem)
        if vouching is not None:
            stale = _artifact_problem(folder, vouching, source, hashes)
        if vouching is not None and stale is None:
            if source != vouching["source"]:  # same bytes, touched files: record the new mtimes, skip hashing next time
                write_json(folder / MARKER, {**vouching, "source": source})
            return folder
        if folder.exists():
            log(f"{folder} {stale}: building it again ...")
        return _build(artifact, build, source, log)


def fingerprint(folder: Path, names: tuple[str, ...], previous: dict | None = None) -> dict[str, dict]:
    """{name: {size, mtime_ns, sha256}} of the files `names` of `folder`; one whose size and mtime equal
    `previous`'s keeps its recorded sha256 (hashing 7 GB at every load is too slow)."""
    out = {}
    for name in names:
        path, known = folder / name, (previous or {}).get(name)
        stat = path.stat()
        entry = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
        same = known if isinstance(known, dict) and all(known.get(key) == value for key, value in entry.items()) else None
        out[name] = {**entry, "sha256": same["sha256"] if same is not None else integrity.sha256_of(path)}
    return out


def same_source(a: dict[str, dict], b: dict[str, dict]) -> bool:
    """The same files with the same bytes (mtimes aside)."""
    def strip(record):
        return {name: (entry.get("size"), entry.get("sha256")) for name, entry in record.items()}

    return strip(a) == strip(b)


def source_problem(folder: Path, names: tuple[str, ...], hashed: dict[str, dict] | None = None) -> str | None:
    """What is wrong with the source folder, or None: a file of `names` missing; its files against the sizes
    its own fetch marker records, when it has one (with `hashed`, a fresh `fingerprint`, against its sha256s
    too); each safetensors file against its header. Each problem starts with the file's name."""
    found = [f"{name} is missing" for name in names if not (folder / name).is_file()]
    recorded = (registry.read_marker(folder) or {}).get("files") or {}
    found += integrity.problems(folder, recorded)
    for name, entry in (hashed or {}).items():
        if name in recorded and entry["sha256"] != recorded[name].get("sha256"):
            found.append(f"{name} has other bytes than when it was fetched (sha256 differs)")
    return found[0] if found else None


def source_error(artifact: Artifact, problem: str) -> ModelError:
    """The one-line refusal of a damaged source: the file, what is wrong, the fix."""
    source = artifact.source
    path = source / problem.split(" ", 1)[0]  # integrity's problems, and ours, start with the file's name
    return ModelError(f"cannot build the {artifact.label} of {source.name}: {problem} ({path}): "
                      f"{repair_hint(source)}")


def repair_hint(folder: Path) -> str:
    """How to repair a damaged source folder: fetch a registry model again, else restore the file."""
    try:
        if registry.is_alias(folder.name) and registry.model_dir(folder.name).resolve() == folder.resolve():
            return f"run `specbench models fetch {folder.name}` to fetch it again"
    except ModelError:
        pass
    return "restore that file"


def package_version(package: str) -> str:
    """The installed version of `package` from its metadata (importing it can take seconds), "" if absent."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return ""


@contextmanager
def locked(folder: Path) -> Iterator[None]:
    """An exclusive flock on `.<name>.lock` beside `folder`. The file stays: removing it while a second
    process waits on it would let a third lock a new file at the same path, and both would build. Opened
    read-only (a flock needs no write access: another user's lock file serves); where it cannot be created
    (a shared, read-only model folder: reuse only), the folder itself is locked."""
    try:
        fd = os.open(_sibling(folder, "lock"), os.O_RDONLY | os.O_CREAT, 0o666)
    except OSError as error:
        if error.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise
        fd = os.open(folder.parent, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the flock


def write_json(path: Path, data: dict) -> None:
    """`data` into `path` atomically (a partial file renamed over it)."""
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(partial, path)


def _marker_problem(artifact: Artifact, marker: dict | None) -> str | None:
    """Why the marker cannot vouch for the artifact, or None."""
    if marker is None:
        return f"has no readable {MARKER} (an interrupted build, or not ours)"
    if (recorded := marker.get("recipe")) != artifact.recipe:
        old = recorded if isinstance(recorded, dict) else {}
        changed = [key for key in {**old, **artifact.recipe} if old.get(key) != artifact.recipe.get(key)]
        return f"was built by another recipe ({', '.join(changed)} differ)"
    source, files = marker.get("source"), marker.get("files")
    if not isinstance(source, dict) or not isinstance(files, dict):
        return f"has a damaged {MARKER}"
    if not all(isinstance(entry, dict) and {"size", "sha256"} <= set(entry) for entry in [*source.values(), *files.values()]):
        return f"has a damaged {MARKER}"
    if missing := [name for name in artifact.required if name not in files]:
        return f"has a {MARKER} that does not list {missing[0]}"
    return None


def _artifact_problem(folder: Path, marker: dict, source: dict, hashes: bool) -> str | None:
    if not same_source(source, marker["source"]):
        return "was built from source files that changed since"
    if found := integrity.problems(folder, marker["files"], hashes=hashes):
        return f"is damaged ({found[0]})"
    return None


def _build(artifact: Artifact, build: Build, source: dict[str, dict], log: Log) -> Path:
    folder, tmp = artifact.folder, _sibling(artifact.folder, "tmp")
    for leftover in (tmp, _sibling(folder, "old")):  # a killed build's: we hold the lock, nobody else writes them
        shutil.rmtree(leftover, ignore_errors=True)
    tmp.mkdir()
    log(f"building the {artifact.label} of {artifact.source.name} (one time) ...")
    start = time.perf_counter()
    try:
        extras = build(tmp) or {}
        if missing := [name for name in artifact.required if not (tmp / name).is_file()]:
            raise ModelError(f"the {artifact.label} build of {artifact.source.name} made no {missing[0]}: "
                             "the converter's tools are not the versions it pins")
        if fingerprint(artifact.source, artifact.inputs, source) != source:  # sizes and mtimes, hashed before
            raise ModelError(f"{artifact.source} changed while its {artifact.label} was built: load it again")
        files = integrity.record(tmp)
        seconds = round(time.perf_counter() - start, 1)
        write_json(tmp / MARKER, {**extras, "recipe": artifact.recipe, "source": source, "files": files,
                                  "build_s": seconds})  # last: its presence means complete
        _swap_in(tmp, folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    size = sum(entry["size"] for entry in files.values())
    log(f"built the {artifact.label} of {artifact.source.name} in {seconds:.0f} s ({size / 1e9:.2f} GB): {folder}")
    return folder


def _swap_in(tmp: Path, folder: Path) -> None:
    """Rename the finished `tmp` to `folder`; an older copy goes aside first (a folder cannot be renamed over
    a full one) and is removed after, or put back if the rename fails."""
    old = _sibling(folder, "old") if folder.exists() else None
    if old is not None:
        os.replace(folder, old)
    try:
        os.replace(tmp, folder)
    except OSError:
        if old is not None:
            os.replace(old, folder)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _sibling(folder: Path, kind: str) -> Path:
    return folder.with_name(f".{folder.name}.{kind}")
