"""A fixed, deterministic workload on one edge/cloud pair, shared by the pytest-benchmark suites
and the regression gate: the engine's three modes plus Hugging Face's own assisted generation
(the peer baseline) on the same models, prompts and k.

Everything runs in one process on models loaded once. Each mode's pass over the prompts returns
raw per-prompt outputs; metrics are derived from them afterwards (`mode_metrics`).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from transformers import GenerationConfig

from bench.core.prompts import load_prompts
from bench.derive import metrics
from bench.derive.gate_verdict import Suite
from bench.derive.health import text_health
from bench.measure import tinypair
from specdec.backends.base import Backend
from specdec.core.config import DecodeConfig, SpecConfig
from specdec.engine import Engine
from specdec.errors import ConfigError
from specdec.models.loading import LoadedModel, LoadSettings, load_model
from specdec.settings import DType, Mode, parse_fields

EDGE_ALIAS, CLOUD_ALIAS = "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"
TINY = "tiny"  # the edge/cloud name of the in-process pair (bench/measure/tinypair.py)
ENGINE_MODES = tuple(Mode)  # edge, cloud, spec: the order the gate's passes rotate through
HF_ASSISTED = "hf_assisted"  # HF assisted generation at the workload's fixed k, confidence cut off
HF_ASSISTED_DEFAULTS = "hf_assisted_defaults"  # HF assisted as shipped: 20 draft tokens cut at confidence 0.4
MODES = ENGINE_MODES + (HF_ASSISTED, HF_ASSISTED_DEFAULTS)
# HF's own defaults for an assistant (GenerationConfig's, applied when the assistant sets none).
HF_DEFAULTS = {key: value for key, value in GenerationConfig()._get_default_generation_params().items()
               if key in ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")}
# Controls for the gate: transformers' own greedy `generate()` on each model alone. They run no
# code of ours past tokenization, so our edge or cloud forward getting slower shows up as
# edge/hf_greedy_edge or cloud/hf_greedy_cloud dropping, even when it slows every mode alike and
# the ratios between our own modes do not move.
HF_GREEDY = {"hf_greedy_edge": "edge", "hf_greedy_cloud": "cloud"}  # mode -> role
GATE_MODES = MODES + tuple(HF_GREEDY)

# wrap(mode, role, backend) -> the backend that mode uses for that role: how a test injects a
# slowed verifier or any other backend change without touching the engine or transformers.
BackendWrap = Callable[[str, str, Backend], Backend]


@dataclass(frozen=True)
class Workload:
    suite: Suite = field(metadata={"help": "tiny (in-process random pair, fp32) or real (the Qwen pair, bf16)"})
    prompts: tuple[str, ...] = field(metadata={"help": "prompt texts, run in this order"})
    dtype: DType = DType.FLOAT32
    edge: str = TINY
    cloud: str = TINY
    max_new_tokens: int = 32
    k: int = 4
    entropy_threshold: float = field(default=0.0, metadata={"help": "0 = verify every block"})
    policy: str = "greedy"
    accept_threshold: float = 0.1
    edge_noise: float = field(default=tinypair.EDGE_NOISE, metadata={"help": "tiny pair only: edge weight noise"})
    repeats: int = field(default=5, metadata={"help": "timed passes per mode; ratios are their medians"})
    threads: int = field(default=1, metadata={"help": "torch intra-op threads"})

    def __post_init__(self) -> None:
        try:
            parse_fields(self)  # a Suite from here on
        except ConfigError:
            raise ConfigError(f"unknown suite {self.suite!r}: use tiny or real") from None
        if not self.prompts:
            raise ConfigError("a workload needs at least one prompt")
        if self.repeats < 1:
            raise ConfigError(f"repeats must be >= 1, got {self.repeats}")
        if self.threads < 1:
            raise ConfigError(f"threads must be >= 1, got {self.threads}")
        self.spec_config()  # validates k, thresholds and policy
        self.decode_config()

    def spec_config(self) -> SpecConfig:
        return SpecConfig(k=self.k, entropy_threshold=self.entropy_threshold, policy=self.policy,
                          accept_threshold=self.accept_threshold)

    def decode_config(self) -> DecodeConfig:
        return DecodeConfig(max_new_tokens=self.max_new_tokens)  # greedy


def tiny_workload(**changes) -> Workload:
    """The gate's tiny suite: 4 prompts x 32 tokens on the fp32 tiny pair, greedy, k=4, verify all.
    A pass takes 0.1-0.4 s, so 9 repeats: the medians must hold up while other processes run."""
    return dataclasses.replace(Workload(suite=Suite.TINY, prompts=tinypair.PROMPTS, repeats=9), **changes)


def real_workload(**changes) -> Workload:
    """The gate's real suite: 2 `code` prompts x 16 tokens on the bf16 Qwen2.5-Coder pair, greedy,
    k=4, verify every block, ONE thread: with 2 threads on 2 shared cores, OpenMP stragglers slow
    the many small edge forwards more than the cloud's, and every ratio fell ~30 % under load."""
    prompts = tuple(r.prompt for r in load_prompts("code")[:2])
    base = Workload(suite=Suite.REAL, prompts=prompts, dtype=DType.BFLOAT16, edge=EDGE_ALIAS, cloud=CLOUD_ALIAS,
                    max_new_tokens=16, repeats=3, threads=1)
    return dataclasses.replace(base, **changes)


SUITES = {Suite.TINY: tiny_workload, Suite.REAL: real_workload}


@dataclass
class Output:
    """One prompt's generation in one mode (raw: metrics are derived from these)."""
    tokens: list[int]
    text: str
    wall_s: float  # prompt text in -> text out, encoding and decoding included
    cycles: int = 0
    cloud_calls: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0

    def counts(self) -> dict:
        """The raw counts bench.derive.metrics pools (a results record's names)."""
        return {"new_tokens": len(self.tokens), "latency_s": self.wall_s, "cycles": self.cycles,
                "cloud_calls": self.cloud_calls, "num_draft_tokens": self.num_draft_tokens,
                "num_accepted_tokens": self.num_accepted_tokens}


class Pair:
    """The workload's two models, loaded once, and one engine per mode on them."""

    def __init__(self, workload: Workload, wrap: BackendWrap | None = None, log: Callable[[str], object] = print) -> None:
        self.workload = workload
        self._tmp = None
        names = {"edge": workload.edge, "cloud": workload.cloud}
        if workload.suite == Suite.TINY:
            self._tmp = tempfile.TemporaryDirectory(prefix="specbench-tiny-")
            names = tinypair.save_pair(self._tmp.name, edge_noise=workload.edge_noise)
        self.models = {role: load_model(name, workload.dtype, log=log) for role, name in names.items()}
        self.engines: dict[str, Engine] = {mode: self._engine(mode, wrap, log) for mode in ENGINE_MODES}
        # Confidence threshold 0 keeps every block at exactly k draft tokens, as our engine's.
        self.assistant_settings = {
            HF_ASSISTED: {"num_assistant_tokens": workload.k, "num_assistant_tokens_schedule": "constant",
                          "assistant_confidence_threshold": 0.0},
            HF_ASSISTED_DEFAULTS: HF_DEFAULTS,
        }

    def _engine(self, mode: Mode, wrap: BackendWrap | None, log: Callable[[str], object]) -> Engine:
        by_name = {loaded.name: (role, loaded) for role, loaded in self.models.items()}

        def loader(name: str, settings: LoadSettings, log: Callable[[str], object] = log) -> LoadedModel:
            role, loaded = by_name[name]
            return dataclasses.replace(loaded, backend=wrap(mode, role, loaded.backend)) if wrap else loaded

        w = self.workload
        return Engine(mode=mode, edge=self.models["edge"].name, cloud=self.models["cloud"].name, dtype=w.dtype,
                      spec=w.spec_config(), decode=w.decode_config(), loader=loader, log=log)

    def run(self, mode: str) -> list[Output]:
        """One pass of `mode` over every prompt."""
        return [self.generate(mode, text) for text in self.workload.prompts]

    def generate(self, mode: str, text: str) -> Output:
        """One prompt in one mode."""
        torch.set_num_threads(self.workload.threads)  # process-wide; another pair may have changed it
        if mode in self.assistant_settings:
            return self._hf_assisted(text, self.assistant_settings[mode])
        if mode in HF_GREEDY:
            return self._hf_greedy(HF_GREEDY[mode], text)
        start = time.perf_counter()
        generation = self.engines[mode].generate(text)
        wall_s = time.perf_counter() - start
        c = generation.counters
        return Output(generation.tokens, generation.text, wall_s, c.cycles, c.cloud_calls,
                      c.num_draft_tokens, c.num_accepted_tokens)

    @torch.inference_mode()
    def _hf_assisted(self, text: str, settings: dict) -> Output:
        edge, cloud = self.models["edge"], self.models["cloud"]
        assistant = edge.backend.model.generation_config
        for key, value in settings.items():  # HF reads them from the assistant's generation_config
            setattr(assistant, key, value)
        start = time.perf_counter()
        input_ids = cloud.encode(text).input_ids.view(1, -1)  # the same chat-templated ids as the engine
        out = cloud.backend.model.generate(
            input_ids, attention_mask=torch.ones_like(input_ids), assistant_model=edge.backend.model,
            do_sample=False, max_new_tokens=self.workload.max_new_tokens,
            eos_token_id=sorted(cloud.eos_ids), pad_token_id=cloud.tokenizer.pad_token_id,
        )
        tokens = out[0, input_ids.shape[1]:].tolist()
        decoded = cloud.tokenizer.decode(tokens, skip_special_tokens=True)
        return Output(tokens, decoded, time.perf_counter() - start)

    @torch.inference_mode()
    def _hf_greedy(self, role: str, text: str) -> Output:
        loaded = self.models[role]
        start = time.perf_counter()
        input_ids = loaded.encode(text).input_ids.view(1, -1)
        out = loaded.backend.model.generate(
            input_ids, attention_mask=torch.ones_like(input_ids), do_sample=False,
            max_new_tokens=self.workload.max_new_tokens, eos_token_id=sorted(loaded.eos_ids),
            pad_token_id=loaded.tokenizer.pad_token_id,
        )
        tokens = out[0, input_ids.shape[1]:].tolist()
        decoded = loaded.tokenizer.decode(tokens, skip_special_tokens=True)
        return Output(tokens, decoded, time.perf_counter() - start)

    def close(self) -> None:
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> Pair:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def tokens_sha256(outputs: list[Output]) -> str:
    """sha256 of the JSON list of per-prompt token-id lists (prompt boundaries included)."""
    return hashlib.sha256(json.dumps([o.tokens for o in outputs]).encode()).hexdigest()


def mode_metrics(outputs: list[Output]) -> dict:
    """One mode's metrics over the prompt set (bench.derive.metrics: rates pool tokens over prompts)."""
    t = metrics.totals(o.counts() for o in outputs)
    health = [text_health(o.text) for o in outputs]
    result = {
        "new_tokens": t["new_tokens"],
        "tokens_sha256": tokens_sha256(outputs),
        "tokens_per_s": metrics.tokens_per_s(t),
        "punct_density": statistics.fmean(h["punct_density"] for h in health),
        "repeat_3gram": statistics.fmean(h["repeat_3gram"] for h in health),
        "immediate_repeats": sum(h["immediate_repeats"] for h in health),
    }
    if t["cycles"] and t["num_draft_tokens"]:  # spec mode
        result.update(
            acceptance_rate=metrics.acceptance_rate(t),
            cloud_calls=t["cloud_calls"],
            cloud_call_rate=metrics.cloud_call_rate(t),  # per drafted block, as the sweep's summary
            cloud_calls_per_token=metrics.cloud_calls_per_token(t),
        )
    return result
