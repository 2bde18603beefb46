"""Backend that runs a causal LM's OpenVINO IR (specdec/models/convert_openvino.py) on OpenVINO's CPU plugin.

The IR is stateless: the KV cache is inputs and outputs, held here as arrays.

    state            per layer a key and a value buffer [capacity, H_kv, D] float32 (position-major:
                     the first `length` rows are one contiguous array, fed without a copy) + `length`
    prefill/forward  ONE inference of the block at explicit positions length .. length+n-1; the output
                     head runs on the last `keep` rows only (the graph's logit_rows input); the block's
                     new keys/values are written into the buffers at rows length .. length+n-1
    crop             `length` set back: rows past it are never fed again and are overwritten (exact)

Numerics: with the default IR (int8 weights, rowwise attention) and the default settings a block's rows
equal its one-token steps bit for bit (the "rowwise" attention in convert_openvino.py; per-row int8
activations in the linears), and every call is deterministic and the same on 1 or 2 threads. Against
torch float32 on the same weights it drifts by the int8 weight rounding: max |logit diff| / max |logit|
0.027 (0.5B) and 0.093 (1.5B) over 133 positions, greedy argmax the same on 95-96% of them.

Compile settings (`DEFAULT_CONFIG`, overridable with `config`):
    INFERENCE_PRECISION_HINT f32   the plugin's default on a CPU with AVX512_BF16 or AMX is bf16 (also exact
                                   block for steps here, but further from torch: 94.7% vs 96.2% argmax
                                   agreement on the 1.5B, and slower here: 142 vs 126 ms a step, 266 vs 192
                                   ms a 9-row block, 1.5B, 2 threads, AVX512_BF16 without AMX, under load)
    DYNAMIC_QUANTIZATION_GROUP_SIZE the plugin's default, 32: activations of the compressed linears quantized
                                   to int8 per group of 32 input channels of each row (VNNI/AMX int8 dot
                                   products). 0 turns it off (weights decompressed to f32): the f32 GEMM then
                                   rounds a row differently by block length (2e-5 on the 1.5B: blocks no longer
                                   equal steps) and is slower (186 ms a step, 483 ms a 9-row block); 128 drifts
                                   more from torch (max relative 0.23 vs 0.09 on the 1.5B)
    PERFORMANCE_HINT LATENCY, NUM_STREAMS 1, INFERENCE_NUM_THREADS = torch.get_num_threads() (recompiled,
                                   ~3-4 s for the 1.5B, when that changes)
    KV_CACHE_PRECISION             moot (its default u8 would be lossy): it applies to a stateful model's
                                   internal cache, and here the cache is float32 arrays owned by the state.
                                   A stateful IR was not used: rolling its state back means reading, slicing
                                   and writing every layer's cache (a copy of the whole cache per crop).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from specdec.backends.base import Backend
from specdec.backends.buffers import grown, grown_capacity
from specdec.backends.prompt import Prompt, refuse_features
from specdec.errors import ConfigError, InputError, ModelError
from specdec.runtime_registry import Package

# what pip installs for it: pins openvino and nncf (which compresses the weights)
OPENVINO = Package("openvino", "openvino", "pip install 'specbench[openvino]'")

OPENVINO_PINS = OPENVINO.extra  # pip install 'specbench[openvino]'

DEFAULT_CONFIG = {
    "INFERENCE_PRECISION_HINT": "f32",
    "PERFORMANCE_HINT": "LATENCY",
    "NUM_STREAMS": "1",
}
FIRST_CAPACITY = 256  # rows a state's buffers start with; doubled as it grows


def _openvino():
    try:
        import openvino
    except ImportError as e:
        raise ConfigError(f"runtime openvino needs openvino, which cannot be imported ({e}): {OPENVINO_PINS}") from None
    return openvino


@dataclass
class OpenVinoState:
    keys: list[np.ndarray] = field(default_factory=list)  # per layer [capacity, H_kv, D]
    values: list[np.ndarray] = field(default_factory=list)
    length: int = 0  # token positions held (rows 0 .. length-1 of the buffers)


class OpenVinoBackend(Backend):
    """An IR made by specdec/models/convert_openvino.py, compiled for the CPU; `convert_openvino.load_openvino`
    makes one from a HF model folder, converting it on first use.

    `info`: the IR's layers, kv_heads, head_dim and max_positions (its marker's "model")."""

    memory_bytes: int | None = None  # set at load: the bytes it holds

    accepts_audio = False

    def __init__(self, ir_xml: Path | str, info: dict, name: str = "", config: dict | None = None,
                 eos_ids: frozenset[int] = frozenset()) -> None:
        ov = _openvino()
        self.ir_xml = Path(ir_xml)
        self.name = name or self.ir_xml.parent.parent.name
        self.layers, self.kv_heads, self.head_dim = int(info["layers"]), int(info["kv_heads"]), int(info["head_dim"])
        self.max_positions: int = int(info["max_positions"])
        self.eos_ids = frozenset(eos_ids)
        self.config = {**DEFAULT_CONFIG, **(config or {})}
        self._core = ov.Core()
        try:
            self._ir = self._core.read_model(self.ir_xml)
        except RuntimeError as e:
            raise ModelError(f"OpenVINO cannot read {self.ir_xml} ({_first_line(e)}): delete {self.ir_xml.parent} "
                             "to convert the model again") from None
        self.vocab_size = int(self._ir.output("logits").get_partial_shape()[1].get_length())
        self.memory_bytes = self.ir_xml.with_suffix(".bin").stat().st_size  # weights; each state's KV grows with it
        self.threads = 0
        self._compile()

    # --- protocol -----------------------------------------------------------------------
    def prefill(self, prompt: Prompt, token_ids: torch.Tensor, keep: int = 0, use_cache: bool = True):
        refuse_features(prompt, self.name, "OpenVINO")
        state = OpenVinoState()
        logits = self._run(state, token_ids, keep) if token_ids.numel() else None
        if not use_cache:
            state.keys, state.values, state.length = [], [], 0
        return state, logits


    # --- internals ----------------------------------------------------------------------
    def _compile(self) -> None:
        self.threads = torch.get_num_threads()
        config = {**self.config, "INFERENCE_NUM_THREADS": str(self.threads)}
        try:
            self._compiled = self._core.compile_model(self._ir, "CPU", config)
        except RuntimeError as e:
            raise ModelError(f"OpenVINO cannot compile {self.ir_xml} for the CPU with {config} ({_first_line(e)})") from None
        self._request = self._compiled.create_infer_request()

    @property
    def streamed_bytes(self) -> int:
        """The bytes one token step reads: every weight constant of the IR but those whose only readers are a
        Gather (an embedding table, read one row at a time), followed through nncf's decompression (Convert,
        Subtract, Multiply, Reshape) to the op that uses them."""
        passing = {"Convert", "Subtract", "Multiply", "Reshape", "Unsqueeze", "Squeeze", "Transpose"}
        total = 0
        for op in self._ir.get_ordered_ops():
            if op.get_type_name() != "Constant" or op.get_output_size() != 1:
                continue
            users, frontier, seen = set(), [op], set()
            while frontier:
                node = frontier.pop()
                for target in node.output(0).get_target_inputs():
                    reader = target.get_node()
                    if reader.get_type_name() in passing and reader.get_friendly_name() not in seen:
                        seen.add(reader.get_friendly_name())
                        frontier.append(reader)
                    elif reader.get_type_name() not in passing:
                        users.add(reader.get_type_name())
            if users and users != {"Gather"}:
                total += op.get_byte_size()
        return total

    def compiled_property(self, key: str):
        """A property of the compiled model as the plugin resolved it (e.g. INFERENCE_PRECISION_HINT)."""
        return self._compiled.get_property(key)

    def _reserve(self, state: OpenVinoState, rows: int) -> None:
        if state.keys and state.keys[0].shape[0] >= rows:
            return
        capacity = grown_capacity(state.keys[0].shape[0] if state.keys else 0, rows, FIRST_CAPACITY)
        for buffers in (state.keys, state.values):
            for index in range(self.layers):
                if index < len(buffers):
                    buffers[index] = grown(buffers[index], capacity, 0, state.length)
                else:
                    buffers.append(np.empty((capacity, self.kv_heads, self.head_dim), np.float32))

    def _run(self, state: OpenVinoState, token_ids: torch.Tensor, keep: int) -> torch.Tensor | None:
        n, start = token_ids.numel(), state.length
        if not 0 <= keep <= n:
            raise ValueError(f"keep={keep} rows of a block of {n}")
        if start + n > self.max_positions:
            raise InputError(f"model {self.name!r} has {self.max_positions} positions; this block would reach "
                             f"{start + n}: lower --max-new-tokens or shorten the prompt")
        if torch.get_num_threads() != self.threads:  # the caps changed since load
            self._compile()
        self._reserve(state, start + n)
        inputs = {
            "input_ids": token_ids.to(torch.long).numpy().reshape(1, n),
            "position_ids": np.arange(start, start + n, dtype=np.int64).reshape(1, n),
            "logit_rows": np.arange(n - max(keep, 1), n, dtype=np.int64),  # keep 0: one row's logits, dropped
        }
        for index in range(self.layers):
            inputs[f"past_key.{index}"] = state.keys[index][:start]
            inputs[f"past_value.{index}"] = state.values[index][:start]
        try:
            out = self._request.infer(inputs, share_inputs=True, share_outputs=True)
        except RuntimeError as e:
            raise ModelError(f"OpenVINO inference failed for model {self.name!r} ({_first_line(e)})") from None
        for index in range(self.layers):
            state.keys[index][start : start + n] = out[f"new_key.{index}"]
            state.values[index][start : start + n] = out[f"new_value.{index}"]
        state.length = start + n
        if keep == 0:
            return None
        return torch.from_numpy(np.array(out["logits"], dtype=np.float32, copy=True))  # [keep, V]


def _first_line(error: Exception) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
