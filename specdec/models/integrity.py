"""Is a model folder whole? Two checks, both cheap unless asked otherwise:

- against a record: the size and sha256 of each file, written into the folder's marker when it
  was converted (`record`); sizes are compared on every use, hashes by `specbench models verify`;
- against itself: a safetensors file starts with an 8-byte header length and a JSON header whose
  tensor offsets say how long the file must be, so a truncated or padded file is caught even in
  a folder nobody recorded (a local directory, a cache fetched before records existed).

Each problem is one line naming the file and what is wrong with it.
"""
from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path

MAX_HEADER_BYTES = 100 << 20  # safetensors' own limit on the JSON header


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def record(folder: Path, skip: tuple[str, ...] = ()) -> dict[str, dict]:
    """{file name: {size, sha256}} of the files directly in `folder` (not `skip`, not subfolders)."""
    return {path.name: {"size": path.stat().st_size, "sha256": sha256_of(path)}
            for path in sorted(Path(folder).iterdir()) if path.is_file() and path.name not in skip}


def safetensors_problem(path: Path) -> str | None:
    """Why `path` is not a whole safetensors file, or None."""
    size = path.stat().st_size
    try:
        with open(path, "rb") as f:
            (header_bytes,) = struct.unpack("<Q", f.read(8))
            if header_bytes > min(MAX_HEADER_BYTES, size - 8):
                return f"{path.name} is truncated or not a safetensors file ({size} bytes, header of {header_bytes})"
            header = json.loads(f.read(header_bytes))
    except (struct.error, ValueError, UnicodeDecodeError):
        return f"{path.name} is truncated or not a safetensors file (unreadable header, {size} bytes)"
    ends = [entry["data_offsets"][1] for name, entry in header.items()
            if name != "__metadata__" and isinstance(entry, dict) and "data_offsets" in entry]
    expected = 8 + header_bytes + max(ends, default=0)
    if size != expected:
        return f"{path.name} is {'truncated' if size < expected else 'longer than its header says'} " \
               f"({size} of {expected} bytes)"
    return None


def problems(folder: Path, recorded: dict[str, dict] | None, hashes: bool = False) -> list[str]:
    """What is wrong with `folder`: recorded files missing, of another size (or, with `hashes`,
    other bytes), and safetensors files that are not whole. Empty when it is whole."""
    folder = Path(folder)
    found = []
    for name, expected in (recorded or {}).items():
        path = folder / name
        if not path.is_file():
            found.append(f"{name} is missing")
        elif path.stat().st_size != expected["size"]:
            found.append(f"{name} has {path.stat().st_size} bytes, {expected['size']} when it was converted")
        elif hashes and sha256_of(path) != expected["sha256"]:
            found.append(f"{name} has other bytes than when it was converted (sha256 differs)")
    for path in sorted(folder.glob("*.safetensors")):
        if (problem := safetensors_problem(path)) and not any(p.startswith(path.name + " ") for p in found):
            found.append(problem)
    return found
