"""Model aliases: the registry in `models.toml`, where fetched models live, and name resolution.

`resolve(name)` accepts a local directory, a registry alias (fetched and converted on first
use, see `specdec.fetch`) or a hub id (`org/name`, passed through for the caller to try).
"""
from __future__ import annotations

import json
import os
import re
import tomllib
from dataclasses import dataclass, fields
from functools import lru_cache
from pathlib import Path
from typing import Callable

from specdec.errors import ModelError

REGISTRY = Path(__file__).with_name("models.toml")
MARKER = "specbench.json"  # written last into a converted dir: its presence means "complete"

_PIN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*==[0-9][A-Za-z0-9.+!-]*$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
# Hub ids as the hub validates them: two names that start with a letter or digit.
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$")


@dataclass(frozen=True)
class ModelEntry:
    alias: str
    upstream: str
    family: str
    format: str
    gguf_file: str
    parts: tuple[str, ...]  # "package==version", in join order
    size: int  # bytes of the joined file
    sha256: str
    dtype: str  # of the converted safetensors copy
    license: str
    role: str  # "edge" | "cloud"
    partner: str

    def __post_init__(self) -> None:
        def bad(why: str) -> ModelError:
            return ModelError(f"model registry entry {self.alias!r}: {why}")

        for name in ("upstream", "family", "format", "gguf_file", "sha256", "dtype", "license", "role", "partner"):
            if not (isinstance(getattr(self, name), str) and getattr(self, name)):
                raise bad(f"{name} must be a non-empty string")
        if self.format != "gguf":
            raise bad(f"format {self.format!r} is not supported (only 'gguf')")
        if "/" in self.gguf_file or not self.gguf_file.endswith(".gguf"):
            raise bad(f"gguf_file {self.gguf_file!r} must be a bare file name ending in .gguf")
        if not (isinstance(self.parts, tuple) and self.parts and all(isinstance(p, str) and _PIN.match(p) for p in self.parts)):
            raise bad(f"parts must be a non-empty list of exact pins 'package==version', got {self.parts!r}")
        if len(set(self.parts)) != len(self.parts):
            raise bad("parts lists a package twice")
        if isinstance(self.size, bool) or not isinstance(self.size, int) or self.size <= 0:
            raise bad(f"size must be a positive number of bytes, got {self.size!r}")
        if not _SHA256.match(self.sha256):
            raise bad(f"sha256 must be 64 lowercase hex digits, got {self.sha256!r}")
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise bad(f"dtype {self.dtype!r} must be float32, bfloat16 or float16")
        if self.role not in ("edge", "cloud"):
            raise bad(f"role {self.role!r} must be 'edge' or 'cloud'")


def load_registry(path: Path = REGISTRY) -> dict[str, ModelEntry]:
    """Parse and validate a registry file; any problem raises ModelError naming the entry."""
    try:
        data = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ModelError(f"cannot read the model registry {path}: {e}") from e
    known = {f.name for f in fields(ModelEntry)} - {"alias"}
    entries = {}
    for alias, raw in data.items():
        if not isinstance(raw, dict):
            raise ModelError(f"model registry {path}: {alias!r} must be a [table], not a value")
        # Catch typos: a misspelt optional key would otherwise be silently ignored.
        if unknown := sorted(raw.keys() - known):
            raise ModelError(f"model registry entry {alias!r}: unknown keys {unknown}; allowed: {sorted(known)}")
        if missing := sorted(known - raw.keys()):
            raise ModelError(f"model registry entry {alias!r}: missing keys {missing}")
        parts = raw["parts"]
        entries[alias] = ModelEntry(alias=alias, **{**raw, "parts": tuple(parts) if isinstance(parts, list) else parts})
    for e in entries.values():
        if e.partner not in entries or e.partner == e.alias:
            raise ModelError(f"model registry entry {e.alias!r}: partner {e.partner!r} is not another entry")
    return entries


@lru_cache(maxsize=1)
def _registry() -> dict[str, ModelEntry]:
    return load_registry()


def list_models() -> list[ModelEntry]:
    return list(_registry().values())


def get(alias: str) -> ModelEntry:
    try:
        return _registry()[alias]
    except KeyError:
        raise ModelError(_unknown(alias)) from None


def home() -> Path:
    return Path(os.environ.get("SPECBENCH_HOME") or Path.home() / ".cache" / "specbench").expanduser()


def model_dir(alias: str) -> Path:
    return home() / "models" / get(alias).alias


def is_fetched(alias: str) -> bool:
    """True once the converted copy is complete and was made from the registry's pinned file."""
    marker = model_dir(alias) / MARKER
    try:
        return json.loads(marker.read_text()).get("sha256") == get(alias).sha256
    except (OSError, ValueError):
        return False


def resolve(name: str, *, fetch: bool = True, log: Callable[[str], object] = print) -> Path | str:
    """A local directory, a registry alias (its converted directory) or a hub id (unchanged)."""
    if Path(name).expanduser().is_dir():
        return Path(name).expanduser()
    if name in _registry():
        if is_fetched(name):
            return model_dir(name)
        if not fetch:
            raise ModelError(f"model {name!r} is not fetched yet: run `specbench models fetch {name}`")
        from specdec.fetch import fetch as fetch_model  # heavy imports only when needed

        return fetch_model(name, log=log)
    if name.startswith(("/", ".", "~")):
        raise ModelError(f"model directory {name!r} does not exist: check the path")
    if _HUB_ID.match(name):
        return name
    raise ModelError(_unknown(name))


def _unknown(name: str) -> str:
    aliases = ", ".join(_registry())
    return (
        f"unknown model {name!r}: use a local directory, a hub id, or one of: {aliases} "
        "(see `specbench models list`)"
    )
