"""Model aliases: the registry in `models.toml` and where fetched models live.

Names are resolved to locations by `specdec.models.loading.resolve` (a local directory, an alias
fetched on first use by `specdec.models.fetch`, or a hub id).
"""
from __future__ import annotations

import json
import os
import re
import tomllib
from dataclasses import dataclass, replace
from enum import StrEnum
from functools import lru_cache
from pathlib import Path

from specdec.errors import ModelError
from specdec.models import integrity
from specdec.models.derive import parse_ops
from specdec.runtime_registry import default_runtime

REGISTRY = Path(__file__).with_name("models.toml")
MARKER = "specbench.json"  # written last into a converted dir: its presence means "complete"

_PIN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*==[0-9][A-Za-z0-9.+!-]*$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_INNER_PATH = re.compile(r"^[A-Za-z0-9_][\w.-]*(/[\w.-]+)*$")


class Format(StrEnum):
    """What a registry entry's pinned file is."""

    GGUF = "gguf"  # a llama.cpp file, dequantized to safetensors for torch
    CT2 = "ct2"  # a CTranslate2 Whisper model.bin, converted to Hugging Face's layout


class State(StrEnum):
    """Where a registry model's converted copy stands (`state`)."""

    FETCHED = "fetched"
    NOT_FETCHED = "not fetched"
    DAMAGED = "damaged"  # a converted copy whose files changed since


FORMATS = tuple(Format)
COMMON_KEYS = ("upstream", "family", "format", "parts", "size", "sha256", "dtype", "license", "role", "partner")
FORMAT_KEYS = {"gguf": ("gguf_file",), "ct2": ("join", "files")}
DERIVED_KEYS = ("from", "derive", "role", "partner")
CT2_NEEDS = {"whisper": ("config.json", "tokenizer.json")}  # side files each family's converter reads
JOINED_CT2 = "model.bin"


@dataclass(frozen=True)
class ModelEntry:
    alias: str
    upstream: str
    family: str
    format: Format  # a derived entry has its base's
    parts: tuple[str, ...]  # "package==version", in join order
    size: int  # bytes of the joined file
    sha256: str  # of the joined file
    dtype: str  # of the converted safetensors copy
    license: str
    role: str  # "edge" | "cloud"
    partner: str
    gguf_file: str = ""  # gguf: name of the joined file
    join: tuple[str, ...] = ()  # ct2: files inside the installed parts, concatenated in order into model.bin
    files: tuple[tuple[str, str], ...] = ()  # ct2: (file inside the installed parts, its sha256), copied beside it
    base: str = ""  # derived: the entry it is derived from at load time ...
    derive: str = ""  # ... by these ops (specdec.models.derive), e.g. "dec2" or "int8"

    def __post_init__(self) -> None:
        def bad(why: str) -> ModelError:
            return ModelError(f"model registry entry {self.alias!r}: {why}")

        for name in ("upstream", "family", "format", "sha256", "dtype", "license", "role", "partner"):
            if not (isinstance(getattr(self, name), str) and getattr(self, name)):
                raise bad(f"{name} must be a non-empty string")
        if self.format not in FORMATS:
            raise bad(f"format {self.format!r} is not supported: use 'gguf' or 'ct2'")
        object.__setattr__(self, "format", Format(self.format))
        if self.format == Format.GGUF and ("/" in self.gguf_file or not self.gguf_file.endswith(".gguf")):
            raise bad(f"gguf_file {self.gguf_file!r} must be a bare file name ending in .gguf")
        pinned = all(isinstance(p, str) and _PIN.match(p) for p in self.parts) if isinstance(self.parts, tuple) else False
        if not (self.parts and pinned):
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
        if self.format == Format.CT2:
            self._check_ct2(bad)
        if self.derive:
            try:
                parse_ops(self.derive)
            except ModelError as e:
                raise bad(str(e)) from None

    def _check_ct2(self, bad) -> None:
        paths = list(self.join) + [path for path, _ in self.files]
        if not (isinstance(self.join, tuple) and self.join):
            raise bad(f"join must be a non-empty list of files inside the parts, got {self.join!r}")
        for path in paths:
            if not (isinstance(path, str) and _INNER_PATH.match(path)) or ".." in path.split("/"):
                raise bad(f"{path!r} must be a relative path inside an installed part (no '..')")
        for path, sha256 in self.files:
            if not (isinstance(sha256, str) and _SHA256.match(sha256)):
                raise bad(f"files: the sha256 of {path!r} must be 64 lowercase hex digits, got {sha256!r}")
        names = [path.rsplit("/", 1)[-1] for path, _ in self.files]
        if len(set(names)) != len(names) or JOINED_CT2 in names:
            raise bad(f"files must have distinct names other than {JOINED_CT2}, got {names}")
        if missing := sorted(set(CT2_NEEDS.get(self.family, ())) - set(names)):
            raise bad(f"a {self.family} ct2 model needs files named {missing}")

    @property
    def joined_file(self) -> str:
        """Name of the verified joined file in the parts work dir."""
        return self.gguf_file if self.format == Format.GGUF else JOINED_CT2

    @property
    def load_name(self) -> str:
        """What `specdec.models.loading` loads: `base@ops` for a derived entry, else the alias itself."""
        return f"{self.base}@{self.derive}" if self.base else self.alias


def _entry(alias: str, raw: dict) -> ModelEntry:
    every = set(COMMON_KEYS).union(*FORMAT_KEYS.values())
    if unknown := sorted(raw.keys() - every):  # typos first: a misspelt key is the likelier mistake
        raise ModelError(f"model registry entry {alias!r}: unknown keys {unknown}; allowed: {sorted(every)}")
    fmt = raw.get("format")
    if fmt not in FORMAT_KEYS:
        raise ModelError(f"model registry entry {alias!r}: format {fmt!r} is not supported: use 'gguf' or 'ct2'")
    known = set(COMMON_KEYS) | set(FORMAT_KEYS[fmt])
    _check_keys(alias, raw, known)
    values = dict(raw)
    for key in ("parts", "join"):
        if isinstance(values.get(key), list):
            values[key] = tuple(values[key])
    if "files" in values:
        if not isinstance(values["files"], dict):
            raise ModelError(f"model registry entry {alias!r}: files must be a table of path = sha256")
        values["files"] = tuple(values["files"].items())
    return ModelEntry(alias=alias, **values)


def _check_keys(alias: str, raw: dict, known: set[str]) -> None:
    # Catch typos: a misspelt optional key would otherwise be silently ignored.
    if unknown := sorted(raw.keys() - known):
        raise ModelError(f"model registry entry {alias!r}: unknown keys {unknown}; allowed: {sorted(known)}")
    if missing := sorted(known - raw.keys()):
        raise ModelError(f"model registry entry {alias!r}: missing keys {missing}")


def load_registry(path: Path = REGISTRY) -> dict[str, ModelEntry]:
    """Parse and validate a registry file; any problem raises ModelError naming the entry.
    A derived entry (`from`, `derive`, `role`, `partner`) takes everything else from its base."""
    try:
        data = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ModelError(f"cannot read the model registry {path}: {e}") from e
    entries, derived = {}, {}
    for alias, raw in data.items():
        if not isinstance(raw, dict):
            raise ModelError(f"model registry {path}: {alias!r} must be a [table], not a value")
        if "derive" in raw or "from" in raw:
            _check_keys(alias, raw, set(DERIVED_KEYS))
            derived[alias] = raw
        else:
            entries[alias] = _entry(alias, raw)
    for alias, raw in derived.items():
        base = entries.get(raw["from"])
        if base is None:
            raise ModelError(f"model registry entry {alias!r}: from {raw['from']!r} is not a fetched (non-derived) entry")
        entries[alias] = replace(base, alias=alias, role=raw["role"], partner=raw["partner"], base=base.alias,
                                 derive=raw["derive"])
    entries = {alias: entries[alias] for alias in data}  # file order
    for entry in entries.values():
        if entry.partner not in entries or entry.partner == entry.alias:
            raise ModelError(f"model registry entry {entry.alias!r}: partner {entry.partner!r} is not another entry")
    return entries


@lru_cache(maxsize=1)
def _registry() -> dict[str, ModelEntry]:
    return load_registry()


def list_models() -> list[ModelEntry]:
    return list(_registry().values())


def is_alias(name: str) -> bool:
    return name in _registry()


def get(alias: str) -> ModelEntry:
    try:
        return _registry()[alias]
    except KeyError:
        raise ModelError(unknown_model(alias)) from None


def home() -> Path:
    path = Path(os.environ.get("SPECBENCH_HOME") or Path.home() / ".cache" / "specbench").expanduser()
    if path.exists() and not path.is_dir():
        raise ModelError(f"the model cache {path} (SPECBENCH_HOME) is a file, not a folder: point SPECBENCH_HOME at a "
                         "folder, or unset it for ~/.cache/specbench")
    return path


def model_dir(alias: str) -> Path:
    """Where the converted copy lives; a derived entry shares its base's."""
    entry = get(alias)
    return home() / "models" / (entry.base or entry.alias)


def gguf_path(alias: str) -> Path:
    """Where a GGUF entry's joined, checksum-verified file is kept after conversion (llama.cpp runs
    it as shipped); a derived entry shares its base's."""
    entry = get(alias)
    if entry.format != Format.GGUF:
        raise ModelError(f"model {alias!r} is a {entry.format} ({entry.family}) model, not a GGUF file: "
                         f"runtime {default_runtime('.gguf')} runs GGUF entries or a .gguf path")
    return home() / "gguf" / entry.gguf_file


def expand(name: str) -> str:
    """A derived alias -> `base@ops` (see specdec.models.derive); any other name unchanged."""
    entry = _registry().get(name)
    return entry.load_name if entry else name


def read_marker(folder: Path, name: str = MARKER) -> dict | None:
    """The marker `name` of a converted folder (written last: present means complete), or None."""
    try:
        marker = json.loads((Path(folder) / name).read_text())
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) else None


def damage(alias: str, hashes: bool = False) -> str | None:
    """What is wrong with the converted copy of `alias` (its files against the sizes, and with
    `hashes` the sha256, recorded when it was converted; its safetensors headers), or None."""
    folder = model_dir(alias)
    marker = read_marker(folder)
    if marker is None or marker.get("sha256") != get(alias).sha256:
        return "not fetched, or fetched from another pin"
    found = integrity.problems(folder, marker.get("files"), hashes=hashes)
    return "; ".join(found) if found else None


def state(alias: str) -> State:
    """Whether the converted copy is fetched, not fetched, or damaged (its files changed since)."""
    marker = read_marker(model_dir(alias))
    if marker is None or marker.get("sha256") != get(alias).sha256:
        return State.NOT_FETCHED
    return State.DAMAGED if damage(alias) else State.FETCHED


def is_fetched(alias: str) -> bool:
    """True once the converted copy is complete, was made from the registry's pinned file, and its
    files still have the sizes recorded then (hashes: `specbench models verify`)."""
    return state(alias) == State.FETCHED


def refetch_hint(alias: str) -> str:
    """One line for a damaged cache: what is wrong and the command that repairs it."""
    base = get(alias).base or alias
    return (f"the cached copy of {alias!r} in {model_dir(alias)} is damaged ({damage(alias)}): run `specbench models "
            f"fetch {base}` to fetch it again")


def unknown_model(name: str) -> str:
    aliases = ", ".join(_registry())
    return (
        f"unknown model {name!r}: use a local directory, a hub id, or one of: {aliases} "
        "(see `specbench models list`)"
    )
