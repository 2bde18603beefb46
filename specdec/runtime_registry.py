"""Runtimes: what runs a model's forwards, each one declaration, and the registry that holds them.

A runtime is a `Runtime` registered by a module of the package specdec/runtimes/ (`torch_runtimes.py`, `gguf.py`,
`onnx.py`, `openvino_ir.py`, `kernels.py`): its name and old names, the package and CPU it needs, how a model loads in it (its
loader, and for a converted runtime its conversion), whether its blocks are its steps bit for bit, its weights' bits,
the roles `auto` may give it. Every table the engine and the harness read (the names a flag accepts, which runtimes
are exact, what the calibration measures, what `auto` chooses among) is derived here from the declarations, so adding
a runtime is adding a module that calls `register` (outside the package: a module named by SPECBENCH_RUNTIMES): nothing
else names it.

This module sits low (errors and the machine only): backends, core, models and bench read it. The declarations sit
above the backends and models they load, so the registry imports them by name on its first lookup (`_declared`),
and what a declaration needs of a module below the registry (the kernels' CPU check) is named as "module:function"
too.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from specdec.errors import ConfigError
from specdec.machine import _cpuinfo

KERNELS = "specdec.kernels"  # the kernels' paths: what the CPU lacks for them (needs_kernels), imported when asked

CLOUD, EDGE = "cloud", "edge"  # the roles `auto` may choose a runtime for


@dataclass(frozen=True)
class Package:
    """A runtime that runs in a package of its own, an extra of this project: checked without importing it."""

    module: str  # what `import` finds
    distribution: str  # what pip installs
    extra: str  # the command that installs it


@dataclass(frozen=True)
class Runtime:
    """Everything specbench asks of one runtime. Only `name`, `summary` and `loader` are required: the defaults
    describe a runtime that runs in torch's install, on any CPU, whose blocks are not its steps."""

    name: str
    summary: str  # what runs the model, one phrase (the flags' help)
    # (name, LoadSettings, log) -> LoadedModel, or "module:function" naming it (imported on first load)
    loader: str | Callable[..., Any]
    order: int = 100  # where it is listed among the runtimes (flags' choices, tables)
    aliases: tuple[str, ...] = ()  # old names, still accepted
    default: bool = False  # the runtime a model runs in when none is said (a file of `file_suffix` aside)
    file_suffix: str | None = None  # a model given as a file of this suffix is this runtime's, and only its
    file_kind: str = ""  # such a file in words ("GGUF"), and what runs it ("llama.cpp"): its error lines
    runner: str = ""
    conversion: str | None = None  # "module:function" converting and loading a model folder (specdec/models/convert_*)
    options: Mapping[str, Any] = field(default_factory=dict)  # the conversion's keywords (its variant)
    derives: str | None = None  # a torch runtime that is the model derived in memory: NAME@derives
    package: Package | None = None  # None: torch and transformers, always installed
    timed_packages: tuple[str, ...] = ("torch", "transformers")  # modules whose versions its timings depend on
    needs_kernels: bool = False  # runs on one of specdec/kernels' instruction-set paths
    blocks_are_steps: bool = False  # a (k+1)-row block computes k+1 steps' logits bit for bit, by design
    exact_only_with: str | None = None  # ... on a CPU with this flag only
    block_drift: str | None = None  # why its greedy verify parts from its own steps, where it does (the report)
    weight_bits: int = 16  # bits read per weight, at least: the step floor known before it is loaded
    whole_file: bool = False  # a step reads the model's file whole (its size is the bytes a step streams)
    devices: bool = False  # runs on a GPU as well as the CPU (specdec/backends/devices.py)
    dtyped: bool = False  # runs in the run's --dtype (the others in their own precision, whatever it says)
    caches: bool = False  # takes the run's KV cache and CUDA graphs settings (the others keep their own cache)
    extra_buffers: bool = False  # takes llama.cpp's extra-buffer setting
    auto: frozenset[str] = frozenset()  # roles `auto` may choose it for (CLOUD, EDGE), where installed
    measured_first: bool = False  # `auto` measures it on every machine (loaded in seconds, nothing converted)
    calibrated: bool = False  # `specbench calibrate` measures it when no runtime is named
    peer: bool = False  # `specbench peers` times specbench's plain decoding in it by default

    def load(self, name: str, settings: Any, log: Callable[[str], object]) -> Any:
        """`name` loaded in this runtime (a LoadedModel): the loader imported on first use."""
        return self.resolved_loader()(name, settings, log)

    def resolved_loader(self) -> Callable[..., Any]:
        return _resolve(self.loader)

    def converter(self) -> Callable[..., Any] | None:
        return None if self.conversion is None else _resolve(self.conversion)

    def exact(self, flags: frozenset[str] | None = None) -> bool:
        """Its blocks are its steps bit for bit by design on this CPU (or one reporting `flags`)."""
        flags = _cpuinfo()[1] if flags is None else flags
        return self.blocks_are_steps and (self.exact_only_with is None or self.exact_only_with in flags)

    def installed(self) -> bool:
        """It can run in this install (its package is there; for the kernels, an instruction set one of their paths
        needs), checked without importing the package (llama_cpp loads its shared library on import)."""
        return ((self.package is None or importlib.util.find_spec(self.package.module) is not None)
                and not (self.needs_kernels and importlib.import_module(KERNELS).missing_flags()))

    def check(self, flag: str = "runtime") -> None:
        """It can run here, or one line naming the fix."""
        if self.needs_kernels:
            importlib.import_module(KERNELS).check_cpu()
        if self.package is not None and not self.installed():
            raise ConfigError(f"{flag} {self.name} needs {self.package.distribution}, which is not installed: "
                              f"{self.package.extra}")

    def runs_file(self, model: str) -> bool:
        return self.file_suffix is not None and model.endswith(self.file_suffix)


_REGISTRY: dict[str, Runtime] = {}
_ALIASES: dict[str, str] = {}
_DISCOVERED: list[bool] = []  # the declarations were imported (once a process)


def register(runtime: Runtime) -> Runtime:
    """Declare `runtime` (a module of this package does it on import; a plugin or a test before naming it)."""
    if _REGISTRY.get(runtime.name) == runtime:  # declared again as it was (a module imported twice)
        return _REGISTRY[runtime.name]
    if clash := {runtime.name, *runtime.aliases} & {*_REGISTRY, *_ALIASES}:
        raise ValueError(f"runtime name {sorted(clash)[0]!r} is declared twice")
    _REGISTRY[runtime.name] = runtime
    _ALIASES.update(dict.fromkeys(runtime.aliases, runtime.name))
    return runtime


def unregister(name: str) -> None:
    """Forget a runtime (a test's toy runtime, when it is done)."""
    runtime = _REGISTRY.pop(name)
    for alias in runtime.aliases:
        _ALIASES.pop(alias, None)


def runtimes() -> tuple[Runtime, ...]:
    return tuple(sorted(_declared().values(), key=lambda r: r.order))


def names() -> tuple[str, ...]:
    """Every runtime's name, in listing order."""
    return tuple(r.name for r in runtimes())


def known(name: str) -> Runtime | None:
    """The declaration of `name` (an old name too), or None for a name no runtime declares."""
    return _declared().get(_ALIASES.get(name, name))


def canonical_runtime(runtime: str) -> str:
    """A runtime (or PLAIN+BLOCKS pair) with every old name (a declaration's alias) replaced by the name it declares."""
    _declared()
    return "+".join(_ALIASES.get(part, part) for part in runtime.split("+"))


def runtime_parts(runtime: str) -> tuple[str, ...]:
    """`A+B` -> ("A", "B"): (plain steps', blocks') runtimes; one runtime -> (it,)."""
    return tuple(runtime.split("+"))


def choices_text() -> str:
    return ", ".join(names())


def declared(name: str, where: str = "runtime") -> Runtime:
    """The declaration of `name` (an old name too), or one line naming `where` it came from and the choices."""
    runtime = known(name)
    if runtime is None:
        raise ConfigError(f"unknown {where} {name!r}: use one of {choices_text()}")
    return runtime


def check_name(value: str, where: str) -> str:
    """`value` is one runtime (not PLAIN+BLOCKS): today's name of it, or one line naming `where` it came from."""
    if len(runtime_parts(value)) > 1:
        raise ConfigError(f"{where} takes one runtime, got {value!r}: use one of {choices_text()}")
    return declared(value, where).name


PAIR = "PLAIN+BLOCKS"  # how a cloud held in two runtimes is written


class RuntimeChoices:
    """The values a runtime setting takes, read from the registry when asked (a runtime registered later is a choice
    too): its runtimes, old names included, and with `pairs` PLAIN+BLOCKS of two different ones. Listed (argparse's
    usage, an error line) as the runtimes' names, then PLAIN+BLOCKS."""

    def __init__(self, pairs: bool = False) -> None:
        self.pairs = pairs

    def __contains__(self, value: object) -> bool:
        if not isinstance(value, str):
            return False
        parts = runtime_parts(canonical_runtime(value))
        known = all(part in _declared() for part in parts)
        return known and (len(parts) == 1 or (self.pairs and len(parts) == 2 and parts[0] != parts[1]))

    def __iter__(self):
        return iter((*names(), PAIR) if self.pairs else names())

    def __repr__(self) -> str:
        return f"RuntimeChoices(pairs={self.pairs})"


def default_runtime(model: str | None = None) -> str:
    """The runtime a model runs in when none is said: the one whose files it is (llama.cpp's `.gguf`), else the
    declared default (torch)."""
    for runtime in runtimes():
        if model is not None and runtime.runs_file(model):
            return runtime.name
    return next(r.name for r in runtimes() if r.default)


def check_runtime(runtime: str, flag: str = "runtime") -> None:
    """Every part of `runtime` is known and can run here, or one line naming the fix."""
    for part in runtime_parts(runtime):
        declared(part, flag).check(flag)


def runtime_installed(runtime: str) -> bool:
    """Every part of `runtime` can run in this install."""
    return all(part in _declared() and _REGISTRY[part].installed() for part in runtime_parts(canonical_runtime(runtime)))


def batch_invariant(runtime: str, flags: frozenset[str] | None = None) -> bool:
    """`runtime`'s blocks are its steps bit for bit by design on this CPU (or one reporting `flags`)."""
    found = known(runtime)
    return found is not None and found.exact(flags)


def served_runtime(model: str, runtime: str | None, flag: str = "--runtime") -> str:
    """The runtime a server of `model` runs: `runtime`, or by default the one its file needs (llama.cpp's `.gguf`)
    else the default; a model file in another runtime, or a runtime whose package is missing, is refused."""
    runtime = canonical_runtime(runtime or default_runtime(model))
    check_file(model, runtime, "model", flag)
    check_runtime(runtime, flag)
    return runtime


def check_file(model: object, runtime: str, role: str, flag: str, verb: str = "use") -> None:
    """A model given as a runtime's own file (a `.gguf`) runs in that runtime only: one line naming it otherwise."""
    if not isinstance(model, str):
        return
    owner = declared(default_runtime(model))
    if owner.runs_file(model) and any(part != owner.name for part in runtime_parts(runtime)):
        raise ConfigError(f"{role} {model!r} is a {owner.file_kind} file, which {owner.runner} runs: {verb} {flag} "
                          f"{owner.name}")


def exact_elsewhere() -> str:
    """Words naming the exact runtimes that need no kernel path: what to use where the kernels cannot run."""
    return "use runtime " + " or ".join(r.name for r in runtimes() if r.blocks_are_steps and not r.needs_kernels
                                        and r.exact_only_with is None)


def with_role(role: str) -> tuple[str, ...]:
    """The runtimes `auto` may choose for `role` (CLOUD or EDGE), whether installed or not."""
    return tuple(r.name for r in runtimes() if role in r.auto)


def _resolve(target: str | Callable[..., Any]) -> Callable[..., Any]:
    if callable(target):
        return target
    module, _, function = target.partition(":")
    return getattr(importlib.import_module(module), function)


PLUGINS = "SPECBENCH_RUNTIMES"  # comma-separated modules outside specdec/runtimes/ that declare runtimes
DECLARATIONS = "specdec.runtimes"  # the package whose modules declare the built-in runtimes


def _declared() -> dict[str, Runtime]:
    """The registry, its declarations imported on first use: specdec/runtimes/ (its __init__ imports every module
    beside it), then the modules SPECBENCH_RUNTIMES names (a process's children inherit it, so a sweep's or a
    calibration's workers know the same runtimes)."""
    if not _DISCOVERED:
        _DISCOVERED.append(True)
        importlib.import_module(DECLARATIONS)
        for module in filter(None, (m.strip() for m in os.environ.get(PLUGINS, "").split(","))):
            try:
                importlib.import_module(module)
            except ImportError as e:
                raise ConfigError(f"{PLUGINS} names {module!r}, which cannot be imported ({e}): fix the name or "
                                  f"unset {PLUGINS}") from None
    return _REGISTRY
