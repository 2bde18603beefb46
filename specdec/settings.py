"""The engine's named settings, typed: each one an enum of its values, parsed once where a setting enters (the
command line, a TOML file, a sweep's list: specdec/core/config.py's dataclasses and bench's configs call `parse`).

They are `StrEnum`s, so a parsed value still compares, prints, hashes and serialises as its plain name (records,
identities and the protocol keep the words they always had), while code past the boundary holds a type that says
which values exist. This module imports nothing of specdec's but its errors: `core` reads the names a runtime takes
(llama.cpp's extra buffers, the KV caches) from here, not from that runtime's module.
"""
from __future__ import annotations

from enum import StrEnum
from typing import TypeVar

from specdec.errors import ConfigError


class Mode(StrEnum):
    """What a run decodes with: the edge or the cloud model alone (the baselines), or both speculating."""

    EDGE = "edge"
    CLOUD = "cloud"
    SPEC = "spec"  # the edge drafts, the cloud verifies


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


Setting = TypeVar("Setting", bound=StrEnum)


def parse(kind: type[Setting], value: object, name: str) -> Setting:
    """`value` (a word from a flag, a TOML file or a record) as `kind`, or one line naming the setting and its values."""
    try:
        return kind(value)  # type: ignore[arg-type]  # an Enum call looks any value up; typeshed gives StrEnum str's __new__
    except ValueError:
        raise ConfigError(f"unknown {name} {value!r}: use one of {', '.join(kind)}") from None


def parse_fields(config: object, **kinds: type[StrEnum]) -> None:
    """Parse each named field of a frozen dataclass (`config`, in its __post_init__) into its enum, in place."""
    for name, kind in kinds.items():
        object.__setattr__(config, name, parse(kind, getattr(config, name), name))


def choices(kind: type[StrEnum]) -> tuple[str, ...]:
    """The values of `kind` as the words a flag offers (argparse's choices, a config field's metadata)."""
    return tuple(member.value for member in kind)
