"""What a sweep runs: the grid of run settings × prompt sets, plus where it runs (network model,
edge caps). Running it is bench/sweep.py; the `sweep` command's flags come from these fields
(bench/options.py).

Every setting of a run (EngineConfig, SpecConfig, DecodeConfig, PromptInputs) is a field
here under its own name, with the run's default; the grid axes hold tuples of values. Each point
is validated by building the run's own configs from it, before anything runs.
"""
from __future__ import annotations

import itertools
import json
import tomllib
import typing
from dataclasses import dataclass, field, fields
from pathlib import Path

from bench.caps import EdgeCaps
from bench.network import profile
from bench.prompts import PromptInputs
from specdec.config import DecodeConfig, EngineConfig, SpecConfig
from specdec.errors import ConfigError

CONFIGS_DIR = Path(__file__).parent / "configs"


@dataclass(frozen=True)
class SweepConfig:
    edge: str | None = EngineConfig.edge
    cloud: str | None = EngineConfig.cloud
    # The grid, in the order its product is walked (baselines are then run first, see sweep.py).
    mode: tuple[str, ...] = ("cloud", "edge", "spec")
    k: tuple[int, ...] = (SpecConfig.k,)
    entropy_threshold: tuple[float, ...] = (SpecConfig.entropy_threshold,)
    accept_threshold: tuple[float, ...] = (SpecConfig.accept_threshold,)
    policy: tuple[str, ...] = (SpecConfig.policy,)
    verifier: tuple[str, ...] = (SpecConfig.verifier,)
    dtype: tuple[str, ...] = (EngineConfig.dtype,)
    prompts: tuple[str, ...] = ("zh-describe",)
    # The same for every point.
    max_new_tokens: int = DecodeConfig.max_new_tokens
    temperature: float = DecodeConfig.temperature
    seed: int = DecodeConfig.seed
    constraints: str = EngineConfig.constraints
    uncertainty: str = SpecConfig.uncertainty
    punct_trigger: float | None = SpecConfig.punct_trigger
    chat_template: bool = EngineConfig.chat_template
    limit: int | None = PromptInputs.limit
    repeats: int = field(default=1, metadata={
        "help": "timed runs of every (point, prompt), interleaved with the other points; the summary "
                "takes each prompt's median time"})
    max_audio_s: float = PromptInputs.max_audio_s
    network: str = field(default="none", metadata={"help": "none, wifi, 4g, 5g, or rtt=40ms,up=10mbit,down=50mbit"})
    edge_cores: int | None = field(default=None, metadata={"help": "CPU cores of the edge worker"})
    edge_memory_gb: float | None = field(default=None, metadata={
        "help": "edge RSS cap (GiB); a point over it is recorded, the sweep goes on"})
    rlimit_as: bool = field(default=False, metadata={"help": "also cap the address space (RLIMIT_AS)"})

    def __post_init__(self) -> None:
        for axis in AXES:
            if not getattr(self, axis):
                raise ConfigError(f"sweep axis {axis!r} is empty: give at least one value")
        if ("spec" in self.mode or "edge" in self.mode) and not self.edge:
            raise ConfigError("the sweep has edge or spec points but no edge model: set edge = MODEL")
        if ("spec" in self.mode or "cloud" in self.mode) and not self.cloud:
            raise ConfigError("the sweep has cloud or spec points but no cloud model: set cloud = MODEL")
        if self.repeats < 1:
            raise ConfigError(f"repeats must be >= 1, got {self.repeats}")
        for point in self.points():  # every point validates as a run would, before anything runs
            self.engine_config(point)
            self.spec_config(point)
        self.decode_config()
        self.caps()
        profile(self.network)

    @classmethod
    def from_toml(cls, path: Path, **overrides) -> SweepConfig:
        """A TOML file, or the name of a shipped config in bench/configs/ (e.g. `default`)."""
        shipped = CONFIGS_DIR / f"{path}.toml"
        if not Path(path).exists() and shipped.exists():
            path = shipped
        try:
            data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"sweep config {path} not found: check the path") from None
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"sweep config {path} is not valid TOML ({e}): fix that line") from None
        return cls.from_mapping({**data, **{k: v for k, v in overrides.items() if v is not None}}, source=str(path))

    @classmethod
    def from_mapping(cls, data: dict, source: str = "the sweep options") -> SweepConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"{source}: unknown setting {unknown[0]!r}: use one of {', '.join(sorted(known))}")
        values = {}
        for key, value in data.items():
            if key in AXES:
                value = tuple(value) if isinstance(value, (list, tuple)) else (value,)
                cast = NUMERIC_AXES.get(key)
                try:
                    value = tuple(cast(v) for v in value) if cast else value
                except (TypeError, ValueError):
                    raise ConfigError(f"{source}: {key} must be a list of numbers, got {list(value)}") from None
            values[key] = value
        try:
            return cls(**values)
        except TypeError as e:
            raise ConfigError(f"{source}: {e}") from None

    def points(self) -> list[dict]:
        """The grid; edge and cloud points ignore the spec-only axes and appear once."""
        seen, points = set(), []
        for combo in itertools.product(*(getattr(self, axis) for axis in AXES)):
            point = dict(zip(AXES, combo))
            if point["mode"] != "spec":
                point.update({axis: None for axis in SPEC_AXES})
            key = json.dumps(point, sort_keys=True)
            if key not in seen:
                seen.add(key)
                points.append(point)
        return points

    def setting(self, point: dict, name: str):
        """A run setting at `point`: the point's value for an axis (as a number where the axis is
        numeric), else the sweep's."""
        if name not in AXES:
            return getattr(self, name)
        cast = NUMERIC_AXES.get(name)
        return cast(point[name]) if cast else point[name]

    def engine_config(self, point: dict) -> EngineConfig:
        return EngineConfig(**{f.name: self.setting(point, f.name) for f in fields(EngineConfig) if f.name in _SWEPT})

    def spec_config(self, point: dict) -> SpecConfig:
        if point["mode"] != "spec":
            return SpecConfig()
        return SpecConfig(**{f.name: self.setting(point, f.name) for f in fields(SpecConfig) if f.name in _SWEPT})

    def decode_config(self) -> DecodeConfig:
        return DecodeConfig(**{f.name: getattr(self, f.name) for f in fields(DecodeConfig)})

    def caps(self) -> EdgeCaps:
        return EdgeCaps(cores=self.edge_cores, memory_gb=self.edge_memory_gb, rlimit_as=self.rlimit_as)


_HINTS = typing.get_type_hints(SweepConfig)
# A run setting the sweep does not define (yet: cloud_url, draft_stop, ...) keeps the run's default.
_SWEPT = frozenset(f.name for f in fields(SweepConfig))
# The grid axes: the tuple-valued fields, in field order (the order the grid's product is walked).
AXES = tuple(f.name for f in fields(SweepConfig) if typing.get_origin(_HINTS[f.name]) is tuple)
SPEC_AXES = tuple(axis for axis in AXES if axis in {f.name for f in fields(SpecConfig)})  # None outside spec points
NUMERIC_AXES = {axis: typing.get_args(_HINTS[axis])[0] for axis in AXES if typing.get_args(_HINTS[axis])[0] in (int, float)}


def result_key(row: dict) -> str:
    """Which point a result record belongs to."""
    return json.dumps({axis: row.get(axis) for axis in AXES}, sort_keys=True)
