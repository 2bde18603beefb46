"""The peers of the runtimes on one GGUF pair: plain decoding as llama-cpp-python ships it, its prompt
lookup (`LlamaPromptLookupDecoding`, the draft-free speculation it ships), specbench's plain decoding
through each cloud runtime asked, llama.cpp's own speculative decoding (the example binary,
llama_speculative.py: a draft model, or its draft-free n-gram types), specbench's lossless speculative
configurations across runtimes (the model drafter, prompt lookup, `auto`), and the field's engines
(`external`): onnxruntime-genai's Generator in this process, vLLM's CPU engine and OpenVINO GenAI in
venvs of their own as workers (peer_worker.py). All interleaved prompt by prompt in a rotating order so
machine drift hits every peer alike.

Every peer gets the same chat-templated prompt (the ids specbench encodes; the example gets their text
and its token count is checked against them), greedy, the same threads, and is timed from the prompt's
first forward to its last token, model load excluded; where a peer reports it, the first token's time
too (the prompt and decoding parts apart). Raw per-prompt timings go to a JSONL file as they are taken
(a rerun starts afresh: it does not resume). Speed-ups are pooled over prompts (tokens over seconds)
against the fastest plain decoding of any peer, with 95 % paired bootstrap intervals.
"""
from __future__ import annotations

import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from bench.derive.metrics import median_ci, speedup, speedup_ci
from bench.measure.peers import envs
from bench.measure.peers.hf_assisted import Timed, pooled_tokens_per_s
from bench.measure.peers.llama_speculative import SPEC_SETTINGS, SPEC_TYPES, run_speculative
from bench.measure.peers.ort_genai import VARIANT, OrtGenai, ort_genai_name
from bench.measure.peers.peer_worker import PeerWorker
from specdec.core.config import DecodeConfig, SpecConfig
from specdec.core.drafters import DRAFTERS, NEEDS_MODEL, drafter_options
from specdec.engine import Engine
from specdec.errors import ConfigError
from specdec.models.convert_onnx import ensure_onnx
from specdec.models.loading import LoadedModel, LoadSettings, load
from specdec.models.registry import gguf_path, model_dir
from specdec.runtime_registry import RuntimeChoices, default_runtime, names, runtimes
from specdec.settings import DType, Mode

LLAMA_CPP_PYTHON = "llama-cpp-python plain"
LLAMA_PROMPT_LOOKUP = "llama-cpp-python prompt lookup (n-gram 2, 10 tokens)"  # LlamaPromptLookupDecoding's defaults
LLAMA_SPECULATIVE = "llama.cpp speculative (n-max 3)"  # draft-simple: the 0.5B drafting


LLAMA_PYTHON = ("plain", "flash-off", "lookup")  # SPECBENCH_PEER_LLAMA_PYTHON: llama-cpp-python's ways run
# SPECBENCH_PEER_EXTERNAL: the field's engines beside specbench. onnxruntime-genai runs in this environment (its pin
# is the `onnx` extra's); vLLM and OpenVINO GenAI in venvs of their own (envs.py), driven as workers (peer_worker.py).
EXTERNAL = ("onnxruntime-genai", "openvino-genai", "vllm")
# Each worker's engines (its plain decoding first: the reference of the others), and those it loads unless
# SPECBENCH_PEER_ENGINES names others. vLLM loads two by default: each of its engines held ~7 GB here (weights, KV
# cache, its worker process), and a third ran this 24 GB machine out of memory (the kernel killed VLLM::Worker).
WORKER_ENGINES = {"vllm": ("vllm", "vllm-ngram", "vllm-draft"),
                  "openvino-genai": ("openvino-genai", "openvino-genai-lookup", "openvino-genai-draft")}
DEFAULT_ENGINES = {"vllm": ("vllm", "vllm-draft"), "openvino-genai": WORKER_ENGINES["openvino-genai"]}


def llama_peer_name(spec_type: str) -> str:
    """The peer name of llama.cpp's example under one speculation type (llama_speculative.SPEC_TYPES, or a
    named setting of one, llama_speculative.SPEC_SETTINGS)."""
    if spec_type == "draft-simple":
        return LLAMA_SPECULATIVE
    if spec_type in SPEC_SETTINGS:
        base, flags = SPEC_SETTINGS[spec_type]
        return f"llama.cpp {base} {' '.join(flags)} (no draft model)"
    return f"llama.cpp {spec_type} (no draft model, its defaults)"


def gguf_runtime() -> str:
    """The runtime of the registry's GGUF files (llama.cpp's): llama.cpp's own engines are the peers of specbench's
    decoding in it, and the model drafter runs there."""
    return default_runtime(".gguf")


# SPECBENCH_PEER_RUNTIMES: specbench's plain decoding in each (the declarations' `peer`: llama.cpp's, then torch's int8)
CLOUD_RUNTIMES = tuple(sorted((r.name for r in runtimes() if r.peer), key=lambda name: name != gguf_runtime()))


def cloud_only(runtime: str) -> str:
    return f"specbench {runtime} cloud-only"


# SPECBENCH_PEER_SPEC: the model drafter, the hybrid, and every draft-free drafter (prompt lookup, `auto`, n-grams, suffix)
SPEC_MODES = ("model", "hybrid", *(name for name in DRAFTERS if name not in NEEDS_MODEL))
# The hybrid's peers: SPECBENCH_PEER_HYBRID, its drafter options, one peer per `;`-separated entry; the 0.5B runs in the
# cloud's runtime and stops a block at a token it gives under 0.7 (HYBRID_STOP)
HYBRID_OPTIONS = ("suffix=1,head_vocab=32768",)
HYBRID_STOP = "pmin:0.7"


def spec_peers(cloud_runtimes: tuple[str, ...], modes: tuple[str, ...] = ("model", "prompt-lookup"),
               draft_free_ks: tuple[int, ...] = (4,)) -> list[tuple[str | None, str, int, str]]:
    """(edge runtime, cloud runtime, k, drafter) of specbench's speculative peers: greedy, every block
    verified. The model drafter (the 0.5B) on the pairings measured since the runtimes began, and the
    draft-free drafters asked (SPEC_MODES: prompt lookup, `auto`, the suffix drafter, ...) at each k of
    `draft_free_ks`, verified in every cloud runtime asked, in SPEC_MODES' order."""
    found: list[tuple[str | None, str, int, str]] = []
    if "model" in modes:
        gguf, other = CLOUD_RUNTIMES
        model = [(gguf, other, 3), (gguf, other, 4), (gguf, gguf, 4), (other, other, 4)]
        found += [(edge, cloud, k, "model") for edge, cloud, k in model if cloud in cloud_runtimes]
        found += [(gguf, cloud, 4, "model") for cloud in cloud_runtimes if cloud not in CLOUD_RUNTIMES]
    if "hybrid" in modes:  # the edge in the cloud's runtime: the kernels' head can be cut to fewer ids (head_vocab)
        found += [(cloud, cloud, k, "hybrid") for k in draft_free_ks for cloud in cloud_runtimes]
    for drafter in SPEC_MODES[2:]:
        if drafter in modes:
            found += [(None, cloud, k, drafter) for k in draft_free_ks for cloud in cloud_runtimes]
    return found


@dataclass(frozen=True)
class PeerSettings:
    """What the suite (bench/test_bench_peer_runtimes.py) reads from its environment, and builds its peers by
    (build_peers); a bad value is one ConfigError naming the variable and an example, before any model loads."""

    prompts_per_set: int = 3  # SPECBENCH_PEER_PROMPTS
    max_new_tokens: int = 48  # SPECBENCH_PEER_TOKENS
    threads: int = 2  # SPECBENCH_PEER_THREADS
    sink: Path = Path("runs/peer_runtimes.jsonl")  # SPECBENCH_PEER_JSONL: raw timings, overwritten
    sets: tuple[str, ...] = ("code", "zh-describe", "en-chat")  # SPECBENCH_PEER_SETS, comma-separated prompt sets
    cloud_runtimes: tuple[str, ...] = CLOUD_RUNTIMES  # SPECBENCH_PEER_RUNTIMES, comma-separated
    llama_spec_types: tuple[str, ...] = ("draft-simple",)  # SPECBENCH_PEER_LLAMA_SPEC: the example's types, comma-separated
    llama_python: tuple[str, ...] = LLAMA_PYTHON  # SPECBENCH_PEER_LLAMA_PYTHON: llama-cpp-python's ways, comma-separated
    external: tuple[str, ...] = ()  # SPECBENCH_PEER_EXTERNAL: some of EXTERNAL, comma-separated
    spec_modes: tuple[str, ...] = ("model", "prompt-lookup")  # SPECBENCH_PEER_SPEC: some of SPEC_MODES
    engines: tuple[str, ...] = ()  # SPECBENCH_PEER_ENGINES: the workers' engines (WORKER_ENGINES); () their defaults
    draft_free_ks: tuple[int, ...] = (4,)  # SPECBENCH_PEER_K: the draft-free drafters' k, comma-separated (each a peer)
    hybrid_options: tuple[str, ...] = HYBRID_OPTIONS  # SPECBENCH_PEER_HYBRID: the hybrid's options, `;`-separated

    ENV = {"prompts_per_set": "SPECBENCH_PEER_PROMPTS", "max_new_tokens": "SPECBENCH_PEER_TOKENS",
           "threads": "SPECBENCH_PEER_THREADS", "sink": "SPECBENCH_PEER_JSONL", "sets": "SPECBENCH_PEER_SETS",
           "cloud_runtimes": "SPECBENCH_PEER_RUNTIMES", "llama_spec_types": "SPECBENCH_PEER_LLAMA_SPEC",
           "llama_python": "SPECBENCH_PEER_LLAMA_PYTHON", "external": "SPECBENCH_PEER_EXTERNAL",
           "spec_modes": "SPECBENCH_PEER_SPEC", "engines": "SPECBENCH_PEER_ENGINES", "draft_free_ks": "SPECBENCH_PEER_K",
           "hybrid_options": "SPECBENCH_PEER_HYBRID"}
    LISTS = ("sets", "cloud_runtimes", "llama_spec_types", "llama_python", "external", "spec_modes", "engines",
             "draft_free_ks")

    def __post_init__(self) -> None:
        if unknown := [r for r in self.cloud_runtimes if r not in RuntimeChoices()]:
            raise ConfigError(f"SPECBENCH_PEER_RUNTIMES names {unknown[0]!r}: use some of {', '.join(names())}, "
                              f"e.g. SPECBENCH_PEER_RUNTIMES={','.join(CLOUD_RUNTIMES)}")
        if unknown := [t for t in self.llama_spec_types if t not in SPEC_TYPES and t not in SPEC_SETTINGS]:
            raise ConfigError(f"SPECBENCH_PEER_LLAMA_SPEC names {unknown[0]!r}: use some of "
                              f"{', '.join((*SPEC_TYPES, *SPEC_SETTINGS))}, e.g. "
                              "SPECBENCH_PEER_LLAMA_SPEC=draft-simple,ngram-simple,ngram-mod")
        for variable, given, known in (("SPECBENCH_PEER_LLAMA_PYTHON", self.llama_python, LLAMA_PYTHON),
                                       ("SPECBENCH_PEER_EXTERNAL", self.external, EXTERNAL),
                                       ("SPECBENCH_PEER_SPEC", self.spec_modes, SPEC_MODES),
                                       ("SPECBENCH_PEER_ENGINES", self.engines,
                                        tuple(e for engines in WORKER_ENGINES.values() for e in engines))):
            if unknown := [name for name in given if name not in known]:
                raise ConfigError(f"{variable} names {unknown[0]!r}: use some of {', '.join(known)}, e.g. "
                                  f"{variable}={','.join(known[:2])}")
        if not self.sets or not self.cloud_runtimes:
            raise ConfigError("SPECBENCH_PEER_SETS and SPECBENCH_PEER_RUNTIMES need at least one name each, e.g. "
                              "SPECBENCH_PEER_SETS=spec-bench:question.jsonl:summarization")
        for name in ("prompts_per_set", "max_new_tokens", "threads"):
            value = getattr(self, name)
            if not _whole_number(value):
                raise ConfigError(f"{self.ENV[name]}={value!r}: need a whole number >= 1, e.g. "
                                  f"{self.ENV[name]}={getattr(PeerSettings, name)}")
        if not self.draft_free_ks or not all(map(_whole_number, self.draft_free_ks)):
            raise ConfigError(f"SPECBENCH_PEER_K={','.join(map(str, self.draft_free_ks))!r}: need whole numbers >= 1, "
                              "comma-separated, e.g. SPECBENCH_PEER_K=4,8")
        for options in self.hybrid_options:
            try:
                drafter_options("hybrid", options)
            except ConfigError as e:
                raise ConfigError(f"SPECBENCH_PEER_HYBRID={options!r}: {e} (entries `;`-separated, e.g. "
                                  f"SPECBENCH_PEER_HYBRID='suffix=1;{HYBRID_OPTIONS[0]}')") from None
        if self.sink.is_dir():
            raise ConfigError(f"SPECBENCH_PEER_JSONL={str(self.sink)!r} is a folder: give a file path, e.g. "
                              "runs/peer_runtimes.jsonl")

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> PeerSettings:
        values: dict[str, Any] = {}
        for name, variable in cls.ENV.items():
            text = environ.get(variable, "").strip()
            if not text:
                continue
            if name == "sink":
                values[name] = Path(text).expanduser()
                continue
            if name == "hybrid_options":
                values[name] = tuple(part.strip() for part in text.split(";"))
                continue
            if name in cls.LISTS and text == "none" and name in ("llama_python", "llama_spec_types", "spec_modes"):
                values[name] = ()  # none of them
                continue
            if name in cls.LISTS:
                # a Spec-Bench set names its categories after a colon and commas: split on commas outside those
                parts = _split_sets(text) if name == "sets" else (p.strip() for p in text.split(",") if p.strip())
                values[name] = tuple(int(p) if name == "draft_free_ks" and p.isdigit() else p for p in parts)
                continue
            try:
                values[name] = int(text)
            except ValueError:
                values[name] = text  # refused, with its variable's name, by __post_init__
        return cls(**values)


def _whole_number(value: object) -> bool:
    """A setting's count: an int >= 1 (not a bool, not the text that failed to parse)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _split_sets(text: str) -> list[str]:
    """"code,spec-bench:q.jsonl:summarization,rag" -> ["code", "spec-bench:q.jsonl:summarization,rag"]: a
    name without a colon after a Spec-Bench set is one of its categories."""
    sets: list[str] = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        if sets and sets[-1].startswith("spec-bench:") and sets[-1].count(":") >= 2 and ":" not in part \
                and part not in ("code", "zh-describe", "en-chat", "zh-chat", "edit-code", "edit-text"):
            sets[-1] += f",{part}"
        else:
            sets.append(part)
    return sets


class LlamaCppPython:
    """llama-cpp-python's own greedy generation: `Llama.generate` (its sampler chain reduced to greedy
    by temp 0, top-k 1, no penalties) fed the token ids, stopped at an EOS id or the budget. One thread
    count for prompt and tokens, no `logits_all`. `flash_attn`: `Llama` turns it off unless asked,
    where specbench's backend and the example leave llama.cpp's `auto` (on, on this CPU).
    `prompt_lookup`: its draft-free speculation as shipped, `Llama(draft_model=LlamaPromptLookupDecoding())`
    (n-grams of up to 2 tokens, up to 10 drafted; llama-cpp-python then computes every row's logits,
    `logits_all`, and keeps the longest prefix of the draft its own greedy choices agree with)."""

    def __init__(self, path: str, threads: int, n_ctx: int = 4096, n_batch: int = 512, flash_attn: bool = True,
                 prompt_lookup: bool = False):
        import llama_cpp  # loads its shared library: only where this peer runs
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        draft = LlamaPromptLookupDecoding() if prompt_lookup else None
        # With a draft model `Llama` computes every row's logits whatever `logits_all` says, but sizes its score
        # buffer by it: logits_all=False there breaks every prompt longer than one batch (llama-cpp-python 0.3.36).
        self.llm = llama_cpp.Llama(model_path=str(path), n_ctx=n_ctx, n_batch=n_batch, n_threads=threads,
                                   n_threads_batch=threads, logits_all=prompt_lookup, flash_attn=flash_attn,
                                   verbose=False, draft_model=draft)

    def generate(self, ids: list[int], max_new_tokens: int, eos_ids: frozenset[int]) -> list[int]:
        return self.generate_timed(ids, max_new_tokens, eos_ids)[0]

    def generate_timed(self, ids: list[int], max_new_tokens: int, eos_ids: frozenset[int]) -> tuple[list[int], float | None]:
        """(new token ids, time.perf_counter() when the first came)."""
        self.llm.reset()  # no prefix reuse from the previous prompt: the whole prompt is evaluated, as in every peer
        tokens: list[int] = []
        first = None
        for token in self.llm.generate(ids, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0, reset=True):
            first = first or time.perf_counter()
            tokens.append(int(token))
            if token in eos_ids or len(tokens) == max_new_tokens:
                break
        return tokens, first


@dataclass(frozen=True)
class Peer:
    name: str
    reference: str | None  # the greedy decoding whose output this one should equal
    run: Callable[[int], Timed]  # prompt index -> its timed outcome
    plain: bool = False  # a plain decoding: a candidate for "the fastest plain decoding" every ratio is over


def cached_loader(dtype: DType, log: Callable[[str], object]) -> Callable[..., LoadedModel]:
    """An Engine loader that loads each (name, runtime) once, in `dtype`, for every engine that asks."""
    loaded: dict[tuple[str, str], LoadedModel] = {}

    def load_once(name: str, settings: LoadSettings, _log: Callable[[str], object] = log) -> LoadedModel:
        if (name, settings.runtime) not in loaded:
            loaded[(name, settings.runtime)] = load(name, replace(settings, dtype=dtype), log)
        return loaded[(name, settings.runtime)]
    return load_once


def build_peers(edge: str, cloud: str, prompts: list[tuple[str, str | None]], settings: PeerSettings,
                binary: Path | None, log=print, workers: list[PeerWorker] | None = None) -> list[Peer]:
    """The peers of the runtime suite on the registry pair `edge`, `cloud` (their kept GGUF files run in llama.cpp's
    peers), as `settings` say (its sink's folder takes the workers' logs); `binary` None leaves llama.cpp's
    speculative decoding out. The workers started for external peers are appended to `workers` (the caller closes
    them)."""
    workers = workers if workers is not None else []
    max_new_tokens, threads, cloud_runtimes = settings.max_new_tokens, settings.threads, settings.cloud_runtimes
    edge_gguf, cloud_gguf = str(gguf_path(edge)), str(gguf_path(cloud))
    # the peers in other processes first: a missing one is refused before any model of this process loads, and
    # onnxruntime-genai's conversion (a builder child process of ~17 GB) runs before this process holds models
    starters = {name: external_peers(name, edge, cloud, threads, settings.engines) for name in settings.external}
    loader = cached_loader(DType.BFLOAT16, log)
    decode = DecodeConfig(max_new_tokens=max_new_tokens)

    def engine_peer(name: str, reference: str | None, plain: bool = False, **options) -> Peer:
        engine = Engine(dtype=DType.BFLOAT16, decode=decode, loader=loader, log=lambda m: None, **options)

        def run(i: int) -> Timed:
            start = time.perf_counter()
            generation = engine.generate(*prompts[i])
            return Timed(name, i, generation.tokens, time.perf_counter() - start, text=generation.text,
                         extra={"ttft_s": generation.ttft_s, "first_tokens": first_tokens(generation)})
        return Peer(name, reference, run, plain)

    peers = [engine_peer(cloud_only(runtime), None, True, mode=Mode.CLOUD, cloud=cloud, cloud_runtime=runtime)
             for runtime in cloud_runtimes]
    llamacpp_plain = cloud_only(gguf_runtime()) if gguf_runtime() in cloud_runtimes else None
    # llama.cpp's speculation (llama-cpp-python's lookup, the example) against llama.cpp's own plain decoding
    llama_reference = LLAMA_CPP_PYTHON if "plain" in settings.llama_python else llamacpp_plain
    tokenizer_model = loader(cloud, LoadSettings(runtime=gguf_runtime()))  # the GGUF entry's HF tokenizer, as the engine's
    encoded = [tokenizer_model.encode(text, system) for text, system in prompts]
    ids = [[int(t) for t in e.input_ids.reshape(-1).tolist()] for e in encoded]
    rendered = [rendered_prompt(tokenizer_model.tokenizer, text, system) for text, system in prompts]
    eos_ids = tokenizer_model.eos_ids

    def decoded(tokens: list[int]) -> str:
        return tokenizer_model.tokenizer.decode(tokens, skip_special_tokens=True)

    ways = {"plain": (True, False), "flash-off": (False, False), "lookup": (True, True)}
    for way in settings.llama_python:
        flash_attn, lookup = ways[way]
        llm = LlamaCppPython(cloud_gguf, threads, flash_attn=flash_attn, prompt_lookup=lookup)
        name = LLAMA_PROMPT_LOOKUP if lookup else LLAMA_CPP_PYTHON + ("" if flash_attn else " (flash attn off, its default)")

        def run(i: int, llm=llm, name=name) -> Timed:
            start = time.perf_counter()
            tokens, first = llm.generate_timed(ids[i], max_new_tokens, eos_ids)
            return Timed(name, i, tokens, time.perf_counter() - start, text=decoded(tokens),
                         extra={"ttft_s": first - start if first else None})
        peers.append(Peer(name, llama_reference if lookup else llamacpp_plain, run, plain=not lookup))
    for spec_type in settings.llama_spec_types if binary is not None else ():
        def run_example(i: int, spec_type=spec_type) -> Timed:
            assert binary is not None  # the loop runs only with one
            draft = edge_gguf if spec_type == "draft-simple" else None
            report = run_speculative(binary, cloud_gguf, draft, rendered[i], threads, max_new_tokens, spec_type=spec_type)
            return Timed(llama_peer_name(spec_type), i, [], report.wall_s, text=report.text, counted=report.new_tokens,
                         extra={"prompt_tokens": report.prompt_tokens, "same_prompt_tokens":
                                report.prompt_tokens == len(ids[i]), "encode_s": report.encode_s,
                                "ttft_s": report.encode_s,  # its report parts prompt and decoding at the first token
                                "decode_s": report.decode_s, "drafted": report.drafted, "accepted": report.accepted})
        peers.append(Peer(llama_peer_name(spec_type), llama_reference, run_example))
    for edge_runtime, cloud_runtime, k, drafter in spec_peers(cloud_runtimes, settings.spec_modes, settings.draft_free_ks):
        if drafter == "hybrid":  # one peer per option string, each ending a block at an unsure draft
            for options in settings.hybrid_options:
                hybrid = SpecConfig(k=k, entropy_threshold=0, policy="greedy", drafter=drafter, drafter_options=options,
                                    draft_stop=HYBRID_STOP)
                peers.append(engine_peer(f"specbench hybrid[{options}] -> {cloud_runtime} k={k}", cloud_only(cloud_runtime),
                                         mode=Mode.SPEC, edge=edge, cloud=cloud, edge_runtime=edge_runtime,
                                         cloud_runtime=cloud_runtime, spec=hybrid))
            continue
        spec = SpecConfig(k=k, entropy_threshold=0, policy="greedy", drafter=drafter)
        if drafter in NEEDS_MODEL:
            peers.append(engine_peer(f"specbench {edge_runtime} -> {cloud_runtime} k={k}", cloud_only(cloud_runtime),
                                     mode=Mode.SPEC, edge=edge, cloud=cloud, edge_runtime=edge_runtime,
                                     cloud_runtime=cloud_runtime, spec=spec))
        else:  # draft-free: no edge model; the engine drafts from the context
            peers.append(engine_peer(f"specbench {drafter} -> {cloud_runtime} k={k}", cloud_only(cloud_runtime),
                                     mode=Mode.SPEC, edge=edge, cloud=cloud, edge_runtime=gguf_runtime(),
                                     cloud_runtime=cloud_runtime, spec=spec))
    for start in starters.values():
        peers += start(ids, max_new_tokens, eos_ids, decoded, workers, settings.sink.parent)
    return peers


def idle_cpu(workers: list[PeerWorker], seconds: float = 2.0) -> str:
    """The cores the workers' process trees use while they wait (should be ~0: an idle peer that spins takes the
    cores from whoever runs), as one line for the suite's output."""
    if not workers:
        return "none"
    import psutil

    def cpu(worker: PeerWorker) -> float:
        try:
            tree = [psutil.Process(worker.process.pid)]
            tree += tree[0].children(recursive=True)
            return sum(sum(p.cpu_times()[:2]) for p in tree)
        except psutil.Error:
            return math.nan
    before = [cpu(w) for w in workers]
    time.sleep(seconds)
    return ", ".join(f"{w.name} {(cpu(w) - b) / seconds:.2f} cores" for w, b in zip(workers, before, strict=True))


def external_peers(name: str, edge: str, cloud: str, threads: int, engines: tuple[str, ...] = ()
                   ) -> Callable[..., list[Peer]]:
    """Check that the peer `name` (EXTERNAL) can run here, now (a missing venv or extra is one ConfigError), and
    return what starts it once the prompts are encoded: (ids, max_new_tokens, eos_ids, decode, workers, logs)
    -> its Peers, the first its plain decoding and the reference of the others."""
    if name == "onnxruntime-genai":
        folder = ensure_onnx(model_dir(cloud), VARIANT, log=print)

        def start_ort(ids, max_new_tokens, eos_ids, decode, workers, logs) -> list[Peer]:
            found: list[Peer] = []
            plain = OrtGenai(folder, threads)
            for ngram in (False, True):
                engine = OrtGenai(folder, threads, ngram=True, model=plain.model) if ngram else plain
                label = ort_genai_name(ngram)

                def run(i: int, engine=engine, label=label) -> Timed:
                    start = time.perf_counter()
                    tokens, first = engine.generate(ids[i], max_new_tokens, eos_ids)
                    return Timed(label, i, tokens, time.perf_counter() - start, text=decode(tokens),
                                 extra={"ttft_s": first})
                found.append(Peer(ort_genai_name(ngram), None if not ngram else ort_genai_name(False), run,
                                  plain=not ngram))
            return found
        return start_ort
    if name not in ("vllm", "openvino-genai"):
        raise ConfigError(f"unknown external peer {name!r}: use some of {', '.join(EXTERNAL)}")
    python = envs.peer_python(name)  # not installed: one line naming `specbench peers install NAME`
    script = Path(__file__).with_name("vllm_cpu.py" if name == "vllm" else "openvino_genai_peer.py")
    asked = [e for e in WORKER_ENGINES[name] if e in engines] if any(e in WORKER_ENGINES[name] for e in engines) \
        else list(DEFAULT_ENGINES[name])
    engines = (WORKER_ENGINES[name][0], *(e for e in asked if e != WORKER_ENGINES[name][0]))  # its plain, first
    command = [str(python), str(script), "--worker", "--model", str(model_dir(cloud)), "--draft", str(model_dir(edge)),
               "--engines", ",".join(engines), "--k", "4"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": ""}
    if name == "vllm":  # both cores to its OpenMP threads (its default keeps one for the scheduler), a small KV cache
        env.update(VLLM_CPU_OMP_THREADS_BIND=f"0-{threads - 1}", VLLM_CPU_KVCACHE_SPACE="1")
    else:
        command += ["--threads", str(threads)]

    def start_worker(ids, max_new_tokens, eos_ids, decode, workers, logs) -> list[Peer]:
        worker = PeerWorker(name, command, logs / f"peer-{name}.log", env=env)
        workers.append(worker)
        print(f"\npeer {name} idle, before it is paused: {idle_cpu([worker])}")
        worker.pause()
        found = []
        for engine in worker.engines:
            def run(i: int, engine=engine) -> Timed:
                reply = worker.generate(engine, ids[i], max_new_tokens)
                worker.pause()  # stopped until its next turn: its threads' spin-wait or polling takes no core
                tokens = reply["tokens"]
                return Timed(engine, i, tokens, reply["seconds"], text=decode(tokens),
                             extra={"ttft_s": reply.get("ttft_s"), "version": worker.versions})
            found.append(Peer(engine, None if engine == engines[0] else engines[0], run, plain=engine == engines[0]))
        return found
    return start_worker


def rendered_prompt(tokenizer, text: str, system: str | None) -> str:
    """The chat-templated text specbench tokenizes (specdec.models.loading.encode_text), for a peer that takes text."""
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


@torch.inference_mode()
def warm_up_prompt(by_set: list[tuple[str, list]], per_set: int) -> tuple[Any, str]:
    """The prompt every peer is warmed on, untimed, and where it came from: the first record past the timed ones of
    the first set that has one. Warming on a timed prompt flattered its timing: an engine that keeps a prompt's
    prefix (OpenVINO GenAI) answered that question's first token in 0.2 s against ~5 s for its prefill, while the
    others prefilled it again. Where every record of every set is timed the first timed prompt is used, and said."""
    for name, records in by_set:
        if len(records) > per_set:
            return records[per_set], f"{set_label(name)} record {per_set + 1} (not timed)"
    return by_set[0][1][0], ("the first timed prompt (every set's records are timed: its first token flatters a peer "
                             "that keeps prefixes)")


def run_interleaved(peers: list[Peer], n_prompts: int, sink: Path, threads: int, warm_up: int = 0) -> list[Timed]:
    """Warm every peer on prompt `warm_up` (untimed; an index past the timed ones, `warm_up_prompt`'s), then prompts
    0..n_prompts-1 through every peer, the order rotated."""
    torch.set_num_threads(threads)  # the torch backends' threads; llama.cpp's backend follows them
    for peer in peers:
        peer.run(warm_up)
    timed = []
    sink.parent.mkdir(parents=True, exist_ok=True)
    bar = tqdm(total=n_prompts * len(peers), desc="peers", unit="generation", file=sys.stderr)
    with sink.open("w") as out, bar:
        for i in range(n_prompts):
            for peer in peers[i % len(peers):] + peers[: i % len(peers)]:
                bar.set_postfix_str(f"prompt {i + 1}/{n_prompts}, {peer.name[:40]}")
                result = peer.run(i)
                bar.update()
                timed.append(result)
                out.write(json.dumps({"config": result.config, "prompt": i, "threads": threads, "wall_s": result.wall_s,
                                      "new_tokens": result.new_tokens, "tokens": result.tokens, "text": result.text,
                                      **result.extra}, ensure_ascii=False) + "\n")
                out.flush()
    return timed


def same_as_reference(timed: list[Timed], config: str, reference: str, max_new_tokens: int) -> tuple[int, int]:
    """(prompts whose output equals the reference greedy's, prompts). Token ids where both have them;
    text otherwise: the example may decode past the budget, so its text must start with the
    reference's (and equal it where the reference stopped early)."""
    ref = {t.prompt: t for t in timed if t.config == reference}
    mine = [t for t in timed if t.config == config and t.prompt in ref]
    same = 0
    for t in mine:
        r = ref[t.prompt]
        if t.tokens or not t.text:
            same += t.tokens == r.tokens
        else:
            same += t.text.startswith(r.text) and (len(r.tokens) == max_new_tokens or t.text == r.text)
    return same, len(mine)


def first_tokens(generation) -> int:
    """Tokens out at the first-token time: a speculative generation's first cycle emits its kept draft and the cloud's
    token at once (bench/derive/spec_bench.py's after_first_token reads a record so); plain decoding one."""
    if not generation.cycles:
        return min(1, len(generation.tokens))
    first = generation.cycles[0]
    return first.accepted + (first.extra_token is not None)


def speedups(timed: list[Timed], config: str, reference: str, after_first: bool = False) -> tuple[float, float, float]:
    """Pooled tok/s of `config` over `reference`'s on the prompts both ran, and its 95 % paired bootstrap interval
    (bench.derive.metrics.speedup_ci). `after_first`: the tokens after the first over the time after it, the tokens
    out at the first-token time not counted (`first_tokens`: a speculative first cycle's several; one where a peer does
    not say; a peer that reports no first-token time is left out: NaN)."""
    mine = {t.prompt: t for t in timed if t.config == config}
    base = {t.prompt: t for t in timed if t.config == reference}
    rows = [(mine[p], base[p]) for p in sorted(mine) if p in base]

    def parts(t: Timed) -> tuple[float, float]:
        if not after_first:
            return float(t.new_tokens), t.wall_s
        first, at_first = t.extra.get("ttft_s"), int(t.extra.get("first_tokens") or 1)
        if first is None or t.new_tokens <= at_first or t.wall_s <= first:
            return math.nan, math.nan
        return float(t.new_tokens - at_first), t.wall_s - first

    kept = [(*parts(m), *parts(b)) for m, b in rows]
    kept = [row for row in kept if all(math.isfinite(v) for v in row)]
    if not kept:
        return math.nan, math.nan, math.nan
    tokens, seconds, base_tokens, base_seconds = (list(column) for column in zip(*kept, strict=True))
    point = speedup(sum(tokens) / sum(seconds), sum(base_tokens) / sum(base_seconds))
    low, high = speedup_ci(tokens, seconds, base_tokens, base_seconds)
    return point, low, high


def fastest_plain(timed: list[Timed], peers: list[Peer]) -> str:
    """The plain decoding (of every runtime and peer run) with the most tokens per second, pooled over prompts."""
    return max((p.name for p in peers if p.plain), key=lambda n: pooled_tokens_per_s(timed, n))


def first_token(timed: list[Timed], config: str) -> tuple[float, float, float]:
    """The median seconds to `config`'s first token over its prompts and its 95 % bootstrap interval (NaN where
    the peer reports none)."""
    seconds = [float(t.extra["ttft_s"]) for t in timed if t.config == config and t.extra.get("ttft_s") is not None]
    if not seconds:
        return math.nan, math.nan, math.nan
    low, high = median_ci(seconds)
    return statistics.median(seconds), low, high


def first_token_ratio(timed: list[Timed], config: str, reference: str) -> tuple[float, float, float]:
    """`config`'s first token over `reference`'s, per prompt both ran and reported: the median ratio and its 95 %
    bootstrap interval (below 1: sooner)."""
    mine = {t.prompt: t.extra.get("ttft_s") for t in timed if t.config == config}
    base = {t.prompt: t.extra.get("ttft_s") for t in timed if t.config == reference}
    ratios = [seconds / base_s for p, seconds in sorted(mine.items()) if seconds and (base_s := base.get(p))]
    if not ratios:
        return math.nan, math.nan, math.nan
    low, high = median_ci(ratios)
    return statistics.median(ratios), low, high


def _seconds(point: float, low: float, high: float) -> str:
    if math.isnan(point):
        return "-"
    return f"{point:.2f} s" + ("" if math.isnan(low) else f" [{low:.2f}-{high:.2f}]")


def _cell(point: float, low: float, high: float) -> str:
    if math.isnan(point):
        return "-"
    return f"{point:.2f}x" + ("" if math.isnan(low) else f" [{low:.2f}-{high:.2f}]")


def set_label(name: str) -> str:
    """A prompt set's column title: a Spec-Bench set's categories ("spec-bench:q.jsonl:summarization,rag" ->
    "summarization,rag"), any other set its own name."""
    if name.startswith("spec-bench:") and name.count(":") >= 2:
        return name.rsplit(":", 1)[1]
    return name


def per_set_table(timed: list[Timed], peers: list[Peer], groups: list[tuple[str, list[int]]]) -> str:
    """Each peer's speed-up over each prompt set's own fastest plain decoding (a Spec-Bench category, say), end to end
    / after the first token, pooled over the set's prompts with 95 % paired bootstrap intervals: where a drafter
    pays and where it loses, which one pooled table hides. `groups`: (set label, its prompts' indices)."""
    lines = [" | ".join(["config", *(label for label, _ in groups)])]
    subsets = [[t for t in timed if t.prompt in members] for members in (set(prompts) for _, prompts in groups)]
    fastest = [fastest_plain(sub, peers) for sub in subsets]
    lines.append(" | ".join(["(fastest plain)", *fastest]))
    for peer in peers:
        cells = [f"{_cell(*speedups(sub, peer.name, best))} / {_cell(*speedups(sub, peer.name, best, after_first=True))}"
                 for sub, best in zip(subsets, fastest, strict=True)]
        lines.append(" | ".join([peer.name, *cells]))
    return "\n".join(lines)


def table(timed: list[Timed], peers: list[Peer], max_new_tokens: int) -> str:
    """Pooled tok/s; speed-ups over the fastest plain decoding, end to end and after the first token, and over the
    peer's own plain decoding, each with its 95 % paired bootstrap interval; whether the output equals that plain
    decoding's (is its speculation lossless?)."""
    fastest = fastest_plain(timed, peers)
    lines = [" | ".join(["config", "tok/s", f"x fastest plain ({fastest}) [95%]", "after the first token [95%]",
                         "first token, median [95%]", "first token / the fastest plain's, per prompt [95%]",
                         "x its own plain [95%]", "same tokens as its own plain"])]
    for peer in peers:
        cells = [peer.name, f"{pooled_tokens_per_s(timed, peer.name):.2f}",
                 _cell(*speedups(timed, peer.name, fastest)), _cell(*speedups(timed, peer.name, fastest, after_first=True)),
                 _seconds(*first_token(timed, peer.name)), _cell(*first_token_ratio(timed, peer.name, fastest))]
        if peer.reference:
            same, n = same_as_reference(timed, peer.name, peer.reference, max_new_tokens)
            cells += [_cell(*speedups(timed, peer.name, peer.reference)), f"{same}/{n} ({peer.reference})"]
        else:
            cells += ["1", "(its own plain)" if peer.plain else "(reference)"]
        lines.append(" | ".join(cells))
    return "\n".join(lines)
