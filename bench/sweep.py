"""`specbench sweep`: the grid of settings × prompt sets, run in capped worker processes.

Every (point, prompt) record is appended to DIR/results.jsonl as soon as it exists; a rerun of the
same sweep skips what is done. One worker per (dtype) group loads the models once and reuses them
across that group's points; CPU caps are applied in the worker before torch is imported.
"""
from __future__ import annotations

import itertools
import json
import multiprocessing
import os
import tomllib
from queue import Empty
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from tqdm import tqdm

from bench.caps import OVER_MEMORY_EXIT, EdgeCaps
from bench.prompts import load_prompts
from bench.records import ResultsFile, environment
from specdec.config import MODES, DecodeConfig, SpecConfig
from specdec.errors import ConfigError

CONFIGS_DIR = Path(__file__).parent / "configs"
AXES = ("mode", "k", "entropy_threshold", "accept_threshold", "policy", "verifier", "dtype", "prompts")
CASTS = {"k": int, "entropy_threshold": float, "accept_threshold": float}
SPEC_ONLY = ("k", "entropy_threshold", "accept_threshold", "policy", "verifier")


@dataclass(frozen=True)
class SweepConfig:
    edge: str | None = None
    cloud: str | None = None
    mode: tuple[str, ...] = ("cloud", "edge", "spec")
    k: tuple[int, ...] = (4,)
    entropy_threshold: tuple[float, ...] = (SpecConfig.entropy_threshold,)
    accept_threshold: tuple[float, ...] = (SpecConfig.accept_threshold,)
    policy: tuple[str, ...] = (SpecConfig.policy,)
    verifier: tuple[str, ...] = (SpecConfig.verifier,)
    dtype: tuple[str, ...] = ("bfloat16",)
    prompts: tuple[str, ...] = ("zh-describe",)
    max_new_tokens: int = 64
    temperature: float = 0.0
    seed: int = 0
    constraints: str = "none"
    uncertainty: str = SpecConfig.uncertainty
    punct_trigger: float | None = None
    chat_template: bool = True
    limit: int | None = field(default=None, metadata={"help": "first N prompts of each set"})
    max_audio_s: float = field(default=30.0, metadata={"help": "refuse longer audio clips (seconds)"})
    network: str = "none"
    edge_cores: int | None = None
    edge_memory_gb: float | None = None
    rlimit_as: bool = False

    def __post_init__(self) -> None:
        for axis in AXES:
            if not getattr(self, axis):
                raise ConfigError(f"sweep axis {axis!r} is empty: give at least one value")
        unknown = set(self.mode) - set(MODES)
        if unknown:
            raise ConfigError(f"unknown mode {sorted(unknown)[0]!r}: use edge, cloud or spec")
        if ("spec" in self.mode or "edge" in self.mode) and not self.edge:
            raise ConfigError("the sweep has edge or spec points but no edge model: set edge = MODEL")
        if ("spec" in self.mode or "cloud" in self.mode) and not self.cloud:
            raise ConfigError("the sweep has cloud or spec points but no cloud model: set cloud = MODEL")
        for point in self.points():  # every point validates as a run would, before anything runs
            self.spec_config(point)
        self.decode_config()
        self.caps()
        from bench.network import profile

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
                cast = CASTS.get(key)
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
                point.update({axis: None for axis in SPEC_ONLY})
            key = json.dumps(point, sort_keys=True)
            if key not in seen:
                seen.add(key)
                points.append(point)
        return points

    def spec_config(self, point: dict) -> SpecConfig:
        if point["mode"] != "spec":
            return SpecConfig()
        return SpecConfig(
            k=int(point["k"]), entropy_threshold=float(point["entropy_threshold"]),
            accept_threshold=float(point["accept_threshold"]), policy=point["policy"], verifier=point["verifier"],
            uncertainty=self.uncertainty, punct_trigger=self.punct_trigger,
        )

    def decode_config(self) -> DecodeConfig:
        return DecodeConfig(max_new_tokens=self.max_new_tokens, temperature=self.temperature, seed=self.seed)

    def caps(self) -> EdgeCaps:
        return EdgeCaps(cores=self.edge_cores, memory_gb=self.edge_memory_gb, rlimit_as=self.rlimit_as)


def result_key(row: dict) -> str:
    return json.dumps({axis: row.get(axis) for axis in AXES}, sort_keys=True)


def run_sweep(config: SweepConfig, out: Path, progress: bool = True) -> dict:
    """Run what is not done yet; returns counts by status."""
    out.mkdir(parents=True, exist_ok=True)
    sweep_file = out / "sweep.json"
    settings = json.loads(json.dumps(asdict(config)))  # tuples -> lists, as stored
    if sweep_file.exists():
        previous = json.loads(sweep_file.read_text()).get("config", {})
        if previous != settings:
            changed = sorted(k for k in settings if previous.get(k) != settings[k])
            raise ConfigError(
                f"{out} holds a different sweep (differs in {', '.join(changed)}): use another --out, "
                "or delete that folder to start over"
            )
    else:
        sweep_file.write_text(json.dumps({"config": settings, "environment": environment()}, indent=2, ensure_ascii=False))
    prompts = {name: load_prompts(name)[: config.limit] for name in config.prompts}
    results = ResultsFile(out / "results.jsonl")
    rows = results.read()
    over_cap = {result_key(r) for r in rows if r.get("status") == "over_memory_cap"}
    done = {(result_key(r), r["id"]) for r in rows if r.get("status") in ("ok", "failed")}
    todo = []  # (point, [prompt ids])
    for point in config.points():
        key = json.dumps(point, sort_keys=True)
        ids = [r.id for r in prompts[point["prompts"]] if (key, r.id) not in done]
        if ids and key not in over_cap:
            todo.append((point, ids))
    total = sum(len(ids) for _, ids in todo)
    bar = tqdm(total=total, desc="sweep", unit="prompt", disable=not progress)
    # Baselines first, so speed-ups can be read off a partial sweep.
    order = {"cloud": 0, "edge": 1, "spec": 2}
    for dtype in config.dtype:
        group = sorted((t for t in todo if t[0]["dtype"] == dtype), key=lambda t: order[t[0]["mode"]])
        while group:
            finished = _run_worker(config, group, out, bar)
            group = [t for t in group if json.dumps(t[0], sort_keys=True) not in finished]
    bar.close()
    counts: dict[str, int] = {}
    for row in results.read():
        counts[row.get("status", "ok")] = counts.get(row.get("status", "ok"), 0) + 1
    return counts


def _run_worker(config: SweepConfig, group: list, out: Path, bar: tqdm) -> set[str]:
    """One worker process for a group of points; returns the keys of points it finished (or that
    hit the memory cap). A worker that dies otherwise raises."""
    ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: caps apply before torch loads
    queue = ctx.Queue()
    worker = ctx.Process(target=_worker_main, args=(asdict(config), group, str(out), queue), daemon=True)
    worker.start()
    finished: set[str] = set()
    error = None
    while True:
        try:
            message = queue.get(timeout=0.5)
        except Empty:
            if worker.is_alive():
                continue
            break  # died without saying so (killed, or out of memory)
        kind = message[0]
        if kind == "tick":
            bar.update()
        elif kind in ("point_done", "over_cap"):
            finished.add(message[1])
            if kind == "over_cap":
                bar.write(message[2])
        elif kind == "error":
            error = message[1]
        elif kind == "exit":
            break
    worker.join()
    if worker.exitcode == OVER_MEMORY_EXIT:
        return finished
    if error:
        from specdec.errors import SpecdecError

        raise SpecdecError(error)
    if worker.exitcode != 0:
        raise RuntimeError(f"sweep worker died with exit code {worker.exitcode}: rerun to resume")
    return finished


def _worker_main(config_dict: dict, group: list, out: str, queue) -> None:
    config = SweepConfig.from_mapping(config_dict)
    caps = config.caps()
    caps.apply_cpu()  # before torch is imported
    try:
        from bench.worker import run_group

        run_group(config, caps, group, Path(out), queue)
    except Exception as e:  # noqa: BLE001 - reported to the parent as one line
        from specdec.errors import SpecdecError

        queue.put(("error", str(e) if isinstance(e, SpecdecError) else f"{type(e).__name__}: {e}"))
        exit_worker(queue, 1)
    exit_worker(queue, 0)


def exit_worker(queue, code: int) -> None:
    """Say goodbye and leave at once. The queue's feeder thread must flush before os._exit."""
    queue.put(("exit",))
    queue.close()
    queue.join_thread()
    os._exit(code)
