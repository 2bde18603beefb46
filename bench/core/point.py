"""What identifies a result: a `Point`, one field per run setting that changes what is measured,
written out below in the order of the run settings it copies (EngineConfig, where the cloud ran,
SpecConfig, DeployConfig, DecodeConfig, PromptInputs). tests/test_point.py checks it against those
dataclasses field by field, so a setting added to one of them (a runtime per role, say) and not to
`Point` fails that test, which names the field and where it goes (or name it in NOT_MEASURED).

    Point.of(engine, prompts)   the point a run measures: before the models load, as asked;
                                after, as used (the server's model as `cloud`, the chat template
                                as really applied)
    Point.from_row(row)         the point of a result record or a summary row
    point.record(sweep=...)     the point's fields as a result record writes them
    point.key(id=...)           which point (and prompt) a record belongs to: its AXES as JSON;
                                results, resumes and nll.jsonl scores are matched by it
    point.label()               `spec float32 code greedy k=4 thr=0 p>=0.1 cached`, for comparisons
    point.caches_here()         whether the point's kv_cache changes what it runs (a torch model in its process)
    given(point.link, "link")   a field where it applies (a sweep's split point has its link): not None
    AXES                        the fields a sweep takes a list of, in the order its grid is walked
                                (bench/measure/sweep/sweep_config.py makes them tuple fields): a new axis is one
                                name here
    COLUMNS                     a summary's point columns (bench/derive/summary.py groups by them)

A field that does not apply is None: the SpecConfig fields outside spec mode, `overlap` and `link`
outside split deployment, and a role's fields (`edge`, `edge_*`) when that role does not run.
"""
from __future__ import annotations

import json
import typing
from dataclasses import MISSING, asdict, dataclass, field, fields
from enum import StrEnum
from pathlib import Path
from typing import Any, TypeVar

from bench.core.prompts import SPEC_BENCH, PromptInputs, Turns, prompt_set_name
from specdec.core.config import DecodeConfig, DeployConfig, EngineConfig, SpecConfig
from specdec.core.drafters import NEEDS_MODEL
from specdec.runtime_registry import default_runtime, known, runtime_parts
from specdec.settings import Mode, as_words, choices

RUN_SETTINGS = (EngineConfig, PromptInputs, SpecConfig, DecodeConfig, DeployConfig)
# Run settings that say how a run reaches its models and prompts, not what it measures: the
# server's address is recorded as `deployment`, the rest changes no output of a finished sample.
NOT_MEASURED = ("cloud_url", "token_file", "cloud_timeout_s", "on_cloud_loss", "limit", "max_audio_s")


class Deployment(StrEnum):
    """Where a point's cloud ran (a record's `deployment`): parsed once where a sweep's list is read (SweepConfig),
    compared as members past it. A member is still its word in records, keys and resumes."""

    INPROC = "inproc"  # edge and cloud in one process
    SPLIT = "split"  # the cloud behind `specbench serve`, over a link
    # a spec point in one process pinned to the cloud's cores, the baseline of the split points
    # with the same pair and settings (a sweep adds it beside every split point)
    COLOCATED = "colocated"


class SplitCores(StrEnum):
    """How a sweep with split or co-located points placed its processes (a record's `split_cores`)."""

    DISJOINT = "disjoint"  # the edge and the server on cores of their own, as two machines have
    SHARED = "shared"  # both on every core (what every sweep did before the setting existed)


DEPLOYMENTS = choices(Deployment)


@dataclass(frozen=True)
class _Placement:
    """The point's fields that are not run settings: where the cloud ran, and over what link."""

    deployment: Deployment = field(default=Deployment.INPROC, metadata={
        "help": "inproc (edge and cloud in one process), split (the cloud behind `specbench serve`) or colocated "
                "(both in one process on the cloud's cores: the split points' baseline)",
        "choices": DEPLOYMENTS})
    link: str | None = field(default=None, metadata={
        "help": "split points: a real shaped link between edge and server (none, wifi, 4g, 5g, or "
                "rtt=40ms,up=10mbit,down=50mbit)"})


def _run_fields() -> list[tuple[str, Any, type]]:
    """(name, type, defined in) of each field `Point` must have, in order: every measured run setting,
    EngineConfig's first, then where it ran, typed as its setting (a settings enum as its word) or None.
    tests/test_point.py holds the written `Point` to it."""
    expected: list[tuple[str, Any, type]] = []
    for cls in (EngineConfig, _Placement, SpecConfig, DeployConfig, DecodeConfig, PromptInputs):
        hints = typing.get_type_hints(cls)
        expected += [(f.name, as_words(hints[f.name]) | None, cls) for f in fields(cls)
                     if f.init and f.name not in NOT_MEASURED]
    return expected


SETTINGS = {f.name: f for cls in (*RUN_SETTINGS, _Placement) for f in fields(cls)}  # name -> where it is defined
SETTING_TYPES = {name: hint for cls in (*RUN_SETTINGS, _Placement) for name, hint in typing.get_type_hints(cls).items()}
AXES = ("mode", "k", "entropy_threshold", "accept_threshold", "policy", "verifier", "draft_stop", "k_schedule", "drafter",
        "drafter_options", "dtype", "prompts", "constraints", "edge_runtime", "cloud_runtime", "kv_cache", "deployment",
        "link", "overlap")
# Axes added after results existed -> the value every earlier result had (left out of keys at that value).
# constraints: a decoding profile belongs to a prompt set (zh for the Chinese one-sentence task, none for
# an English edit), so one sweep pairs each set with its own through `rows`. kv_cache: the caches are timed
# against each other in one sweep, interleaved, instead of one sweep per cache. drafter_options: a drafter's
# settings (prompt lookup's token trees: branches=4) are compared in one sweep, each paired with its drafter by `rows`.
LATER_AXES = {"drafter": "model", "constraints": "none", "kv_cache": "auto", "drafter_options": ""}
SPEC_ONLY = tuple(f.name for f in fields(SpecConfig))
SPLIT_ONLY = ("link", "overlap")
# What ran first (mode, dtype, prompts, where), then the spec axes with the policy first, since it names the rule.
COLUMNS = [a for a in AXES if a not in SPEC_ONLY] + sorted((a for a in AXES if a in SPEC_ONLY), key=lambda a: a != "policy")
# The run's setting as the engine used it, where that can differ from the setting asked for.
USED = {"cloud": "cloud_name", "cloud_runtime": "cloud_runtime_used", "chat_template": "chat_template_used",
        "llamacpp_extra_buffers": "llamacpp_extra_buffers_used", "cloud_device": "cloud_device_used"}
# A plain decoding's mode -> the runtime axis that runs it (its baseline matching, a sweep's extra plain runtimes).
RUNTIME_OF = {"cloud": "cloud_runtime", "edge": "edge_runtime"}
# compare's label: the settings always named, with their short prefix, before any other axis off its default.
LABELLED = (("policy", ""), ("k", "k="), ("entropy_threshold", "thr="), ("accept_threshold", "p>="), ("verifier", ""))


def blank(values: dict) -> dict:
    """`values` with every field that does not apply at its mode and deployment set to None."""
    mode, split = values.get("mode"), values.get("deployment") == Deployment.SPLIT
    off = {"edge": mode == Mode.CLOUD, "cloud": mode == Mode.EDGE}

    def applies(name: str) -> bool:
        return not ((name in SPEC_ONLY and mode != Mode.SPEC) or (name in SPLIT_ONLY and not split)
                    or off.get(name.split("_")[0], False))

    return {name: value if applies(name) else None for name, value in values.items()}


@dataclass(frozen=True)
class Point:
    """The settings that identify a result; see the module's docstring. None: the field does not apply
    at the point's mode and deployment (`blank`), or a record was written before the field existed."""

    # EngineConfig: which models ran, in what
    mode: str | None = None  # edge or cloud alone (the baselines), or spec: the edge drafts, the cloud verifies
    edge: str | None = None  # the edge (draft) model: registry alias, local directory, hub id or .gguf file
    cloud: str | None = None  # the cloud (verify) model; once loaded, the name the engine (or its server) gives it
    dtype: str | None = None  # weights and activations of the torch runtime: bfloat16, float32, ...
    edge_runtime: str | None = None  # what ran the edge: a runtime's name (specdec/runtimes)
    cloud_runtime: str | None = None  # what ran the cloud, here or in the server (split)
    constraints: str | None = None  # the decoding profile: none, or zh (one short Chinese sentence)
    chat_template: bool | None = None  # the prompt goes through the tokenizer's chat template (once loaded: went)
    llamacpp_extra_buffers: str | None = None  # llama.cpp's extra buffer types (repacked weights, AMX): as asked,
    # auto, on or off; once loaded, as used, on or off (mixed: this process's two llama.cpp models differ); None: no
    # model of this process runs in llama.cpp (a split point's server model is not counted)
    edge_device: str | None = None  # where the edge's torch model ran: cpu, cuda or cuda:N
    cloud_device: str | None = None  # where the cloud's torch model ran (split: once connected, the server's own)
    kv_cache: str | None = None  # the torch models' KV cache: auto, dynamic, static or compiled (docs/gpu.md)
    cuda_graphs: str | None = None  # on CUDA with a static cache: captured steps (on) or eager (off)
    # _Placement: where the cloud ran, and over what link
    deployment: str | None = None  # inproc, split (the cloud behind `specbench serve`) or colocated (split's baseline)
    link: str | None = None  # split: the shaped link between edge and server: none, wifi, 4g, 5g or rtt=..,up=..
    # SpecConfig: spec mode only
    k: int | None = None  # draft tokens per block (the cap, under a k schedule)
    entropy_threshold: float | None = None  # escalate a block iff its uncertainty >= this many nats
    accept_threshold: float | None = None  # threshold policy: accept while p_cloud(draft) >= this probability
    policy: str | None = None  # the acceptance rule (specdec/core/policies/)
    verifier: str | None = None  # how the cloud keeps its state between calls (specdec/core/verifier.py)
    uncertainty: str | None = None  # a block's uncertainty from its tokens' entropies: max, mean or first
    punct_trigger: float | None = None  # also escalate blocks whose punctuation density exceeds this (None: off)
    draft_topn: int | None = None  # sample policy: drafts drawn from the edge's top-N (None: the whole distribution)
    draft_stop: str | None = None  # what ends a block early: none, entropy:NATS or pmin:P
    k_schedule: str | None = None  # the block length cap over time: constant, or heuristic
    drafter: str | None = None  # what proposed the blocks: model, prompt-lookup, ngram, hybrid, auto
    drafter_options: str | None = None  # the drafter's own settings, NAME=VALUE,... ("": its defaults)
    # DeployConfig: split only
    overlap: bool | str | None = None  # draft the next block while the server verifies: True, False or auto
    # DecodeConfig
    max_new_tokens: int | None = None  # tokens generated at most
    temperature: float | None = None  # 0: greedy; > 0: sampling at this temperature
    seed: int | None = None  # seed of the sampling generator
    # PromptInputs
    prompts: str | None = None  # the prompt set: a shipped set's name, or a prompts file's resolved path
    turns: str | None = None  # a conversation's later turns: all (each after the model's own answer) or first

    @classmethod
    def of(cls, engine, prompts: str, link: str | None = None, turns: str = Turns.ALL) -> Point:
        """The point `engine` measures on the prompt set `prompts` (a sweep's split point adds its link;
        `turns`: PromptInputs.turns)."""
        sources = {EngineConfig: engine, SpecConfig: engine.spec, DeployConfig: engine.deploy,
                   DecodeConfig: engine.decode}
        values = {f.name: getattr(source, USED.get(f.name, f.name)) for settings, source in sources.items()
                  for f in fields(settings) if f.name in FIELDS}
        values.update(prompts=prompts, link=link, turns=turns,
                      deployment=Deployment.SPLIT if engine.remote_cloud else Deployment.INPROC)
        return cls(**blank(values))

    @classmethod
    def from_row(cls, row: dict) -> Point:
        """A record's or summary row's point; a field the row lacks (written before it existed) is None,
        but for a spec row's drafter: before drafters were plug-ins every block came from the edge model."""
        values = {name: row.get(name) for name in FIELDS}
        if values["mode"] == Mode.SPEC and "drafter" not in row:
            values["drafter"] = "model"
        return cls(**values)

    def record(self, sweep: bool = False) -> dict:
        """The point's fields of a result record. A run has no link: its records leave the field out
        (as they always have, so a run folder written before keeps its identity); a sweep's carry it."""
        values = asdict(self)
        if not sweep:
            del values["link"]
        return values

    def key(self, **extra) -> str:
        """Which point (with `extra`, e.g. the prompt's id) a record belongs to: the axes, as JSON. An
        axis added after results were written (LATER_AXES) is left out at the value every earlier
        result had, so their keys, and the nll.jsonl scores stored under them, still match."""
        axes = {axis: getattr(self, axis) for axis in AXES
                if not (axis in LATER_AXES and getattr(self, axis) in (None, LATER_AXES[axis]))}
        return json.dumps({**axes, **extra}, sort_keys=True)

    def label(self) -> str:
        """`spec bfloat16 code greedy k=4 thr=0 p>=0.1 cached`: readable, and one per summary row (an
        axis off its run default is named too, e.g. `deployment=split link=4g`)."""
        def shown(value) -> bool:
            return value not in ("-", None)

        def text(value) -> str:
            return f"{value:g}" if isinstance(value, float) else str(value)

        prompts = str(self.prompts)
        prompts_name = prompt_set_name(prompts) if prompts.startswith(SPEC_BENCH) else Path(prompts).stem
        parts = [str(self.mode), str(self.dtype), prompts_name]
        parts += [f"{short}{text(getattr(self, name))}" for name, short in LABELLED if shown(getattr(self, name))]
        named = {"mode", "dtype", "prompts", *(name for name, _ in LABELLED)}
        for axis in COLUMNS:
            value, default = getattr(self, axis), SETTINGS[axis].default
            if axis not in named and shown(value) and value != (None if default is MISSING else default):
                parts.append(f"{axis}={text(value)}")
        return " ".join(parts)

    def caches_here(self) -> bool:
        """Whether `kv_cache` changes what this point runs: it is the KV cache of the torch runtime's models
        loaded in the point's own process (specdec/engine.py's `placement`). llama.cpp, ONNX Runtime, OpenVINO
        and the int8 runtimes keep their own and ignore it, a draft-free drafter runs no edge model, and a
        split point's cloud runs in its server, as that server was started. A field a row lacks ("-" or None:
        written before it existed) reads as it did then: the torch runtime, the edge model drafting."""
        def parts(runtime) -> tuple[str, ...]:
            return (default_runtime(),) if runtime in (None, "-") else runtime_parts(str(runtime))

        drafts = self.drafter in (None, "-") or self.drafter in NEEDS_MODEL
        edge = parts(self.edge_runtime) if self.mode == Mode.EDGE or (self.mode == Mode.SPEC and drafts) else ()
        here = self.mode == Mode.CLOUD or (self.mode == Mode.SPEC and self.deployment != Deployment.SPLIT)
        cloud = parts(self.cloud_runtime) if here else ()
        return any(runtime is not None and runtime.caches for runtime in map(known, (*edge, *cloud)))


Value = TypeVar("Value")


def given(value: Value | None, name: str) -> Value:
    """A point's field where it applies, so it is set (a sweep's points have their mode, dtype and prompt set; a
    split one its link and cloud runtime): None there is a bug, said as one."""
    if value is None:
        raise ValueError(f"the point has no {name}")
    return value


FIELDS = tuple(f.name for f in fields(Point))
