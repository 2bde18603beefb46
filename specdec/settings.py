"""The engine's named settings, typed: each one an enum of its values, parsed once where a setting enters (the
command line, a TOML file, a sweep's list: specdec/core/config.py's dataclasses and bench's configs call `parse`).

They are `StrEnum`s, so a parsed value still compares, prints, hashes and serialises as its plain name (records,
identities and the protocol keep the words they always had), while code past the boundary holds a type that says
which values exist. This module imports nothing of specdec's but its errors: `core` reads the names a runtime takes
(llama.cpp's extra buffers, the KV caches) from here, not from that runtime's module.
"""
from __future__ import annotations

import dataclasses
import functools
import operator
import types
import typing
from enum import StrEnum
from typing import TYPE_CHECKING, Any, TypeVar

from specdec.errors import ConfigError

if TYPE_CHECKING:
    from _typeshed import DataclassInstance


class Mode(StrEnum):
    """What a run decodes with: the edge or the cloud model alone (the baselines), or both speculating."""

    EDGE = "edge"
    CLOUD = "cloud"
    SPEC = "spec"  # the edge drafts, the cloud verifies


class DType(StrEnum):
    """What a torch backend's weights and activations are in (specdec/backends/base.py's DTYPES: the torch dtype)."""

    FLOAT32 = "float32"  # exactness checks; what the registry stores
    BFLOAT16 = "bfloat16"  # the CPU default


class KVCache(StrEnum):
    """A torch model's KV cache (specdec/backends/devices.py's steps_of says what each runs)."""

    AUTO = "auto"  # static with captured steps on CUDA, dynamic on the CPU
    DYNAMIC = "dynamic"  # transformers' DynamicCache
    STATIC = "static"  # preallocated, exact crops by length (static_cache.py)
    COMPILED = "compiled"  # static, its short blocks under torch.compile


class Steps(StrEnum):
    """What runs a torch model's forwards, resolved from KVCache x CudaGraphs x the device (devices.steps_of)."""

    DYNAMIC = "dynamic"  # transformers' DynamicCache, eager
    STATIC = "static"  # a preallocated cache, eager
    COMPILED = "compiled"  # the static cache's forward under torch.compile
    GRAPHS = "graphs"  # the static cache's 1-token and k+1-token forwards replayed as CUDA graphs


class ServerCache(StrEnum):
    """A server's KV cache: its sessions interleave, so no compiled cache (static_slots.py holds them all)."""

    AUTO = "auto"  # static on CUDA (captured), dynamic on the CPU
    DYNAMIC = "dynamic"
    STATIC = "static"


class CudaGraphs(StrEnum):
    """On CUDA with a static cache: replay short forwards as captured graphs, or run them eagerly."""

    ON = "on"
    OFF = "off"


class ExtraBuffers(StrEnum):
    """llama.cpp's extra buffer types (weight repacking, AMX tiles): specdec/backends/llamacpp_probe.py."""

    AUTO = "auto"  # only after a one-time probe in a child process says they run on this machine
    ON = "on"  # llama.cpp's default
    OFF = "off"  # its --no-repack


class OnCloudLoss(StrEnum):
    """What a generation does when its verifier server is lost."""

    FAIL = "fail"  # the prompt is recorded failed
    EDGE = "edge"  # it finishes edge-only, marked degraded


class Overlap(StrEnum):
    """--overlap's third value beside true and false (a bool): draft ahead only while it measurably pays."""

    AUTO = "auto"  # specdec/core/overlap.py's governor decides from the cycles measured so far


class Uncertainty(StrEnum):
    """A draft block's uncertainty from its token entropies (specdec/core/escalation.py)."""

    MAX = "max"  # the most uncertain token
    MEAN = "mean"
    FIRST = "first"  # the block's first token


class Profile(StrEnum):
    """A decoding profile: rules on top of the model's own (specdec/constraint_profiles.py)."""

    NONE = "none"
    ZH = "zh"  # one short Chinese sentence (specdec/core/constraints_zh.py)


Setting = TypeVar("Setting", bound=StrEnum)


def parse(kind: type[Setting], value: object, name: str) -> Setting:
    """`value` (a word from a flag, a TOML file or a record) as `kind`, or one line naming the setting and its values."""
    try:
        return kind(value)  # type: ignore[arg-type]  # an Enum call looks any value up; typeshed gives StrEnum str's __new__
    except ValueError:
        raise ConfigError(f"unknown {name} {value!r}: use one of {', '.join(kind)}") from None


def enum_of(hint: object) -> type[StrEnum] | None:
    """The settings enum a field's type names (`KVCache`, `bool | Overlap`, `Profile | None`, `tuple[Mode, ...]`), or None."""
    if isinstance(hint, type):
        return hint if issubclass(hint, StrEnum) else None
    kinds = [arg for arg in typing.get_args(hint) if isinstance(arg, type) and issubclass(arg, StrEnum)]
    return kinds[0] if kinds else None


def as_words(hint: Any) -> Any:
    """A setting's type as a record or a sweep's grid holds it: each settings enum as the `str` of its word
    (`KVCache` -> str, `bool | Overlap` -> bool | str); other types unchanged."""
    if isinstance(hint, type) and issubclass(hint, StrEnum):
        return str
    args = typing.get_args(hint)
    if isinstance(hint, types.UnionType) and any(enum_of(arg) for arg in args):
        return functools.reduce(operator.or_, dict.fromkeys(as_words(arg) for arg in args))
    return hint


def parse_fields(config: DataclassInstance) -> None:
    """Parse every field of a frozen dataclass (`config`, in its __post_init__) that its type declares a settings enum
    into that enum, in place: a word from a flag, a TOML file or a record becomes its member, or one line naming the
    field and its values. Other values of a union (`bool | Overlap`'s True, `Profile | None`'s None) stay."""
    hints = typing.get_type_hints(type(config))
    for f in dataclasses.fields(config):
        kind, value = enum_of(hints[f.name]), getattr(config, f.name)
        if kind is not None and isinstance(value, str) and not isinstance(value, kind):
            object.__setattr__(config, f.name, parse(kind, value, f.name))


_SWITCH_WORDS = {"true": True, "on": True, "yes": True, "1": True, "false": False, "off": False, "no": False, "0": False}


def parse_switch(value: object) -> bool:
    """A true/false setting from TOML (a bool) or a flag's word (true/false, on/off, yes/no, 1/0); ValueError for
    anything else."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text not in _SWITCH_WORDS:
        raise ValueError(value)
    return _SWITCH_WORDS[text]


def choices(kind: type[StrEnum]) -> tuple[str, ...]:
    """The values of `kind` as the words a flag offers (argparse's choices, a config field's metadata)."""
    return tuple(member.value for member in kind)
