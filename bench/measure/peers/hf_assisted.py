"""Lossless speed against the peer at its best: specbench's greedy spec configurations (fixed k,
draft stop rules, k schedules) and Hugging Face's assisted generation (its defaults: 20 draft tokens
cut at confidence 0.4, and fixed k with the confidence cut off; its assistant bf16 as the edge, or
torch dynamic int8), on the same loaded models and prompts, interleaved prompt by prompt in a
rotating order so machine drift hits every configuration alike. Raw per-prompt times come out;
ratios are paired per prompt afterwards. The peers in other runtimes: runtimes.py.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

import torch

from bench.measure.workload import HF_DEFAULTS
from specdec.core.config import DecodeConfig, SpecConfig
from specdec.engine import Engine
from specdec.models.loading import LoadedModel
from specdec.settings import DType, Mode


@dataclass(frozen=True)
class PeerConfig:
    name: str
    spec: SpecConfig | None = None  # specbench's engine
    hf: dict | None = None  # HF assisted: the assistant's generation_config fields
    assistant: str = "edge"  # HF assisted: the edge, or a key of run_peer's `assistants` (an int8 copy)


SPECBENCH = (
    PeerConfig("specbench k=4", SpecConfig(k=4, entropy_threshold=0, policy="greedy")),
    PeerConfig("specbench k=6 pmin:0.4", SpecConfig(k=6, entropy_threshold=0, policy="greedy", draft_stop="pmin:0.4")),
    PeerConfig("specbench k=8 heuristic", SpecConfig(k=8, entropy_threshold=0, policy="greedy", k_schedule="heuristic")),
    PeerConfig("specbench k=8 heuristic pmin:0.4", SpecConfig(k=8, entropy_threshold=0, policy="greedy",
                                                             k_schedule="heuristic", draft_stop="pmin:0.4")),
)
HF = (
    PeerConfig("hf defaults (20, conf 0.4)", hf=HF_DEFAULTS),
    *(PeerConfig(f"hf k={k}", hf={"num_assistant_tokens": k, "num_assistant_tokens_schedule": "constant",
                                  "assistant_confidence_threshold": 0.0}) for k in (2, 4, 6)),
)
# HF assisted with the edge as torch dynamic int8 (`EDGE@int8`, fp32 activations) beside the bf16 edge.
INT8_ASSISTANT = "int8"
HF_INT8 = tuple(PeerConfig(f"hf int8 assistant {c.name.removeprefix('hf ')}", hf=c.hf, assistant=INT8_ASSISTANT)
                for c in HF[:3])


@dataclass
class Timed:
    config: str
    prompt: int
    tokens: list[int]  # new token ids ([] from a peer that reports text only)
    wall_s: float
    text: str = ""
    counted: int | None = None  # new tokens a text-only peer says it generated
    extra: dict = field(default_factory=dict)  # a peer's own figures (drafted, accepted, ...)

    @property
    def new_tokens(self) -> int:
        return len(self.tokens) if self.counted is None else self.counted


def run_peer(edge: LoadedModel, cloud: LoadedModel, texts: list[str], max_new_tokens: int,
             configs=SPECBENCH + HF, assistants: dict[str, LoadedModel] | None = None) -> list[Timed]:
    helpers = {"edge": edge, **(assistants or {})}
    engines = {c.name: Engine(mode=Mode.SPEC, edge=edge.name, cloud=cloud.name, dtype=DType.BFLOAT16, spec=c.spec,
                              decode=DecodeConfig(max_new_tokens=max_new_tokens),
                              loader=lambda name, settings, log: edge if name == edge.name else cloud,
                              log=lambda m: None)
               for c in configs if c.spec}
    for config in configs:  # warm-up, untimed: first-call allocations and kernel selection
        (engines[config.name].generate(texts[0]) if config.spec
         else hf_assisted(helpers[config.assistant], cloud, texts[0], 4, config.hf))
    timed = []
    for i, text in enumerate(texts):
        order = configs[i % len(configs):] + configs[: i % len(configs)]  # rotate who goes first
        for config in order:
            start = time.perf_counter()
            tokens = engines[config.name].generate(text).tokens if config.spec else hf_assisted(
                helpers[config.assistant], cloud, text, max_new_tokens, config.hf)
            timed.append(Timed(config.name, i, tokens, time.perf_counter() - start))
    return timed


@torch.inference_mode()
def hf_assisted(edge: LoadedModel, cloud: LoadedModel, text: str, max_new_tokens: int, settings: dict) -> list[int]:
    assistant = edge.backend.model.generation_config
    for key, value in settings.items():  # HF reads them from the assistant's generation_config
        setattr(assistant, key, value)
    input_ids = cloud.encode(text).input_ids.view(1, -1)  # the same chat-templated ids as the engine
    out = cloud.backend.model.generate(
        input_ids, attention_mask=torch.ones_like(input_ids), assistant_model=edge.backend.model, do_sample=False,
        max_new_tokens=max_new_tokens, eos_token_id=sorted(cloud.eos_ids), pad_token_id=cloud.tokenizer.pad_token_id,
    )
    return out[0, input_ids.shape[1]:].tolist()


def paired(timed: list[Timed], config: str, reference: str) -> dict:
    """Per prompt: tok/s of `config` / tok/s of `reference` on that prompt; median and range."""
    rate = {(t.config, t.prompt): t.new_tokens / t.wall_s for t in timed}
    ratios = [rate[(config, p)] / rate[(reference, p)] for c, p in rate if c == config and (reference, p) in rate]
    return {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios), "n": len(ratios)}


def pooled_tokens_per_s(timed: list[Timed], config: str) -> float:
    mine = [t for t in timed if t.config == config]
    return sum(t.new_tokens for t in mine) / sum(t.wall_s for t in mine)
