"""What a sweep runs: the grid of run settings × prompt sets, plus where it runs (network model,
edge caps). Running it is bench/measure/sweep/sweep.py; the `sweep` command's flags come from these fields
(bench/commands/options.py).

Every setting of a run (EngineConfig, SpecConfig, DecodeConfig, DeployConfig, PromptInputs) is a
field here under its own name, with the run's default, generated from them; the grid axes (the
point's fields that take lists, bench/core/point.py's AXES) hold tuples of values. Each point is
validated by building the run's own configs from it, before anything runs.
"""
from __future__ import annotations

import itertools
import json
import os
import tomllib
import typing
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields, make_dataclass, replace
from enum import StrEnum
from pathlib import Path
from types import GenericAlias
from typing import Any

from bench.core.folder import canonical_path
from bench.core.network import NO_LINK, profile
from bench.core.point import (
    AXES,
    FIELDS,
    RUNTIME_OF,
    SETTING_TYPES,
    SETTINGS,
    Deployment,
    Point,
    SplitCores,
    blank,
    given,
)
from bench.core.prompts import PromptInputs, canonical_prompts, expand_prompt_sets, rejoin_categories
from bench.measure.caps import EdgeCaps
from bench.measure.runtime_auto import has_auto
from specdec.backends.devices import KV_CACHES
from specdec.core.config import (
    PAIR_EXAMPLE,
    DecodeConfig,
    DeployConfig,
    EngineConfig,
    SpecConfig,
    check_types,
    parse_overlap,
)
from specdec.core.drafters import DRAFTS_AHEAD, WEIGHS_RUNTIMES
from specdec.errors import ConfigError, InputError
from specdec.remote.protocol import parse_address
from specdec.runtime_registry import canonical_runtime, check_name, runtime_parts
from specdec.settings import Mode, choices, enum_of, parse, parse_switch

CONFIGS_DIR = Path(__file__).parents[2] / "configs"


class Executor(StrEnum):
    """What runs a sweep's points (SweepConfig.executor)."""

    LOCAL = "local"  # worker processes on this machine
    RAY = "ray"  # each group of points as Ray tasks on a cluster


EXECUTORS = choices(Executor)
SPLIT_CORES = choices(SplitCores)
# --ray-address auto: the cluster `ray start` runs on this machine (any other address is HOST:PORT of its head).
RAY_HERE = "auto"
# The deployments whose cloud runs on the cloud's cores: a split point's server, and a co-located point
# (the same pair in one process, pinned where that server runs).
ON_CLOUD_CORES = (Deployment.SPLIT, Deployment.COLOCATED)
# Where a sweep runs, not what it measures: left out of the results folder's identity, so a sweep
# started on a cluster resumes on a laptop and the other way round.
PLACEMENT = ("executor", "ray_address")
# The sweep's own default where a run has none, or where a sweep's differs from a run's.
SWEEP_DEFAULTS = {"mode": (Mode.CLOUD, Mode.EDGE, Mode.SPEC), "prompts": ("zh-describe",), "link": (NO_LINK,)}
SWEEP_HELP = {"cloud_url": "split points: verify on this running server instead of starting one"}


def _run_settings() -> list[tuple[str, object, object]]:
    """Every run setting (bench/core/point.py's RUN_SETTINGS) and point field as a sweep field under its
    own name, with the run's default; a point axis (AXES) holds a tuple of values."""
    generated: list[tuple[str, object, object]] = []
    seen: set[str] = set()
    for name, f in SETTINGS.items():
        if name in seen or not f.init:
            continue
        seen.add(name)
        hint = SETTING_TYPES[name]
        metadata = {**f.metadata, "help": SWEEP_HELP[name]} if name in SWEEP_HELP else f.metadata
        if name in AXES:
            values = [t for t in typing.get_args(hint) if t is not type(None)]
            value = values[0] if len(values) == 1 else hint  # `bool | str` (overlap) stays a union
            default = SWEEP_DEFAULTS.get(name, (f.default,))
            generated.append((name, GenericAlias(tuple, (value, ...)), field(default=default, metadata=metadata)))
        else:
            generated.append((name, hint, field(default=SWEEP_DEFAULTS.get(name, f.default), metadata=metadata)))
    return generated


# The run settings, generated: a setting added to specdec/core/config.py (or an axis added to AXES) is here at once.
RunSettings: Any = make_dataclass("RunSettings", _run_settings(), frozen=True)


@dataclass(frozen=True)
class SweepConfig(RunSettings):
    """The grid of run settings × prompt sets (RunSettings, the axes as tuples, in bench/core/point.py's
    grid order), plus where it runs: split points get a `specbench serve` the sweep starts for the cloud
    model (or cloud_url) and a shaped link per `link` preset; overlap = draft while a verify is in flight."""

    repeats: int = field(default=1, metadata={
        "help": "timed runs of every (point, prompt), interleaved with the other points; the summary "
                "takes each prompt's median time"})
    cloud_cores: int | None = field(default=None, metadata={
        "help": "split points: CPU cores of the server the sweep starts (the machine's last N; --edge-cores takes "
                "the first N)"})
    network: str = field(default=NO_LINK, metadata={
        "help": "modelled network for in-process points (split points are modelled on their link): "
                "none, wifi, 4g, 5g, or rtt=40ms,up=10mbit,down=50mbit"})
    edge_cores: int | None = field(default=None, metadata={"help": "CPU cores of the edge worker"})
    split_cores: SplitCores = field(default=SplitCores.DISJOINT, metadata={
        "help": "split and co-located points: disjoint gives the edge and the server cores of their own, as two "
                "machines have (the first half / the rest unless --edge-cores / --cloud-cores say; threads = cores); "
                "shared lets both use every core (the report labels it shared)", "choices": SPLIT_CORES})
    edge_memory_gb: float | None = field(default=None, metadata={
        "help": "edge RSS cap (GiB); a point over it is recorded, the sweep goes on"})
    rlimit_as: bool = field(default=False, metadata={"help": "also cap the address space (RLIMIT_AS)"})
    plain_runtimes: tuple[str, ...] = field(default=(), metadata={
        "help": "also time plain decoding (the cloud-only and edge-only points) in these runtimes, beside the grid's "
                "edge and cloud runtimes, so every speed-up can name the fastest plain decoding; speculative points "
                f"keep the grid's runtimes (e.g. {PAIR_EXAMPLE.replace('+', ',')})"})
    rows: tuple[dict, ...] = field(default=(), metadata={"toml_only": True, "help": (
        "more points beside the grid, one TOML table each ([[rows]]): axes to override, as lists, e.g. "
        "drafter = [\"prompt-lookup\"], k = [4]; the other axes keep the grid's values. For what the grid's "
        "product would multiply needlessly: a draft-free drafter has no entropy, so every threshold is one point")})
    executor: Executor = field(default=Executor.LOCAL, metadata={
        "help": "local: worker processes on this machine; ray: each group of points as Ray tasks on a cluster "
                "(pip install -e '.[cluster]')", "choices": EXECUTORS})
    ray_address: str | None = field(default=None, metadata={
        "help": "--executor ray: the cluster to join, auto (the one `ray start` runs here) or HOST:PORT of its "
                "head; unset: start a Ray instance sized to this machine"})

    def __post_init__(self) -> None:
        self._parse_settings()
        check_types(self)
        for axis in AXES:
            if not getattr(self, axis):
                raise ConfigError(f"sweep axis {axis!r} is empty: give at least one value")
        if (Mode.SPEC in self.mode or Mode.EDGE in self.mode) and not self.edge:
            raise ConfigError("the sweep has edge or spec points but no edge model: set edge = MODEL")
        if (Mode.SPEC in self.mode or Mode.CLOUD in self.mode) and not self.cloud:
            raise ConfigError("the sweep has cloud or spec points but no cloud model: set cloud = MODEL")
        for link in self.link:
            profile(link)
        if self.cloud_cores is not None and not 1 <= self.cloud_cores <= len(os.sched_getaffinity(0)):
            raise ConfigError(f"--cloud-cores must be between 1 and {len(os.sched_getaffinity(0))}, got {self.cloud_cores}")
        self.core_counts()
        if Deployment.SPLIT in self.deployment and any(len(runtime_parts(r)) > 1 for r in self.cloud_runtime):
            raise ConfigError("a cloud held in two runtimes (cloud_runtime PLAIN+BLOCKS) runs in process: a split "
                              "point's server runs one runtime; drop deployment split or give single runtimes")
        if self.cloud_url and len(self.cloud_runtime) > 1 and Deployment.SPLIT in self.deployment:
            raise ConfigError("--cloud-url is one running server, in the runtime it was started with: give one "
                              "--cloud-runtime (what that server runs), or drop --cloud-url and the sweep starts a "
                              "server per runtime")
        self._check_executor()
        if self.repeats < 1:
            raise ConfigError(f"repeats must be >= 1, got {self.repeats}")
        for row in self.rows:
            if not isinstance(row, dict) or not row or set(row) - set(AXES):
                bad = sorted(set(row) - set(AXES)) if isinstance(row, dict) else [repr(row)]
                raise ConfigError(f"rows: each row is a table of grid axes ({', '.join(AXES)}) to override"
                                  + (f", not {bad[0]!r}" if bad else ", not an empty one"))
        for runtime in self.plain_runtimes:
            check_name(runtime, "plain runtime")
        self._check_kv_caches()
        for point in self.points():  # every point validates as a run would, before anything runs
            self.engine_config(point)
            self.spec_config(point)
            self.deploy_config(point)
            self.decode_config(point)
        for prompts in self.prompt_sets():
            PromptInputs(prompts, self.limit, self.max_audio_s, self.turns)
        if self.executor == Executor.LOCAL:  # on a cluster the caps are checked against the node a task lands on
            self.caps()
        profile(self.network)

    def _parse_settings(self) -> None:
        """Each field typed as a setting's enum (ENUM_FIELDS) parsed into it, each value of an axis's tuple, before
        check_types: a TOML file and the flags give words, an unknown one is one line naming the setting."""
        for name, kind in ENUM_FIELDS.items():
            value = getattr(self, name)
            if isinstance(value, tuple):
                object.__setattr__(self, name, tuple(parse(kind, v, name) for v in value))
            elif name not in AXES and value is not None:  # an axis that is no tuple is check_types' to name
                object.__setattr__(self, name, parse(kind, value, name))

    def _check_kv_caches(self) -> None:
        """Every kv_cache asked for (the grid's and the rows') is a cache, and changes what some point runs."""
        in_rows = [cache for row in self.rows for cache in _axis_values("kv_cache", row.get("kv_cache", ()))]
        asked = dict.fromkeys([*self.kv_cache, *in_rows])
        unknown = [cache for cache in asked if cache not in KV_CACHES]
        if unknown:
            raise ConfigError(f"unknown kv_cache {unknown[0]!r}: use one of {', '.join(KV_CACHES)}")
        used = {point.kv_cache for point in self.points()}
        unused = [cache for cache in asked if cache not in used]
        if unused:
            raise ConfigError(f"kv_cache {unused[0]} changes no point of this sweep: it is the KV cache of the torch "
                              "models a point runs in its own process, and the points given it run none (llama.cpp, "
                              "ONNX Runtime, OpenVINO and the int8 runtimes keep their own caches, a split point's "
                              "cloud runs in its server, a draft-free drafter needs no edge model): drop it from "
                              "--kv-cache, or add torch to --cloud-runtime or --edge-runtime")

    def _check_executor(self) -> None:
        if self.ray_address is not None and self.executor != Executor.RAY:
            raise ConfigError("--ray-address is for --executor ray: add --executor ray, or drop --ray-address")
        if self.executor != Executor.RAY:
            return
        if self.ray_address not in (None, RAY_HERE):
            parse_address(self.ray_address, "--ray-address")
        if self.places_cloud():
            raise ConfigError("--executor ray runs in-process points only: a split point's server and shaped link run "
                              "beside the sweep's driver, out of reach of the cluster's tasks (and a co-located point is "
                              "pinned to that server's cores); run split points with --executor local")
        if self.edge_cores is not None and self.edge_cores < 1:
            raise ConfigError(f"--edge-cores must be >= 1, got {self.edge_cores}")
        if self.edge_memory_gb is not None and not self.edge_memory_gb > 0:
            raise ConfigError(f"--edge-memory-gb must be > 0, got {self.edge_memory_gb}")

    def identity(self) -> dict:
        """The settings a results folder is bound to (bench/core/folder.py), as stored: tuples as lists."""
        return {k: v for k, v in json.loads(json.dumps(asdict(self))).items() if k not in PLACEMENT}

    @classmethod
    def from_toml(cls, path: Path, choose_runtimes=None, **overrides) -> SweepConfig:
        """A TOML file, or the name of a shipped config in bench/configs/ (e.g. `default`);
        `choose_runtimes` as in from_mapping."""
        shipped = CONFIGS_DIR / f"{path}.toml"
        if not Path(path).exists() and shipped.exists():
            path = shipped
        try:
            data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"sweep config {path} not found: check the path") from None
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"sweep config {path} is not valid TOML ({e}): fix that line") from None
        return cls.from_mapping({**data, **{k: v for k, v in overrides.items() if v is not None}},
                                source=f"sweep config {path}", choose_runtimes=choose_runtimes)

    @classmethod
    def from_mapping(cls, data: dict, source: str = "the sweep options", choose_runtimes=None) -> SweepConfig:
        """Settings from a TOML table or flags: axis values are parsed (flags give text), every
        other value must already have its field's type (checked in __post_init__). `auto` in
        edge_runtime, cloud_runtime or plain_runtimes is replaced by `choose_runtimes(settings)`
        (bench/measure/runtime_auto.py: from the machine's calibration) before anything validates."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"{source}: unknown setting {unknown[0]!r}: use one of {', '.join(sorted(known))}")
        if has_auto(data):
            if choose_runtimes is None:
                raise ConfigError(f"{source}: runtime auto is chosen from the machine's calibration by `specbench "
                                  "sweep`; here name the runtimes")
            data = choose_runtimes(data)
        values = {}
        for key, value in data.items():
            if key in AXES:
                value = tuple(value) if isinstance(value, (list, tuple)) else (value,)
                cast = NUMERIC_AXES.get(key)
                try:
                    value = tuple(cast(v) for v in value) if cast else value
                except (TypeError, ValueError):
                    kinds: dict[object, str] = {parse_switch: "true/false values", parse_int: "integers",
                                                parse_overlap: "auto/true/false values"}
                    kind = kinds.get(cast, "numbers")
                    raise ConfigError(f"{source}: {key} must be a list of {kind}, got {list(value)}") from None
            elif isinstance(value, list) and typing.get_origin(_HINTS.get(key)) is tuple:
                value = tuple(value)  # a TOML list for a list-valued setting (plain_runtimes)
            if key in ("edge_runtime", "cloud_runtime", "plain_runtimes"):  # an old runtime name is today's
                value = tuple(canonical_runtime(v) for v in value) if isinstance(value, tuple) else value
            values[key] = value
        for key in ("edge", "cloud", "token_file"):  # one folder, one name (see bench/core/folder.py)
            if isinstance(values.get(key), str):
                values[key] = canonical_path(values[key])
        tables = [values] + [row for row in values.get("rows", ()) if isinstance(row, dict) and "prompts" in row]
        for table in tables:  # the grid's prompt sets and each row's, named alike
            names = table.get("prompts")
            names = [names] if isinstance(names, str) else names
            if names is not None and all(isinstance(p, str) for p in names):
                try:  # Spec-Bench's questions stand for one prompt set per category
                    table["prompts"] = tuple(s for p in rejoin_categories(tuple(names))
                                             for s in expand_prompt_sets(canonical_prompts(p)))
                except InputError as e:
                    raise ConfigError(f"{source}: {e}") from None
        try:
            return cls(**values)
        except (TypeError, ConfigError) as e:
            raise ConfigError(f"{source}: {e}") from None

    def prompt_sets(self) -> tuple[str, ...]:
        """Every prompt set the grid and its rows run, the grid's first."""
        in_rows = [p for row in self.rows if "prompts" in row for p in _axis_values("prompts", row["prompts"])]
        return tuple(dict.fromkeys([*self.prompts, *in_rows]))

    def points(self) -> list[Point]:
        """The grid; edge and cloud points ignore the spec-only axes and appear once, and again in every
        `plain_runtimes` runtime (a cloud-only point's cloud, an edge-only point's edge). Every split point
        brings its co-located baseline: the same pair, k, policy and thresholds in one process on the
        cloud's cores (what the server's machine would do alone), measured in the same worker. A point's
        fields that are no axis hold the sweep's settings, as asked (its records hold them as used).

        kv_cache is the KV cache of the torch runtime's models a point loads in its own process, as a run's
        `--kv-cache` is: the other runtimes ignore it, as a run does, and a split point's cloud runs as the
        sweep's server (or `cloud_url`'s) was started. A point where it changes nothing (`Point.caches_here`:
        a cloud-only point in llama.cpp, a split point whose edge runs no torch model) appears once, under the
        grid's first kv_cache, as it did when kv_cache was one setting; a kv_cache that reaches no point at all
        is refused in __post_init__."""
        seen, points = set(), []
        settings = {name: getattr(self, name) for name in FIELDS if name not in AXES}

        def add(values: dict) -> None:
            point = Point(**blank({**settings, **values}))
            if not point.caches_here():  # the cache changes nothing here: one point, at the grid's first kv_cache
                point = replace(point, kv_cache=self.kv_cache[0])
            if point.key() not in seen:  # the axes: the rest is the sweep's or blank alike at every point
                seen.add(point.key())
                points.append(point)

        grids = [{axis: getattr(self, axis) for axis in AXES}]
        grids += [{**grids[0], **{axis: _axis_values(axis, values) for axis, values in row.items()}} for row in self.rows]
        for combo in (c for grid in grids for c in itertools.product(*(grid[axis] for axis in AXES))):
            values = dict(zip(AXES, combo))
            if values["mode"] != Mode.SPEC:
                values["deployment"] = Deployment.INPROC
            if len(runtime_parts(values["cloud_runtime"])) > 1 and values["mode"] != Mode.SPEC:
                for runtime in runtime_parts(values["cloud_runtime"]):  # a two-runtime cloud's plain decodings: each
                    add({**values, "cloud_runtime": runtime})
                continue
            if len(runtime_parts(values["cloud_runtime"])) > 1 and values["drafter"] not in WEIGHS_RUNTIMES:
                continue  # only a drafter that weighs the switches runs on a two-runtime cloud (specdec.engine)
            if values["deployment"] == Deployment.SPLIT and values["overlap"] is True and values["drafter"] not in DRAFTS_AHEAD:
                continue  # only a drafter that can draft ahead takes overlap true (specdec.engine refuses the rest)
            add(values)
            if values["mode"] in RUNTIME_OF:  # the same baseline in every extra runtime asked for
                for runtime in self.plain_runtimes:
                    add({**values, RUNTIME_OF[values["mode"]]: runtime})
            if values["deployment"] == Deployment.SPLIT:
                add({**values, "deployment": Deployment.COLOCATED})
        return points

    def setting(self, point: Point, name: str):
        """A run setting at `point`: the point's value for an axis (as a number where the axis is
        numeric), else the sweep's."""
        if name not in AXES:
            return getattr(self, name)
        cast = NUMERIC_AXES.get(name)
        return cast(getattr(point, name)) if cast else getattr(point, name)

    def engine_config(self, point: Point, cloud_url: str | None = None) -> EngineConfig:
        """`cloud_url`: where a split point's server (or its link) listens, once the sweep started it."""
        # A role's runtime is blank where the role does not run: the engine takes its default, and loads nothing.
        values: dict[str, Any] = {
            f.name: f.default if f.name in AXES and getattr(point, f.name) is None else self.setting(point, f.name)
            for f in fields(EngineConfig)}
        if point.deployment == Deployment.SPLIT:  # the sweep's server runs the cloud in the point's runtime, on its device
            values.update(cloud_url=cloud_url, cloud_runtime=EngineConfig.cloud_runtime, cloud_device=EngineConfig.cloud_device)
        else:
            values["cloud_url"] = None
        return EngineConfig(**values)

    def deploy_config(self, point: Point) -> DeployConfig:
        values = {f.name: self.setting(point, f.name) for f in fields(DeployConfig) if f.name != "overlap"}
        overlap = self.setting(point, "overlap") if point.deployment == Deployment.SPLIT else DeployConfig.overlap
        return DeployConfig(**values, overlap=overlap)

    def network_of(self, point: Point) -> str:
        """The network a point's latency is modelled on: its link when split, else `network`."""
        return given(point.link, "link") if point.deployment == Deployment.SPLIT else self.network

    def spec_config(self, point: Point) -> SpecConfig:
        if point.mode != Mode.SPEC:
            return SpecConfig()
        return SpecConfig(**{f.name: self.setting(point, f.name) for f in fields(SpecConfig)})

    def decode_config(self, point: Point) -> DecodeConfig:
        return DecodeConfig(**{f.name: self.setting(point, f.name) for f in fields(DecodeConfig)})

    def caps(self) -> EdgeCaps:
        return EdgeCaps(cores=self.core_counts()[0], memory_gb=self.edge_memory_gb, rlimit_as=self.rlimit_as)

    def places_cloud(self) -> bool:
        """Does the grid hold a point whose cloud runs on the cloud's cores (split or co-located)?"""
        return any(p.deployment in ON_CLOUD_CORES for p in self.points())

    def core_counts(self) -> tuple[int | None, int | None]:
        """(edge cores, cloud cores) as used: with split or co-located points and `split_cores` disjoint,
        the edge takes the machine's first cores and the cloud the rest, none shared (the first half
        and the rest by default: on 2 cores, core 0 and core 1); None = every core."""
        if self.split_cores == SplitCores.SHARED or not self.places_cloud():
            return self.edge_cores, self.cloud_cores
        available = len(os.sched_getaffinity(0))
        if available < 2:
            raise ConfigError("split points give the edge and the server a core each by default and this machine "
                              "has one: add --split-cores shared")
        edge = self.edge_cores or (available - self.cloud_cores if self.cloud_cores else available // 2)
        cloud = self.cloud_cores or available - edge
        if edge < 1 or cloud < 1 or edge + cloud > available:
            raise ConfigError(f"an edge on {edge} and a server on {cloud} cores do not fit this machine's {available} "
                              "cores without sharing: lower --edge-cores or --cloud-cores, or add --split-cores shared")
        return edge, cloud

    def cloud_core_ids(self) -> list[int] | None:
        """The cores the cloud runs on (the machine's last `cloud cores`), or None: every core."""
        cloud = self.core_counts()[1]
        return sorted(os.sched_getaffinity(0))[-cloud:] if cloud else None


def service_key(point: Point) -> str:
    """Which of the sweep's servers and links a split point talks to: one per dtype, cloud runtime and link."""
    return f"{point.dtype}|{point.cloud_runtime}|{point.link}"


_HINTS = typing.get_type_hints(SweepConfig)


# The fields that hold a setting's enum -> that enum: parsed where the sweep's settings enter (__post_init__).
ENUM_FIELDS = {name: kind for name, hint in _HINTS.items() if (kind := enum_of(hint)) is not None}


def _axis_values(axis: str, values) -> tuple:
    """A row's axis values as the grid holds them: a tuple, numbers and enums parsed."""
    values = tuple(values) if isinstance(values, (list, tuple)) else (values,)
    if axis in ENUM_FIELDS:
        return tuple(parse(ENUM_FIELDS[axis], v, axis) for v in values)
    cast = NUMERIC_AXES.get(axis)
    try:
        return tuple(cast(v) for v in values) if cast else values
    except (TypeError, ValueError):
        raise ConfigError(f"rows: {axis} must be a list of {axis} values, got {list(values)}") from None


def parse_int(value) -> int:
    """An int axis value from TOML (an int) or a flag (its digits); 2.5 or true is refused, never
    rounded into another point."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lstrip("+-").isdigit():
        return int(value)
    raise ValueError(value)


def parse_number(value) -> float:
    """A float axis value from TOML (a number) or a flag (text such as 0.5, inf)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(value)
    return float(value)


_PARSERS = {int: parse_int, float: parse_number, bool: parse_switch}
NUMERIC_AXES: dict[str, Callable[[Any], object]] = {
    axis: _PARSERS[typing.get_args(_HINTS[axis])[0]] for axis in AXES if typing.get_args(_HINTS[axis])[0] in _PARSERS}
NUMERIC_AXES.update({axis: parse_overlap for axis in AXES if SETTINGS[axis].metadata.get("parse") == "overlap"})

