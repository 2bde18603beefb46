"""The peers of the runtimes on one GGUF pair: plain decoding as llama-cpp-python ships it, its prompt
lookup (`LlamaPromptLookupDecoding`, the draft-free speculation it ships), specbench's plain decoding
through each cloud runtime asked, llama.cpp's own speculative decoding (the example binary,
llama_speculative.py) and specbench's lossless speculative configurations across runtimes (the model
drafter and prompt lookup), interleaved prompt by prompt in a rotating order so machine drift hits every
peer alike.

Every peer gets the same chat-templated prompt (the ids specbench encodes; the example gets their text
and its token count is checked against them), greedy, the same threads, and is timed from the prompt's
first forward to its last token, model load excluded. Raw per-prompt timings go to a JSONL file as
they are taken (a rerun starts afresh: it does not resume); ratios are paired per prompt afterwards.
"""
from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from bench.measure.peers.hf_assisted import Timed, paired, pooled_tokens_per_s
from bench.measure.peers.llama_speculative import SPEC_TYPES, run_speculative
from specdec.backends.base import RUNTIMES
from specdec.core.config import DecodeConfig, SpecConfig
from specdec.engine import Engine
from specdec.errors import ConfigError
from specdec.models.loading import LoadedModel, load_model

LLAMA_CPP_PYTHON = "llama-cpp-python plain"
LLAMA_PROMPT_LOOKUP = "llama-cpp-python prompt lookup (n-gram 2, 10 tokens)"  # LlamaPromptLookupDecoding's defaults
LLAMA_SPECULATIVE = "llama.cpp speculative (n-max 3)"  # draft-simple: the 0.5B drafting


def llama_peer_name(spec_type: str) -> str:
    """The peer name of llama.cpp's example under one speculation type (llama_speculative.SPEC_TYPES)."""
    return LLAMA_SPECULATIVE if spec_type == "draft-simple" else f"llama.cpp {spec_type} (no draft model)"
CLOUD_RUNTIMES = ("llamacpp", "torch-int8")  # SPECBENCH_PEER_RUNTIMES: specbench's plain decoding in each


def cloud_only(runtime: str) -> str:
    return f"specbench {runtime} cloud-only"


def spec_peers(cloud_runtimes: tuple[str, ...]) -> list[tuple[str | None, str, int, str]]:
    """(edge runtime, cloud runtime, k, drafter) of specbench's speculative peers: greedy, every block
    verified. The model drafter (the 0.5B) on the pairings measured since the runtimes began, and prompt
    lookup verified in every cloud runtime asked."""
    model = [("llamacpp", "torch-int8", 3), ("llamacpp", "torch-int8", 4), ("llamacpp", "llamacpp", 4),
             ("torch-int8", "torch-int8", 4)]
    found = [(edge, cloud, k, "model") for edge, cloud, k in model if cloud in cloud_runtimes]
    found += [("llamacpp", cloud, 4, "model") for cloud in cloud_runtimes if cloud not in ("llamacpp", "torch-int8")]
    return found + [(None, cloud, 4, "prompt-lookup") for cloud in cloud_runtimes]


@dataclass(frozen=True)
class PeerSettings:
    """What the suite (bench/test_bench_peer_runtimes.py) reads from its environment; a bad value is one
    ConfigError naming the variable and an example, before any model loads."""

    prompts_per_set: int = 3  # SPECBENCH_PEER_PROMPTS
    max_new_tokens: int = 48  # SPECBENCH_PEER_TOKENS
    threads: int = 2  # SPECBENCH_PEER_THREADS
    sink: Path = Path("runs/peer_runtimes.jsonl")  # SPECBENCH_PEER_JSONL: raw timings, overwritten
    sets: tuple[str, ...] = ("code", "zh-describe", "en-chat")  # SPECBENCH_PEER_SETS, comma-separated prompt sets
    cloud_runtimes: tuple[str, ...] = CLOUD_RUNTIMES  # SPECBENCH_PEER_RUNTIMES, comma-separated
    llama_spec_types: tuple[str, ...] = ("draft-simple",)  # SPECBENCH_PEER_LLAMA_SPEC: the example's types, comma-separated

    ENV = {"prompts_per_set": "SPECBENCH_PEER_PROMPTS", "max_new_tokens": "SPECBENCH_PEER_TOKENS",
           "threads": "SPECBENCH_PEER_THREADS", "sink": "SPECBENCH_PEER_JSONL", "sets": "SPECBENCH_PEER_SETS",
           "cloud_runtimes": "SPECBENCH_PEER_RUNTIMES", "llama_spec_types": "SPECBENCH_PEER_LLAMA_SPEC"}

    def __post_init__(self) -> None:
        if unknown := [r for r in self.cloud_runtimes if r not in RUNTIMES or "+" in r]:
            raise ConfigError(f"SPECBENCH_PEER_RUNTIMES names {unknown[0]!r}: use some of {', '.join(RUNTIMES)}, "
                              "e.g. SPECBENCH_PEER_RUNTIMES=llamacpp,torch-int8")
        if unknown := [t for t in self.llama_spec_types if t not in SPEC_TYPES]:
            raise ConfigError(f"SPECBENCH_PEER_LLAMA_SPEC names {unknown[0]!r}: use some of {', '.join(SPEC_TYPES)}, "
                              "e.g. SPECBENCH_PEER_LLAMA_SPEC=draft-simple,ngram-simple,ngram-mod")
        if not self.sets or not self.cloud_runtimes:
            raise ConfigError("SPECBENCH_PEER_SETS and SPECBENCH_PEER_RUNTIMES need at least one name each, e.g. "
                              "SPECBENCH_PEER_SETS=spec-bench:question.jsonl:summarization")
        for name in ("prompts_per_set", "max_new_tokens", "threads"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{self.ENV[name]}={value!r}: need a whole number >= 1, e.g. "
                                  f"{self.ENV[name]}={getattr(PeerSettings, name)}")
        if self.sink.is_dir():
            raise ConfigError(f"SPECBENCH_PEER_JSONL={str(self.sink)!r} is a folder: give a file path, e.g. "
                              "runs/peer_runtimes.jsonl")

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> PeerSettings:
        values = {}
        for name, variable in cls.ENV.items():
            text = environ.get(variable, "").strip()
            if not text:
                continue
            if name == "sink":
                values[name] = Path(text).expanduser()
                continue
            if name in ("sets", "cloud_runtimes", "llama_spec_types"):
                # a Spec-Bench set names its categories after a colon and commas: split on commas outside those
                parts = _split_sets(text) if name == "sets" else (p.strip() for p in text.split(",") if p.strip())
                values[name] = tuple(parts)
                continue
            try:
                values[name] = int(text)
            except ValueError:
                values[name] = text  # refused, with its variable's name, by __post_init__
        return cls(**values)


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
        self.llm.reset()  # no prefix reuse from the previous prompt: the whole prompt is evaluated, as in every peer
        tokens = []
        for token in self.llm.generate(ids, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0, reset=True):
            tokens.append(int(token))
            if token in eos_ids or len(tokens) == max_new_tokens:
                break
        return tokens


@dataclass(frozen=True)
class Peer:
    name: str
    reference: str | None  # the greedy decoding whose output this one should equal
    run: Callable[[int], Timed]  # prompt index -> its timed outcome


def cached_loader(dtype: str, log: Callable[[str], object]) -> Callable[..., LoadedModel]:
    """An Engine loader that loads each (name, runtime) once for every engine that asks."""
    loaded: dict[tuple[str, str], LoadedModel] = {}

    def load(name: str, _dtype: str, log=log, runtime: str = "torch") -> LoadedModel:
        if (name, runtime) not in loaded:
            loaded[(name, runtime)] = load_model(name, dtype, log=log, runtime=runtime)
        return loaded[(name, runtime)]
    return load


def build_peers(edge: str, cloud: str, edge_gguf: str, cloud_gguf: str, prompts: list[tuple[str, str | None]],
                max_new_tokens: int, threads: int, binary: Path | None, log=print,
                cloud_runtimes: tuple[str, ...] = CLOUD_RUNTIMES,
                llama_spec_types: tuple[str, ...] = ("draft-simple",)) -> list[Peer]:
    """The peers of the runtime suite; `binary` None leaves llama.cpp's speculative decoding out."""
    loader = cached_loader("bfloat16", log)
    decode = DecodeConfig(max_new_tokens=max_new_tokens)

    def engine_peer(name: str, reference: str | None, **settings) -> Peer:
        engine = Engine(dtype="bfloat16", decode=decode, loader=loader, log=lambda m: None, **settings)

        def run(i: int) -> Timed:
            start = time.perf_counter()
            generation = engine.generate(*prompts[i])
            return Timed(name, i, generation.tokens, time.perf_counter() - start, text=generation.text)
        return Peer(name, reference, run)

    peers = [engine_peer(cloud_only(runtime), None, mode="cloud", cloud=cloud, cloud_runtime=runtime)
             for runtime in cloud_runtimes]
    llamacpp_plain = cloud_only("llamacpp") if "llamacpp" in cloud_runtimes else None
    tokenizer_model = loader(cloud, "bfloat16", runtime="llamacpp")  # the GGUF entry's HF tokenizer, as the engine's
    encoded = [tokenizer_model.encode(text, system) for text, system in prompts]
    rendered = [rendered_prompt(tokenizer_model.tokenizer, text, system) for text, system in prompts]
    eos_ids = tokenizer_model.eos_ids
    for flash_attn, lookup in ((True, False), (False, False), (True, True)):
        plain = LlamaCppPython(cloud_gguf, threads, flash_attn=flash_attn, prompt_lookup=lookup)
        name = LLAMA_PROMPT_LOOKUP if lookup else LLAMA_CPP_PYTHON + ("" if flash_attn else " (flash attn off, its default)")

        def run(i: int, plain=plain, name=name) -> Timed:
            start = time.perf_counter()
            tokens = plain.generate(encoded[i].input_ids.tolist(), max_new_tokens, eos_ids)
            return Timed(name, i, tokens, time.perf_counter() - start,
                         text=tokenizer_model.tokenizer.decode(tokens, skip_special_tokens=True))
        peers.append(Peer(name, llamacpp_plain, run))
    for spec_type in llama_spec_types if binary is not None else ():
        def run_example(i: int, spec_type=spec_type) -> Timed:
            draft = edge_gguf if spec_type == "draft-simple" else None
            report = run_speculative(binary, cloud_gguf, draft, rendered[i], threads, max_new_tokens, spec_type=spec_type)
            return Timed(llama_peer_name(spec_type), i, [], report.wall_s, text=report.text, counted=report.new_tokens,
                         extra={"prompt_tokens": report.prompt_tokens, "same_prompt_tokens":
                                report.prompt_tokens == encoded[i].input_ids.numel(), "encode_s": report.encode_s,
                                "decode_s": report.decode_s, "drafted": report.drafted, "accepted": report.accepted})
        peers.append(Peer(llama_peer_name(spec_type), llamacpp_plain, run_example))
    for edge_runtime, cloud_runtime, k, drafter in spec_peers(cloud_runtimes):
        spec = SpecConfig(k=k, entropy_threshold=0, policy="greedy", drafter=drafter)
        if drafter == "model":
            peers.append(engine_peer(f"specbench {edge_runtime} -> {cloud_runtime} k={k}", cloud_only(cloud_runtime),
                                     mode="spec", edge=edge, cloud=cloud, edge_runtime=edge_runtime,
                                     cloud_runtime=cloud_runtime, spec=spec))
        else:  # draft-free: no edge model; the engine drafts from the context
            peers.append(engine_peer(f"specbench {drafter} -> {cloud_runtime} k={k}", cloud_only(cloud_runtime),
                                     mode="spec", edge=edge, cloud=cloud, edge_runtime="llamacpp",
                                     cloud_runtime=cloud_runtime, spec=spec))
    return peers


def rendered_prompt(tokenizer, text: str, system: str | None) -> str:
    """The chat-templated text specbench tokenizes (specdec.models.loading.encode_text), for a peer that takes text."""
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


@torch.inference_mode()
def run_interleaved(peers: list[Peer], n_prompts: int, sink: Path, threads: int) -> list[Timed]:
    """Warm every peer on prompt 0 (untimed), then each prompt through every peer, the order rotated."""
    torch.set_num_threads(threads)  # the torch backends' threads; llama.cpp's backend follows them
    for peer in peers:
        peer.run(0)
    timed = []
    sink.parent.mkdir(parents=True, exist_ok=True)
    with sink.open("w") as out:
        for i in range(n_prompts):
            for peer in peers[i % len(peers):] + peers[: i % len(peers)]:
                result = peer.run(i)
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


def table(timed: list[Timed], peers: list[Peer], max_new_tokens: int) -> str:
    """Pooled tok/s; paired per-prompt ratios against the fastest plain decoding, llama-cpp-python's and
    llama.cpp's speculative decoding; whether the output equals the same cloud's greedy."""
    names = [p.name for p in peers]
    plain = [n for n in names if n.endswith(" cloud-only") or n.startswith(LLAMA_CPP_PYTHON)]
    fastest = max(plain, key=lambda n: pooled_tokens_per_s(timed, n))
    references = [(f"vs fastest plain ({fastest})", fastest), ("vs llama-cpp-python", LLAMA_CPP_PYTHON)]
    if LLAMA_SPECULATIVE in names:
        references.append(("vs llama.cpp speculative", LLAMA_SPECULATIVE))
    lines = [" | ".join(["config", "tok/s", *(label for label, _ in references), "same as greedy"])]
    for peer in peers:
        cells = [peer.name, f"{pooled_tokens_per_s(timed, peer.name):.2f}"]
        for _, reference in references:
            r = paired(timed, peer.name, reference)
            cells.append(f"{r['median']:.2f}x [{r['min']:.2f}-{r['max']:.2f}]")
        if peer.reference:
            same, n = same_as_reference(timed, peer.name, peer.reference, max_new_tokens)
            cells.append(f"{same}/{n} ({peer.reference})")
        else:
            cells.append("(reference)")
        lines.append(" | ".join(cells))
    return "\n".join(lines)
