"""A results folder (the --out of run, sweep and profile; score writes into it too): one writer at a
time, one identity for its life, and one line for whatever the filesystem refuses.

- One writer: the command writing a folder holds an exclusive `flock` on DIR/.specbench.lock (the
  kernel drops it when the process ends, however it ends); a second writer is refused with the
  holder's pid. Readers (report, compare) take no lock: they skip a last line still being written.
- One identity: the kind of command that made the folder (its run.json or sweep.json) and its full
  configuration, paths resolved. Results are added only by the same kind with the same
  configuration (a resume); anything else is refused with what differs. A folder without results
  is not bound yet: a command that failed before its first result leaves nothing that would
  refuse the corrected one.
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import overload

from specdec.errors import InputError

LOCK = ".specbench.lock"
IDENTITY_FILES = {"run": "run.json", "sweep": "sweep.json", "fleet": "fleet.json", "soak": "soak.json"}
RESULTS = "results.jsonl"
MACHINE_FILE = "machine.json"  # a sweep's machine and the runtimes chosen from its calibration (bench/measure/runtime_auto.py)
_held: dict[Path, int] = {}  # folders this process holds, so a command may re-enter its own lock


@overload
def canonical_path(value: str) -> str: ...
@overload
def canonical_path(value: None) -> None: ...
def canonical_path(value: str | None) -> str | None:
    """An existing file or directory as its absolute, resolved path (so `./m` and `/home/u/m` are
    one setting); anything else (an alias, a hub id, a shipped set, None) unchanged."""
    if value is None or not Path(value).expanduser().exists():
        return value
    return str(Path(value).expanduser().resolve())


def os_error_line(e: OSError) -> str:
    """One line for an OSError at the edges: the path, what the system said and what to do."""
    if e.filename is None:
        return str(e.strerror or e)
    known: dict[int | None, str] = {
        errno.EEXIST: "is a file, not a folder: give a folder path, or move the file away",
        errno.ENOTDIR: "cannot be used: part of that path is a file, not a folder; give another path",
        errno.EISDIR: "is a folder, not a file: give a file path",
        errno.EROFS: "is on a read-only filesystem: write somewhere writable (another --out)",
        errno.ENOSPC: "cannot be written: the disk is full; free some space and rerun (results written so far "
                      "are kept)",
        errno.EDQUOT: "cannot be written: disk quota exceeded; free some space and rerun",
        errno.EACCES: "cannot be accessed (permission denied): use a path you may write, or fix its permissions",
        errno.EPERM: "cannot be accessed (operation not permitted): use a path you may write",
        errno.ENOENT: "does not exist: check the path",
    }
    what = known.get(e.errno, f"failed: {e.strerror or e}")
    return f"{e.filename} {what}"


def make_folder(out: Path) -> Path:
    """`out` as an existing, writable folder, or one InputError saying why it cannot be."""
    if out.exists() and not out.is_dir():
        raise InputError(f"{out} is a file, not a folder: give a folder path (or move the file away)")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InputError(os_error_line(e)) from None
    return out


def writable_file(path: Path) -> Path:
    """Check before minutes of work that `path` can be written as a file: not a folder, and under
    an existing folder we may write (or one that can be made)."""
    if path.is_dir():
        raise InputError(f"{path} is a folder, not a file: give a file path")
    parent = path.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise InputError(f"{path} cannot be written: {parent} is a file, not a folder; give another path")
    if not os.access(parent, os.W_OK):
        raise InputError(f"{path} cannot be written: {parent} is not writable; give another path")
    return path


@contextmanager
def writer(out: Path) -> Iterator[Path]:
    """Hold `out`'s lock while writing it: `with writer(out):`. Re-entrant within one process."""
    out = make_folder(Path(out))
    key = out.resolve()
    if key in _held:
        _held[key] += 1
        try:
            yield out
        finally:
            _held[key] -= 1
        return
    try:
        fd = os.open(out / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise InputError(os_error_line(e)) from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            raise InputError(f"{out} is being written by another specbench process (pid {holder}): wait for it to "
                             "finish or stop it, or use another --out") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        _held[key] = 1
        try:
            yield out
        finally:
            del _held[key]
    finally:
        os.close(fd)  # releases the lock


def has_results(out: Path) -> bool:
    path = out / RESULTS
    return path.is_file() and path.stat().st_size > 0


def read_identity(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InputError(f"{path} cannot be read ({e}): restore it, or use another --out") from None
    if not isinstance(data, dict):
        raise InputError(f"{path} is not a specbench identity (a JSON object): restore it, or use another --out")
    return data


def claim(out: Path, kind: str, settings: dict, key: str = "config", before: dict | None = None,
          listed: tuple[str, ...] = ()) -> None:
    """Refuse to add `kind` results made with `settings` to `out` unless it has no results yet or
    holds results of the same kind whose identity file has the same `settings` under `key`. `before`:
    settings added since, with the value that reproduces what a folder written without them did.
    `listed`: settings that hold a list now and one value in folders written before (a run setting
    turned into a sweep axis): a stored value is read as a list of one."""
    if not has_results(out):
        return
    found = [k for k, name in IDENTITY_FILES.items() if (out / name).is_file()]
    if not found:
        raise InputError(f"{out} holds {RESULTS} but none of {', '.join(IDENTITY_FILES.values())}: specbench did not write it; "
                         "use another --out")
    if kind not in found:
        raise InputError(f"{out} holds the results of a `specbench {found[0]}`; a {kind} does not add to them: "
                         "use another --out")
    stored = read_identity(out / IDENTITY_FILES[kind]).get(key)
    if stored is None:
        return  # written before this key existed: the check after the models load still applies
    settings = json.loads(json.dumps(settings))  # as stored: tuples -> lists
    stored = {name: [value] if name in listed and not isinstance(value, list) else value
              for name, value in {**(before or {}), **stored}.items()}
    if stored != settings:
        raise InputError(f"{out} holds results of a different {kind} configuration (differs in "
                         f"{differences(stored, settings)}): use another --out, or delete that folder to start over")


def write_identity(out: Path, kind: str, identity: dict) -> None:
    """Write `kind`'s identity file (a folder without results may have been another kind's)."""
    for other, name in IDENTITY_FILES.items():
        if other != kind:
            (out / name).unlink(missing_ok=True)
    (out / IDENTITY_FILES[kind]).write_text(json.dumps(identity, indent=2, ensure_ascii=False), encoding="utf-8")


def differences(stored: dict, settings: dict, shown: int = 4) -> str:
    """`max_new_tokens: 16 there, 8 here; dtype: ...`: what differs, the folder's value first."""
    def show(value) -> str:
        text = json.dumps(value, ensure_ascii=False) if value is not None else "unset"
        return text if len(text) <= 60 else text[:57] + "..."

    keys = sorted(k for k in set(stored) | set(settings) if stored.get(k) != settings.get(k))
    parts = [f"{k}: {show(stored.get(k))} there, {show(settings.get(k))} here" for k in keys[:shown]]
    return "; ".join(parts) + (f"; and {len(keys) - shown} more" if len(keys) > shown else "")
