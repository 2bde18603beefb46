"""The backend protocol: the only thing the decoding loop knows about a model.

A backend turns token blocks into logits on a KV state it owns:

    state, logits = backend.prefill(prompt, token_ids, keep)   # one forward, multimodal inputs here
    logits = backend.forward(state, token_ids, keep)           # [keep, V] of [n, V]: row i predicts the token after token_ids[i]
    backend.crop(state, length)                                # drop cached positions >= length

Positions are always explicit: a block fed on a state of length L occupies positions L .. L+n-1.
"""
from __future__ import annotations

import importlib.util
import inspect
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

from specdec.errors import ConfigError, InputError, ModelError
from specdec.kernels import check_cpu, missing_flags
from specdec.machine import _cpuinfo

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}  # what a backend runs in, by name

# What runs a model's forwards: torch in DTYPES (hf_causal.py and friends), torch with dynamic int8
# Linear layers (specdec.models.derive, float32 activations), the same with activations quantized per
# token (`NAME@int8t`), or llama.cpp on a GGUF file (llamacpp.py).
# onnx-int4 / onnx-int8: the model's folder converted by onnxruntime-genai's builder (int4 or int8 weights, int8
# activations) and run in ONNX Runtime (onnxrt.py), a one-token step padded to two rows so steps are blocks' rows.
# openvino-int8: the model converted to an OpenVINO IR (int8 weights by nncf, activations quantized per row at
# run time, attention one query row at a time so blocks are steps' rows bit for bit), on OpenVINO's CPU plugin.
# kernels-int8 / kernels-int4 (once vnni-int8 / vnni-int4, still accepted): the model's folder packed at load for
# specbench's own kernels (packed.py, specdec/kernels/: AVX-512 VNNI, AVX-VNNI, AVX2 or NEON, one reference): int8
# or int4 weights, int8 activations per row, exact int32 products, each attention row computed alone, so a block
# costs about one step and its rows are steps' logits bit for bit, the same bits on every processor.
RUNTIMES = ("torch", "torch-int8", "torch-int8t", "llamacpp", "onnx-int4", "onnx-int8", "openvino-int8", "kernels-int8",
            "kernels-int4")
# Runtimes whose k+1-row block computes, row for row, the logits of k+1 one-token steps (bit for bit:
# tests/test_int8_batch.py), so greedy speculation verified there reproduces that runtime's own plain
# decoding token for token. torch-int8 is not one: one activation scale over all rows of a block. calibrate
# measures it too.
BATCH_INVARIANT_RUNTIMES = ("torch-int8t", "onnx-int4", "onnx-int8", "openvino-int8", "kernels-int8", "kernels-int4")
# A runtime exact by design on one instruction set only: OpenVINO's CPU plugin keeps a block's rows equal to its steps
# on its AVX-512 kernels, not on AVX2 (the calibration measured block_vs_steps 3.5e-5 on an AVX2-only AMD EPYC,
# 2026-11-29). Where a calibration measured it, its figure decides (bench/derive/runtime_choice.py).
EXACT_ONLY_WITH = {"openvino-int8": "avx512f"}


def batch_invariant(runtime: str, flags: frozenset[str] | None = None) -> bool:
    """`runtime`'s blocks are its steps bit for bit by design on this CPU (or one reporting `flags`)."""
    needed = EXACT_ONLY_WITH.get(runtime)
    flags = _cpuinfo()[1] if flags is None else flags
    return runtime in BATCH_INVARIANT_RUNTIMES and (needed is None or needed in flags)
# The cloud held in two runtimes, PLAIN+BLOCKS: plain steps in the first, draft blocks in the second
# (specdec/core/cloud.py TwoRuntimeCloud; spec mode in process only).
RUNTIME_PAIRS = tuple(f"{plain}+{blocks}" for plain in RUNTIMES for blocks in RUNTIMES if plain != blocks)
LLAMACPP_EXTRA = "pip install 'specbench[llamacpp]'"  # pins llama-cpp-python (built from source: ~5 min)


@dataclass(frozen=True)
class RuntimePackage:
    """A runtime that runs in a package of its own, an extra of this project: checked without importing it."""

    module: str  # what `import` finds
    distribution: str  # what pip installs
    extra: str  # the command that installs it


# Every runtime not listed runs in torch and transformers, which are always installed.
ONNX_EXTRA = "pip install 'specbench[onnx]'"  # pins onnxruntime-genai (its builder converts) and onnxruntime
OPENVINO_EXTRA = "pip install 'specbench[openvino]'"  # pins openvino and nncf (which compresses the weights)
RUNTIME_PACKAGES = {"llamacpp": RuntimePackage("llama_cpp", "llama-cpp-python", LLAMACPP_EXTRA),
                    "openvino-int8": RuntimePackage("openvino", "openvino", OPENVINO_EXTRA),
                    "onnx-int4": RuntimePackage("onnxruntime_genai", "onnxruntime-genai", ONNX_EXTRA),
                    "onnx-int8": RuntimePackage("onnxruntime_genai", "onnxruntime-genai", ONNX_EXTRA)}


RUNTIME_ALIASES = {"vnni-int8": "kernels-int8", "vnni-int4": "kernels-int4"}  # old names, still accepted


def canonical_runtime(runtime: str) -> str:
    """A runtime (or PLAIN+BLOCKS pair) with every old name replaced by today's: `vnni-int4` -> `kernels-int4`."""
    return "+".join(RUNTIME_ALIASES.get(part, part) for part in runtime.split("+"))


def runtime_parts(runtime: str) -> tuple[str, ...]:
    """`llamacpp+torch-int8` -> ("llamacpp", "torch-int8"): (plain steps', blocks') runtimes; one runtime -> (it,)."""
    return tuple(runtime.split("+"))


KERNEL_RUNTIMES = ("kernels-int8", "kernels-int4")  # need one of the kernels' vector paths (specdec/kernels), no package


def runtime_installed(runtime: str) -> bool:
    """Every part of `runtime` can run in this install (its extra's package is there, or for the kernels runtimes an
    instruction set one of their paths needs), checked without importing it (llama_cpp loads its shared library on import)."""
    return all((part not in RUNTIME_PACKAGES or importlib.util.find_spec(RUNTIME_PACKAGES[part].module) is not None)
               and (part not in KERNEL_RUNTIMES or not missing_flags()) for part in runtime_parts(runtime))


def check_runtime(runtime: str, flag: str = "runtime") -> None:
    """The runtime's package is installed (or its CPU can run it), or one line naming the fix."""
    for part in runtime_parts(runtime):
        if part in KERNEL_RUNTIMES:
            check_cpu()
        package = RUNTIME_PACKAGES.get(part)
        if package is not None and not runtime_installed(part):
            raise ConfigError(f"{flag} {part} needs {package.distribution}, which is not installed: {package.extra}")


def served_runtime(model: str, runtime: str | None, flag: str = "--runtime") -> str:
    """The runtime a server of `model` runs: `runtime`, or by default llamacpp for a `.gguf` file and
    torch otherwise; a GGUF file in another runtime, or a runtime whose package is missing, is refused."""
    runtime = runtime or ("llamacpp" if model.endswith(".gguf") else "torch")
    if runtime != "llamacpp" and model.endswith(".gguf"):
        raise ConfigError(f"model {model!r} is a GGUF file, which llama.cpp runs: use {flag} llamacpp")
    check_runtime(runtime, flag)
    return runtime


def refuse_features(prompt: Prompt, model: str, runtime: str) -> None:
    """A text-only runtime given a prompt with audio features: one line naming the fix."""
    if prompt.features:
        raise InputError(f"model {model!r} runs in {runtime}, text only, but the prompt has "
                         f"{sorted(prompt.features)}: use a torch runtime with an audio model, or drop the audio")


def cache_kwarg(forward) -> str:
    """The name under which `forward` takes its KV cache: `past_key_values` up to transformers 5.23,
    `cache` from 5.24 (which still takes the old name until 5.40 but warns on every call)."""
    return "cache" if "cache" in inspect.signature(forward).parameters else "past_key_values"


@dataclass
class Prompt:
    """One tokenized prompt with its non-text inputs.

    `input_ids` already contains any modality placeholder tokens (e.g. the Omni thinker's
    `<|AUDIO|>` run); `features` holds the tensors those placeholders stand for
    (e.g. `input_features`, `feature_attention_mask`), passed to the model at prefill.
    """

    input_ids: torch.Tensor  # [P] int64
    features: dict[str, torch.Tensor] = field(default_factory=dict)
    text: str = ""

    def __post_init__(self) -> None:
        if self.input_ids.ndim != 1:
            raise ValueError(f"Prompt.input_ids must be 1-D [P], got shape {tuple(self.input_ids.shape)}")
        if self.input_ids.numel() == 0:
            raise InputError("the prompt is empty after tokenization: give it some text")

    @property
    def has_audio(self) -> bool:
        return "input_features" in self.features


@runtime_checkable
class State(Protocol):
    """A backend's KV state. `length` = number of token positions held in the cache."""

    length: int


class Backend:
    """The backend interface, declared: every runtime subclasses it and states what it can do.

    Three methods make a backend (the module docstring): `prefill`, `forward` and `crop`. A runtime writes
    `prefill`, `_run` (one block on a state: `forward` supplies its keep-default) and, where dropping positions
    needs more than a shorter length, `_drop_past` (`crop` checks the length once, here). What callers read
    beyond them is declared below with its default, so no caller probes a backend with getattr or hasattr, and a
    new runtime is one file that overrides what differs:

        device          where inputs go and logits live; None: the CPU (a CUDA forward is timed after its queue)
        batchable       forward_batch runs rows of several states in one forward (the server batches them)
        max_positions   the longest state it holds; None: the model's config says (LoadedModel.max_positions)
        eos_ids         end-of-sequence ids of its own (a GGUF's, a converted folder's), beside the tokenizer's
        processors      logits processors its decoding rule needs (Whisper's suppression)
        streamed_bytes  bytes a one-token step reads, where the runtime knows; None: count the torch model's
        memory_bytes    bytes it holds, where it has no torch model (llama.cpp, the kernels)
        extra_buffers   llama.cpp's repacked weight buffers in use; None for every other runtime
        model           the torch model, where there is one
        accepts_trees   forward_tree verifies a token tree in one block, each node's row its path's step bit for
                        bit, and commit_path keeps the accepted path (specdec/core/tree.py); others verify chains
    """

    name: str = ""
    vocab_size: int = 0  # rows of the output head; may differ between edge and cloud
    accepts_audio: bool = False
    device: torch.device | None = None
    batchable: bool = False
    max_positions: int | None = None
    eos_ids: frozenset[int] = frozenset()
    processors: tuple = ()
    streamed_bytes: int | None = None
    memory_bytes: int | None = None
    extra_buffers: bool | None = None
    model: Any = None
    accepts_trees: bool = False

    def prefill(
        self, prompt: Prompt, token_ids: torch.Tensor, keep: int = 0, use_cache: bool = True
    ) -> tuple[Any, torch.Tensor | None]:
        """One forward over `token_ids` ([n], starting with the prompt's ids) with the prompt's
        multimodal features. Returns (state of length n, logits of the last `keep` positions
        [keep, V], or None when keep == 0). `use_cache=False` builds no reusable state."""
        raise NotImplementedError

    def forward(self, state: Any, token_ids: torch.Tensor, keep: int | None = None) -> torch.Tensor | None:
        """Feed `token_ids` [n] at positions state.length .. +n-1; returns the logits of the last
        `keep` positions [keep, V] (float32; all n when keep is None; None when keep == 0, as prefill's).
        The output head runs on those positions only."""
        return self._run(state, token_ids, kept_rows(token_ids, keep))

    def forward_batch(self, states: list, blocks: list[torch.Tensor], keeps: list[int]) -> list[torch.Tensor | None]:
        """Blocks of several states in one forward (only where `batchable`), each row's logits as `forward`'s."""
        raise NotImplementedError(f"{type(self).__name__} runs one state per forward (batchable is False)")

    def forward_tree(self, state: Any, token_ids: torch.Tensor, tree: Any) -> torch.Tensor:
        """Feed `token_ids` [r >= 1] as `forward` does (they stay cached), then the nodes of `tree` (a
        specdec.core.tree.TokenTree), each at position state.length + r - 1 + its depth, seeing the cache and its own
        ancestors only; returns [1 + n, V] logits: the last of token_ids' rows, then each node's. The nodes stay out
        of the state until commit_path. Only where `accepts_trees`."""
        raise NotImplementedError(f"{type(self).__name__} verifies chains only (accepts_trees is False)")

    def commit_path(self, state: Any, tree: Any, path: list[int]) -> None:
        """After forward_tree: the nodes of `path` (root to leaf) join the state as if fed as a block."""
        raise NotImplementedError(f"{type(self).__name__} verifies chains only (accepts_trees is False)")

    def crop(self, state: Any, length: int) -> None:
        """Drop cached positions >= length (exact rollback)."""
        if not 0 <= length <= state.length:
            raise ValueError(f"cannot crop a state of length {state.length} to {length}")
        self._drop_past(state, length)
        state.length = length

    def _run(self, state: Any, token_ids: torch.Tensor, keep: int) -> torch.Tensor | None:
        raise NotImplementedError

    def _drop_past(self, state: Any, length: int) -> None:
        """What a crop must do besides shortening the state (nothing where positions past the length are masked
        or rewritten before a query reads them)."""


def kept_rows(token_ids: torch.Tensor, keep: int | None) -> int:
    """`forward`'s keep-default: the logits of every row of the block when keep is None."""
    return token_ids.numel() if keep is None else keep


def grown_capacity(held: int, needed: int, first: int, limit: int | None = None) -> int:
    """The positions a growable KV buffer takes to hold `needed`: `first` at first, then at least twice what it
    held (one copy of the held rows per doubling), never past `limit` but never below `needed`."""
    capacity = max(needed, first, 2 * held)
    return max(needed, min(capacity, limit)) if limit is not None else capacity


def grown(old, capacity: int, axis: int, length: int):
    """A host or device buffer like `old` (numpy or torch) with `capacity` positions on `axis`, holding its first
    `length` positions (the rest uninitialised: every position is written before a query reads it)."""
    shape = list(old.shape)
    shape[axis] = capacity
    new = np.empty(shape, old.dtype) if isinstance(old, np.ndarray) else torch.empty(shape, dtype=old.dtype,
                                                                                      device=old.device)
    if length:
        index = (slice(None),) * axis + (slice(0, length),)
        new[index] = old[index]
    return new


def from_pretrained_checked(model_class, path, model_types: tuple[str, ...], what: str, dtype=None):
    """`model_class.from_pretrained(path)` after checking the config's model type: from_pretrained
    only warns on another type, then leaves the weights random."""
    from transformers import AutoConfig

    try:
        model_type = AutoConfig.from_pretrained(path).model_type
        if model_type not in model_types:
            raise ModelError(f"{path!r} is a {model_type!r} model, not {what}")
        return model_class.from_pretrained(path, **({"dtype": dtype} if dtype is not None else {}))
    except (OSError, ValueError) as e:
        raise ModelError(f"cannot load a {what} model from {path!r}: {e}") from e
