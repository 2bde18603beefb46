"""Every setting of the engine, once: frozen dataclasses that validate themselves, with errors that
name the setting, the value and the fix.

Field metadata carries the help text and the allowed values (`choices`); bench builds the `run`
and `sweep` command lines from these fields (bench/commands/options.py), so a setting added here reaches
both commands. Policy and verifier names come from their registries: a new one is one file.
"""
from __future__ import annotations

import math
import types
import typing
from dataclasses import dataclass, field, fields
from enum import StrEnum

from specdec.backends.base import DTYPES
from specdec.backends.devices import CUDA_GRAPHS, DEVICE_NAMES, KV_CACHES, check_device, on_cpu
from specdec.core.block_length import SCHEDULES, parse_stop
from specdec.core.drafters import DRAFTERS, describe_options, drafter_options
from specdec.core.policies import POLICIES, policies_that, traits
from specdec.core.verifier import VERIFIERS
from specdec.errors import ConfigError
from specdec.runtime_registry import (
    RuntimeChoices,
    canonical_runtime,
    check_file,
    check_runtime,
    declared,
    default_runtime,
    runtime_parts,
    runtimes,
)
from specdec.settings import (
    CudaGraphs,
    DType,
    ExtraBuffers,
    KVCache,
    Mode,
    OnCloudLoss,
    Overlap,
    Profile,
    Uncertainty,
    choices,
    parse_fields,
    parse_switch,
)

MODES = choices(Mode)
ROLES = {"edge": ("edge",), "cloud": ("cloud",), "spec": ("edge", "cloud")}  # the models each mode loads
CONSTRAINT_PROFILES = choices(Profile)
UNCERTAINTY = choices(Uncertainty)
DEFAULT_RUNTIME = default_runtime()  # what runs a model when no runtime is said (specdec/runtimes)
RUNTIMES_HELP = "; ".join(f"{r.name}: {r.summary}" for r in runtimes())
# e.g. the plain steps of a runtime whose blocks drift, the blocks of an exact one (the first of each auto measures)
PAIR_EXAMPLE = "+".join(next(r.name for r in runtimes() if r.measured_first and r.blocks_are_steps == exact)
                        for exact in (False, True))


_TYPE_NAMES = {int: "an integer", float: "a number", str: "text", bool: "true or false"}


def _fits(value, hint) -> bool:
    """`value` is of the declared type: an int is no bool, a float may be written as an int, a
    tuple's items fit its item type. Types this does not know (callables, ...) pass."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if isinstance(hint, types.UnionType) or origin is typing.Union:
        return any(_fits(value, arg) for arg in args)
    if hint is type(None):
        return value is None
    if origin is tuple:
        return isinstance(value, tuple) and all(_fits(item, args[0]) for item in value)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, hint) if isinstance(hint, type) and origin is None else True


def _type_name(hint) -> str:
    args = [arg for arg in typing.get_args(hint) if arg is not type(None)]
    if typing.get_origin(hint) is tuple:
        return f"a list of {_type_name(args[0]).removeprefix('an ').removeprefix('a ')}s"
    if args and typing.get_origin(hint) is not tuple:
        return " or ".join(_type_name(arg) for arg in args) + (" (or unset)" if len(args) < len(typing.get_args(hint)) else "")
    if isinstance(hint, type) and issubclass(hint, StrEnum):
        return f"one of {', '.join(hint)}"
    return _TYPE_NAMES.get(hint, getattr(hint, "__name__", str(hint)))


def check_types(config) -> None:
    """Every field holds a value of its declared type, so a config file's `max_new_tokens = 8.5`
    or `seed = "x"` is named here, not met as a Python error after the models load."""
    hints = typing.get_type_hints(type(config))
    for f in fields(config):
        value = getattr(config, f.name)
        if f.init and not _fits(value, hints[f.name]):
            raise ConfigError(f"{f.name} must be {_type_name(hints[f.name])}, got {value!r}")


def check_choices(config) -> None:
    """Every field whose metadata lists `choices` holds one of them."""
    for f in fields(config):
        allowed, value = f.metadata.get("choices"), getattr(config, f.name)
        if allowed is not None and value not in allowed:
            raise ConfigError(f"unknown {f.name} {value!r}: use one of {', '.join(allowed)}")


@dataclass(frozen=True)
class EngineConfig:
    """Which models run and how prompts reach them."""

    mode: Mode = field(metadata={"help": "edge or cloud alone (the baselines), or spec: edge drafts, cloud verifies",
                                "choices": MODES})
    edge: str | None = field(default=None, metadata={"help": "edge (draft) model: registry alias, local directory or hub id"})
    cloud: str | None = field(default=None, metadata={"help": "cloud (verify) model: registry alias, local directory or hub id"})
    dtype: DType = field(default=DType.BFLOAT16, metadata={"help": "weights and activations of the torch runtime (float32 "
                                                              "for exactness checks)", "choices": tuple(DTYPES)})
    edge_runtime: str = field(default=DEFAULT_RUNTIME, metadata={
        "help": f"what runs the edge (docs/runtimes.md): {RUNTIMES_HELP}", "choices": RuntimeChoices(),
        "canonical": canonical_runtime})
    cloud_runtime: str = field(default=DEFAULT_RUNTIME, metadata={
        "help": "what runs the cloud loaded here, as --edge-runtime; spec mode: also PLAIN+BLOCKS (two runtimes, e.g. "
                f"{PAIR_EXAMPLE}), the model held in both, plain steps in the first, blocks in the second",
        "choices": RuntimeChoices(pairs=True), "canonical": canonical_runtime})
    constraints: Profile = field(default=Profile.NONE, metadata={"help": "decoding profile (zh: one short Chinese sentence)",
                                                        "choices": CONSTRAINT_PROFILES})
    chat_template: bool = field(default=True, metadata={"help": "wrap the prompt in the tokenizer's chat template, "
                                                                "when it has one (off: the text goes in raw)"})
    cloud_url: str | None = field(default=None, metadata={
        "help": "spec mode: verify on a `specbench serve` server at HOST:PORT instead of loading the cloud model here "
                "(edge mode never contacts it)"})
    llamacpp_extra_buffers: ExtraBuffers = field(default=ExtraBuffers.AUTO, metadata={
        "help": "llama.cpp's extra buffer types (weight repacking, AMX tiles) for the models run in llama.cpp here: "
                "auto (only after a one-time probe in a child process says they run on this machine), on (llama.cpp's "
                "default) or off (its --no-repack); docs/runtimes.md", "choices": choices(ExtraBuffers)})
    edge_device: str = field(default="cpu", metadata={
        "help": f"where the edge's torch model runs: {DEVICE_NAMES} (llama.cpp and the int8 runtimes: cpu only); docs/gpu.md"})
    cloud_device: str = field(default="cpu", metadata={
        "help": f"where the cloud's torch model loaded here runs: {DEVICE_NAMES} (with --cloud-url the server's "
                "`specbench serve --device` says); docs/gpu.md"})
    kv_cache: KVCache = field(default=KVCache.AUTO, metadata={
        "help": "the torch models' KV cache: dynamic (transformers' DynamicCache), static (preallocated, exact crops), "
                "compiled (static, its forward under torch.compile) or auto (static with captured steps on CUDA, "
                "dynamic on the CPU); docs/gpu.md", "choices": KV_CACHES})
    cuda_graphs: CudaGraphs = field(default=CudaGraphs.ON, metadata={
        "help": "on CUDA with a static KV cache: replay the 1-token and k+1-token forwards as captured CUDA graphs "
                "(on), or run them eagerly (off)", "choices": CUDA_GRAPHS})

    def __post_init__(self) -> None:
        parse_fields(self)  # typed from here on; a member is still its word in records and the protocol
        check_types(self)
        for role in ("edge_runtime", "cloud_runtime"):  # an old runtime name is today's
            object.__setattr__(self, role, canonical_runtime(getattr(self, role)))
        check_choices(self)
        if self.remote_cloud and not on_cpu(self.cloud_device):
            raise ConfigError("--cloud-device chooses where a cloud loaded here runs; with --cloud-url the server's "
                              "model runs where that server was started (`specbench serve --device`): drop --cloud-device")
        for role in self.roles:
            self.check_placement(role)
        if self.cloud_url and self.mode == Mode.CLOUD:
            raise ConfigError("--cloud-url verifies spec blocks on a server; cloud mode runs the cloud model here: "
                              "drop --cloud-url or use --mode spec")
        if self.remote_cloud and self.cloud_runtime != DEFAULT_RUNTIME:
            raise ConfigError("--cloud-runtime chooses what runs a cloud loaded here; with --cloud-url the server's "
                              "model runs as that server was started: drop --cloud-runtime")
        if len(runtime_parts(self.cloud_runtime)) > 1 and (self.mode != Mode.SPEC or self.remote_cloud):
            plain, blocks = runtime_parts(self.cloud_runtime)
            raise ConfigError(f"--cloud-runtime {self.cloud_runtime} holds the cloud in two runtimes, plain steps in {plain} "
                              f"and spec blocks in {blocks}: only a spec run that loads the cloud here takes it; "
                              f"use --cloud-runtime {plain} or {blocks}")
        for role in self.roles:
            runtime, name = getattr(self, f"{role}_runtime"), getattr(self, role)
            check_runtime(runtime, f"--{role}-runtime")
            check_file(name, runtime, role, f"--{role}-runtime", verb="add")
        missing = [role for role in self.roles if not getattr(self, role)]
        if missing:
            flags = " and ".join(f"--{role} MODEL" for role in missing)
            raise ConfigError(f"--mode {self.mode} needs {flags}"
                              + (" or --cloud-url HOST:PORT" if self.mode == Mode.SPEC else ""))

    def check_placement(self, role: str) -> None:
        """The role's device exists here, and its runtime runs there (llama.cpp and dynamic int8 on the CPU only)."""
        device = check_device(getattr(self, f"{role}_device"), f"--{role}-device")
        runtime = getattr(self, f"{role}_runtime")
        if not on_cpu(device) and not all(declared(part).devices for part in runtime_parts(runtime)):
            on_devices = ", ".join(r.name for r in runtimes() if r.devices)
            raise ConfigError(f"--{role}-runtime {runtime} runs on the CPU only: use --{role}-device cpu, or "
                              f"--{role}-runtime {on_devices} on {device}")

    @property
    def remote_cloud(self) -> bool:
        """Spec blocks are verified by a server; edge mode never contacts it."""
        return self.mode == Mode.SPEC and bool(self.cloud_url)

    @property
    def roles(self) -> tuple[str, ...]:
        """The models this process loads (edge-only never loads the cloud; nor does a split spec run)."""
        return ("edge",) if self.remote_cloud else ROLES[self.mode]


ON_CLOUD_LOSS = choices(OnCloudLoss)


def parse_overlap(value: object) -> bool | Overlap:
    """An overlap setting from a flag, TOML or a sweep's list: auto, or true/false (on/off, yes/no, 1/0); ValueError
    for anything else."""
    return Overlap.AUTO if str(value).strip().lower() == Overlap.AUTO else parse_switch(value)


# Sampling below this temperature is greedy up to rounding, and far below it `logits / T` overflows
# to inf and the distribution turns NaN (a session at 1e-40 made torch.multinomial raise): refused.
MIN_TEMPERATURE = 1e-2


@dataclass(frozen=True)
class DeployConfig:
    """How the edge talks to a verifier server (`EngineConfig.cloud_url`) and where it runs."""

    token_file: str | None = field(default=None, metadata={"help": "file holding the server's shared secret"})
    cloud_timeout_s: float = field(default=60.0, metadata={
        "help": "seconds to wait for one verdict before the cloud counts as lost", "flags": ("--cloud-timeout",)})
    on_cloud_loss: OnCloudLoss = field(default=OnCloudLoss.FAIL, metadata={
        "help": "the server is lost mid-generation: record the prompt failed, or finish it edge-only (degraded)",
        "choices": ON_CLOUD_LOSS})
    overlap: bool | Overlap = field(default=Overlap.AUTO, metadata={
        "help": "with --cloud-url: draft the next block while the server verifies the last one: auto (only "
                "while the cycles measured so far say it pays, specdec/core/overlap.py), true or false",
        "parse": "overlap"})

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "overlap", parse_overlap(self.overlap))
        except ValueError:
            raise ConfigError(f"overlap must be auto, true or false, got {self.overlap!r}") from None
        parse_fields(self)
        check_types(self)
        check_choices(self)
        if not self.cloud_timeout_s > 0:
            raise ConfigError(f"cloud_timeout_s must be > 0 seconds, got {self.cloud_timeout_s}")


@dataclass(frozen=True)
class DecodeConfig:
    max_new_tokens: int = field(default=64, metadata={"help": "tokens to generate at most"})
    temperature: float = field(default=0.0, metadata={"help": "0 = greedy; > 0 = sampling at this temperature"})
    seed: int = field(default=0, metadata={"help": "seed of the sampling generator"})

    def __post_init__(self) -> None:
        check_types(self)
        if self.max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if not (self.temperature >= 0 and math.isfinite(self.temperature)):
            raise ConfigError(f"temperature must be a finite number >= 0 (0 = greedy), got {self.temperature}")
        if not 0 <= self.seed < 1 << 64:
            raise ConfigError(f"seed must be in [0, 2**64), got {self.seed}")
        if 0 < self.temperature < MIN_TEMPERATURE:
            raise ConfigError(f"temperature {self.temperature:g} is below {MIN_TEMPERATURE:g}, where the distribution "
                              "stops being finite: use 0 for greedy decoding, or a temperature >= 0.01")

    @property
    def do_sample(self) -> bool:
        return self.temperature > 0


@dataclass(frozen=True)
class SpecConfig:
    k: int = field(default=4, metadata={"help": "draft tokens per block"})
    entropy_threshold: float = field(
        default=2.0, metadata={"help": "escalate a block iff its uncertainty >= this many nats (0 = always, inf = never)"}
    )
    accept_threshold: float = field(
        default=0.1, metadata={"help": "threshold policy: accept while p_cloud(draft) >= this probability"}
    )
    policy: str = field(default="threshold", metadata={"help": "acceptance rule (specdec/core/policies/)",
                                                        "choices": POLICIES})  # the registry: one filed later is a choice too
    verifier: str = field(default="cached", metadata={"help": "how the cloud keeps its state between calls "
                                                               "(specdec/core/verifier.py)", "choices": VERIFIERS})
    uncertainty: Uncertainty = field(default=Uncertainty.MAX, metadata={"help": "a block's uncertainty from its token entropies",
                                                       "choices": UNCERTAINTY})
    punct_trigger: float | None = field(
        default=None, metadata={"help": "also escalate blocks whose punctuation density exceeds this (0.4 flags "
                                        "'a comma after every character or two')"}
    )
    draft_topn: int | None = field(
        default=None, metadata={"help": "sample policy: draft from the top-N of the edge distribution (renormalized), "
                                        "so a remote verify uploads N probabilities per token instead of the vocabulary"}
    )
    draft_stop: str = field(
        default="none", metadata={"help": "end a block early: none, entropy:NATS (after a token with entropy >= NATS) "
                                          "or pmin:P (after a token whose top-1 probability < P)"}
    )
    k_schedule: str = field(
        default="constant", metadata={"help": "block length cap over time: constant k, or heuristic (+2 after a fully "
                                              "accepted block, -1 otherwise; k is the cap)", "choices": SCHEDULES}
    )
    drafter: str = field(
        default="model", metadata={"help": "what proposes a block (specdec/core/drafters/): model (the edge model), "
                                           "prompt-lookup or ngram (no model: always verified), hybrid (prompt "
                                           "lookup when it matches, else the edge model while its blocks pay), or auto (prompt "
                                           "lookup only while its blocks pay, plain steps otherwise)",
                                   "choices": DRAFTERS}  # the registry itself: a drafter registered later is a choice too
    )
    drafter_options: str = field(
        default="", metadata={"help": "the drafter's own settings, NAME=VALUE[,NAME=VALUE]; a drafter refuses any "
                                      f"other (docs/drafters.md). {describe_options()}"}
    )

    def __post_init__(self) -> None:
        parse_fields(self)
        check_types(self)
        if not isinstance(self.k, int) or self.k < 1:
            raise ConfigError(f"k must be >= 1, got {self.k}")
        if math.isnan(self.entropy_threshold) or self.entropy_threshold < 0:
            raise ConfigError(
                f"entropy_threshold must be >= 0 nats (0 = verify every block, inf = never), got {self.entropy_threshold}"
            )
        if not 0.0 <= self.accept_threshold <= 1.0:
            raise ConfigError(f"accept_threshold is a probability and must be in [0, 1], got {self.accept_threshold}")
        check_choices(self)
        if self.draft_topn is not None and (not isinstance(self.draft_topn, int) or self.draft_topn < 1):
            raise ConfigError(f"draft_topn must be an integer >= 1 (or unset for the full distribution), got {self.draft_topn}")
        if self.draft_topn is not None and not traits(self.policy).samples:
            raise ConfigError(f"draft_topn truncates sampled drafts: use it with --policy "
                              f"{' or '.join(policies_that('samples'))}, or leave it unset")
        parse_stop(self.draft_stop)
        if self.punct_trigger is not None and not 0.0 <= self.punct_trigger <= 1.0:
            raise ConfigError(f"punct_trigger is a density in [0, 1], got {self.punct_trigger}")
        drafter_options(self.drafter, self.drafter_options)  # one the drafter does not take is refused here

    def check_decoding(self, decode: DecodeConfig) -> None:
        if traits(self.policy).samples and not decode.do_sample:
            raise ConfigError(f"policy {self.policy!r} needs temperature > 0: set --temperature, or use --policy "
                              f"{' or '.join(policies_that('argmax'))} for greedy decoding")
