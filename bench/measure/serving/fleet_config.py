"""What `specbench fleet` runs: N edges against one verifier server, for each N, beside cloud-only
serving of the same N (bench/measure/serving/fleet.py runs it; its flags come from these fields, bench/commands/options.py).

The edges are real edge processes running the normal edge loop (`--edge MODEL`), or replayed edges
(`--edge-replay DIR`): the draft blocks and edge timing of an earlier split run, re-sent to the
server, every verdict checked against the recorded one. Replays let one machine measure the
server without N edge models competing for its cores.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from bench.core.network import NO_LINK, profile
from bench.core.prompts import PromptInputs
from specdec.backends.devices import CUDA_GRAPHS, SERVER_CACHES, check_served_cache, check_served_device, on_cpu
from specdec.core.config import DeployConfig, EngineConfig, SpecConfig, check_types
from specdec.core.policies import POLICIES, traits
from specdec.errors import ConfigError
from specdec.models.architecture import is_architecture
from specdec.remote.protocol import parse_address
from specdec.remote.server_config import ServeConfig
from specdec.runtime_registry import RuntimeChoices, canonical_runtime, check_name, served_runtime
from specdec.settings import CudaGraphs, DType, Profile, ServerCache, parse_fields

MAX_CLIENTS = 256


@dataclass(frozen=True)
class FleetConfig:
    prompts: str = field(metadata={"help": "prompt set (as for `run`): each client generates for every prompt"})
    clients: tuple[int, ...] = field(default=(1, 2, 4, 8), metadata={
        "help": "fleet sizes N to measure, comma-separated: N edges against one server at once"})
    edge: str | None = EngineConfig.edge
    edge_replay: str | None = field(default=None, metadata={
        "help": "replay the draft blocks and edge timing of this split run's results folder instead of running "
                "edge models (no edge model is loaded; each verdict is checked against the recorded one)"})
    follow_verdicts: bool = field(default=False, metadata={
        "help": "with --edge-replay: the server keeps each recorded verdict (it still computes its own, counted in "
                "replay_mismatches), so a random-weight architecture of the real size (--cloud arch:PATH.json) serves "
                "the recorded acceptance; the fleet starts its server with `serve --follow-verdicts`, a --cloud-url "
                "server must have been (docs/gpu.md)"})
    cloud: str | None = field(default=None, metadata={
        "help": "cloud model: the fleet starts `specbench serve` for it (or give --cloud-url); arch:PATH.json: a "
                "random-weight architecture, with --follow-verdicts"})
    cloud_url: str | None = field(default=None, metadata={"help": "a running `specbench serve` (HOST:PORT) to load"})
    cloud_runtime: str | None = field(default=None, metadata={
        "help": "server started by the fleet: what runs the cloud, as `serve --runtime` (default: the runtime a model "
                "file needs, else the default runtime); cloud-only serving runs on the same server. With --cloud-url "
                "the records name the runtime that server reports", "choices": RuntimeChoices(),
        "canonical": canonical_runtime})
    cloud_device: str = field(default="cpu", metadata={
        "help": "server started by the fleet: where its torch model runs, as `serve --device` (cpu, cuda or cuda:N); "
                "with --cloud-url the records name the device that server reports"})
    kv_cache: ServerCache = field(default=ServerCache.AUTO, metadata={
        "help": "server started by the fleet: its KV cache, as `serve --kv-cache` (dynamic; static: one preallocated "
                "cache of its sessions, captured CUDA graphs on a GPU; auto: static on CUDA, dynamic on the CPU); the "
                "records name the cache the server reports", "choices": SERVER_CACHES})
    cuda_graphs: CudaGraphs = field(default=CudaGraphs.ON, metadata={
        "help": "server started by the fleet on CUDA with --kv-cache static: captured graphs (on) or eager (off)",
        "choices": CUDA_GRAPHS})
    token_file: str | None = DeployConfig.token_file
    cloud_timeout_s: float = DeployConfig.cloud_timeout_s
    baseline: bool = field(default=True, metadata={
        "help": "also serve the same N clients cloud-only (the server generates every token, batched the same way)"})
    rate: float | None = field(default=None, metadata={
        "help": "open loop: prompts arrive at this many per second across the fleet (Poisson); "
                "unset: closed loop, each client starts its next prompt when one finishes"})
    link: str = field(default=NO_LINK, metadata={
        "help": "a shaped link per client (none, wifi, 4g, 5g, or rtt=40ms,up=10mbit,down=50mbit)"})
    max_batch: int = field(default=ServeConfig.max_batch, metadata={
        "help": "server started by the fleet: most verify requests of different sessions in one forward"})
    batch_window_ms: float = field(default=ServeConfig.batch_window_ms, metadata={
        "help": "server started by the fleet: wait this long for more requests before a forward"})
    cloud_cores: str | None = field(default=None, metadata={
        "help": "server started by the fleet: pin it to these cores, e.g. 1 (edge processes get the others)"})
    dtype: DType = EngineConfig.dtype
    chat_template: bool = EngineConfig.chat_template
    constraints: Profile = EngineConfig.constraints
    limit: int | None = PromptInputs.limit
    repeats: int = field(default=1, metadata={
        "help": "measure every fleet size this many times (sizes interleaved), for the spread of its ratios"})

    def __post_init__(self) -> None:
        if isinstance(self.clients, list):
            object.__setattr__(self, "clients", tuple(self.clients))
        parse_fields(self)
        check_types(self)
        if self.cloud_runtime is not None:
            check_name(self.cloud_runtime, "cloud_runtime")
        if not self.clients or any(not 1 <= n <= MAX_CLIENTS for n in self.clients):
            raise ConfigError(f"clients must be fleet sizes in [1, {MAX_CLIENTS}], got {list(self.clients)}")
        if len(set(self.clients)) != len(self.clients):
            raise ConfigError(f"clients lists a fleet size twice: {list(self.clients)}")
        if (self.cloud is None) == (self.cloud_url is None):
            raise ConfigError("a fleet needs its server: give --cloud MODEL (the fleet starts it) or --cloud-url HOST:PORT")
        if self.cloud_url is not None:
            parse_address(self.cloud_url, "--cloud-url")
            if self.cloud_runtime is not None or not on_cpu(self.cloud_device) or self.kv_cache != ServerCache.AUTO:
                raise ConfigError("--cloud-runtime, --cloud-device and --kv-cache choose how the server the fleet starts "
                                  "runs; a --cloud-url server runs as it was started (`serve --runtime --device "
                                  "--kv-cache`): drop them")
        elif self.cloud is not None:  # always here: the runtime the started server runs, resolved as `serve` does
            runtime = served_runtime(self.cloud, self.cloud_runtime, "--cloud-runtime")
            object.__setattr__(self, "cloud_runtime", runtime)
            check_served_device(self.cloud_device, runtime, "--cloud-device")
            check_served_cache(self.kv_cache, runtime)
        if (self.edge is None) == (self.edge_replay is None):
            raise ConfigError("a fleet's edges are --edge MODEL (edge processes) or --edge-replay DIR (a recorded "
                              "split run): give exactly one")
        if self.follow_verdicts and self.edge_replay is None:
            raise ConfigError("--follow-verdicts keeps recorded verdicts: it needs --edge-replay DIR")
        if self.cloud is not None and is_architecture(self.cloud) and not self.follow_verdicts:
            raise ConfigError(f"--cloud {self.cloud} has random weights, whose verdicts are noise: add --follow-verdicts "
                              "(with --edge-replay) so it keeps the recorded ones")
        if self.rate is not None and not self.rate > 0:
            raise ConfigError(f"rate must be > 0 prompts per second, got {self.rate}; leave it unset for a closed loop")
        if self.repeats < 1:
            raise ConfigError(f"repeats must be >= 1, got {self.repeats}")
        if self.limit is not None and self.limit < 1:
            raise ConfigError(f"limit must be >= 1 (the first N prompts), got {self.limit}")
        if self.edge_replay is not None and not (Path(self.edge_replay) / "results.jsonl").is_file():
            raise ConfigError(f"--edge-replay {self.edge_replay}: no results.jsonl there; record one with "
                              "`specbench run --mode spec --cloud-url ...` (or a sweep with --deployment split)")
        profile(self.link)
        ServeConfig(max_batch=self.max_batch, batch_window_ms=self.batch_window_ms)  # validates both

    def check_spec(self, spec: SpecConfig) -> None:
        if self.edge_replay is not None and traits(spec.policy).samples:  # a drawn verdict: no replay checks it
            replayable = [name for name in POLICIES if not traits(name).samples]
            raise ConfigError(f"--edge-replay needs a deterministic policy ({' or '.join(replayable)}), got "
                              f"{spec.policy!r}: a sampled verdict cannot be checked against a recording")
