"""Backend that runs a causal LM in ONNX Runtime (CPU provider, a plain `InferenceSession`) on the
graph onnxruntime-genai's builder made of it (`specdec.models.convert_onnx`; `load_onnx` converts on
first use).

The graph (builder 0.18.0, Qwen2/Llama-style decoders): inputs `input_ids` [1, n], `attention_mask`
[1, total], `past_key_values.{i}.key|value` [1, kv_heads, past, head_size] float32, and
`num_logits_to_keep` [1] (added by the converter); outputs `logits` [1, keep, V] and
`present.{i}.key|value`. Attention is the GroupQueryAttention contrib op with rotary embedding inside:
there is no position_ids input. GQA derives its positions from the mask: seqlens_k = sum(mask) - 1,
total = mask width, past = total - n, and the block's rows sit at positions past .. past+n-1 with a
causal mask over the block (checked against a full forward in tests/test_onnxrt.py).

The protocol on it:

    state            per-state K/V buffers [layers x 2, 1, kv_heads, capacity, head_size] (numpy, bound
                     as OrtValues) + `length`; GQA runs in shared-buffer mode (each layer's past and present
                     bound to the same buffer), so a block's keys/values are written in place at rows
                     length .. length+n-1 and nothing is copied per forward. Capacity grows by doubling
                     (one copy of the held rows) up to `max_positions`.
    prefill/forward  ONE `run_with_iobinding`: mask of ones [1, length+n], the block's ids, and
                     num_logits_to_keep = keep (the head runs on those rows only)
    crop             `length = L`: GQA reads rows < length only (rows past it are overwritten by the
                     next block), so rollback is exact and free

Threads: intra-op threads = torch.get_num_threads() at load; ORT cannot change a session's pool, so
a forward that finds another thread count rebuilds the session (seconds). Sequential execution, one
inter-op thread; `spin` (default on, ORT's default) lets the pool's threads spin-wait between ops:
on 2 loaded cores turning it off made the 1.5B's steps and blocks ~10-20% slower.

Numerics: int4/int8 weights (symmetric, round to nearest, blocks of 32) with accuracy_level 4, so
logits equal a float32 torch forward only within a tolerance (large for int4 on these Q4_K_M-derived
weights). Batch invariance: every MatMulNBits/GQA call with M >= 2 rows computes each row alike
(rows of a 140-token prefill, of blocks of 2..9 and of the padded steps below agree bit for bit on
the real 0.5B and 1.5B), but a one-row block takes another MLAS path whose logits differ by up to
~1% of their range (0.2-0.4 absolute; `mlas.qnbit.force_fp32` shrinks that to ~4e-5, and makes blocks
~3x slower). So `pad_steps` (default on) runs a one-token forward as the block [t, t] and drops the
second row (its keys/values are past `length`, so the next block overwrites them): steps, blocks and
prefills then agree bit for bit, and greedy speculation verified here reproduces this runtime's own
plain decoding. The price: a step costs a two-row block (~+15% over a bare one-row step, 1.5B int4).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from specdec.backends.base import Backend
from specdec.backends.buffers import grown, grown_capacity
from specdec.backends.prompt import Prompt, refuse_features
from specdec.errors import ConfigError, InputError, ModelError
from specdec.runtime_registry import Package

# what pip installs for it: pins onnxruntime-genai (its builder converts) and onnxruntime
ONNX = Package("onnxruntime_genai", "onnxruntime-genai", "pip install 'specbench[onnx]'")

KEEP_INPUT = "num_logits_to_keep"  # the logits' rows to keep: added to the builder's graph by convert_onnx
MIN_CAPACITY = 256  # positions a state's buffers hold at first; they double as needed


@dataclass
class OnnxState:
    length: int  # token positions held (0 .. length-1)
    kv: np.ndarray | None = None  # [layers * 2, 1, kv_heads, capacity, head_size] float32, rows >= length unused
    values: list = field(default_factory=list, repr=False)  # OrtValues over kv[i] (share its memory)

    @property
    def capacity(self) -> int:
        return 0 if self.kv is None else self.kv.shape[3]


def _ort():
    try:
        import onnxruntime
    except ImportError as e:
        raise ConfigError(f"the ONNX runtime needs onnxruntime, which cannot be imported ({e}): {ONNX.extra}") from None
    return onnxruntime


class OnnxRuntimeBackend(Backend):
    """A converted folder (`specdec.models.convert_onnx`) in one ONNX Runtime session."""

    memory_bytes: int | None = None  # set at load: the bytes it holds

    accepts_audio = False

    def __init__(self, folder: Path | str, name: str = "", spin: bool = True, max_positions: int | None = None,
                 session_config: dict[str, str] | None = None, pad_steps: bool = True) -> None:
        """`pad_steps`: run a one-token block as two rows (the token twice, the second dropped) so it
        takes the kernels every longer block takes: blocks and steps then agree bit for bit.
        `session_config`: extra ORT session config entries (e.g. {"mlas.qnbit.force_fp32": "1"})."""
        self._ort = _ort()
        folder = Path(folder)
        self.folder, self.name, self.spin, self.pad_steps = folder, name or folder.parent.name, spin, pad_steps
        self.session_config = dict(session_config or {})
        try:
            config = json.loads((folder / "genai_config.json").read_text())["model"]
            decoder = config["decoder"]
            self.layers, self.kv_heads = int(decoder["num_hidden_layers"]), int(decoder["num_key_value_heads"])
            self.head_size, self.vocab_size = int(decoder["head_size"]), int(config["vocab_size"])
            trained = int(config.get("context_length") or 0)
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ModelError(f"{folder} has no readable genai_config.json ({e}): convert the model again") from None
        self.max_positions: int = min(max_positions or trained, trained) if trained else (max_positions or 4096)
        self._rows = self.max_positions  # what a state's buffers may hold: a padded step at the last position
        self.max_positions -= int(pad_steps)  # needs one row more than the positions it keeps
        eos = config.get("eos_token_id")
        self.eos_ids = frozenset(int(i) for i in (eos if isinstance(eos, list) else [eos] if eos is not None else []))
        self.threads = torch.get_num_threads()
        self._session = self._new_session()
        names = {i.name for i in self._session.get_inputs()}
        self._keys = [f"past_key_values.{i}.{kv}" for i in range(self.layers) for kv in ("key", "value")]
        self._presents = [f"present.{i}.{kv}" for i in range(self.layers) for kv in ("key", "value")]
        if missing := sorted({"input_ids", "attention_mask", KEEP_INPUT, *self._keys} - names):
            raise ModelError(f"{folder / 'model.onnx'} lacks the inputs {missing}: convert the model again "
                             "(specdec.models.convert_onnx)")
        # The weights' bytes as stored: an upper bound on their resident size (the 1.5B int4: 1.92 GB on disk,
        # +1.42 GB RSS after load and a forward); each state's K/V buffers come on top, kv_bytes_per_position each.
        self.memory_bytes = sum(p.stat().st_size for p in folder.glob("model.onnx*"))
        self.kv_bytes_per_position = 2 * self.layers * self.kv_heads * self.head_size * 4

    @property
    def streamed_bytes(self) -> int:
        """The bytes one token step reads: every weight of the graph but the embedding tables a Gather looks
        one row up in (the builder keeps the token embeddings in float32, half the 1.5B int4's file)."""
        import onnx

        model = onnx.load(str(self.folder / "model.onnx"), load_external_data=False)
        gathered = {n.input[0] for n in model.graph.node if n.op_type == "Gather"}
        used_elsewhere = {i for n in model.graph.node if n.op_type != "Gather" for i in n.input}
        total = 0
        for tensor in model.graph.initializer:
            if tensor.name in gathered and tensor.name not in used_elsewhere:
                continue
            stored = {e.key: e.value for e in tensor.external_data}
            total += int(stored["length"]) if "length" in stored else len(tensor.raw_data) or 0
        return total

    def _new_session(self):
        ort = self._ort
        options = ort.SessionOptions()
        options.intra_op_num_threads = self.threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.add_session_config_entry("session.intra_op.allow_spinning", "1" if self.spin else "0")
        for key, value in self.session_config.items():
            options.add_session_config_entry(key, value)
        options.log_severity_level = 3  # errors reach the user as our one-line ModelErrors
        try:
            return ort.InferenceSession(str(self.folder / "model.onnx"), options, providers=["CPUExecutionProvider"])
        except Exception as e:
            first = str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__
            raise ModelError(f"ONNX Runtime cannot load {self.folder / 'model.onnx'} ({first}): convert the model "
                             "again") from None

    # --- protocol -----------------------------------------------------------------------
    def prefill(self, prompt: Prompt, token_ids: torch.Tensor, keep: int = 0, use_cache: bool = True):
        refuse_features(prompt, self.name, "ONNX Runtime")
        state = OnnxState(0)
        logits = self._run(state, token_ids, keep) if token_ids.numel() else None
        if not use_cache:
            state.kv, state.values, state.length = None, [], 0
        return state, logits


    # --- internals ----------------------------------------------------------------------
    def _reserve(self, state: OnnxState, needed: int) -> None:
        """Grow the state's buffers to hold `needed` positions (doubling; the held rows copied once)."""
        if needed <= state.capacity:
            return
        capacity = grown_capacity(state.capacity, needed, MIN_CAPACITY, self._rows)
        state.kv = (np.empty((2 * self.layers, 1, self.kv_heads, capacity, self.head_size), np.float32)
                    if state.kv is None else grown(state.kv, capacity, 3, state.length))
        state.values = [self._ort.OrtValue.ortvalue_from_numpy(state.kv[i]) for i in range(2 * self.layers)]

    def _run(self, state: OnnxState, token_ids: torch.Tensor, keep: int) -> torch.Tensor | None:
        """Feed token_ids [n] at positions state.length .. +n-1; logits [keep, V] of the last rows."""
        n = token_ids.numel()
        if not 0 <= keep <= n:
            raise ValueError(f"keep {keep} must be within 0 .. {n} (the block's rows)")
        if n == 0:
            return None
        if state.length + n > self.max_positions:
            raise InputError(f"model {self.name!r} has {self.max_positions} positions; this block would reach "
                             f"{state.length + n}: lower --max-new-tokens or shorten the prompt")
        if torch.get_num_threads() != self.threads:  # the caps changed since load: a session's pool is fixed
            self.threads = torch.get_num_threads()
            self._session = self._new_session()
        ids = token_ids.detach().to(torch.int64).reshape(1, n).numpy()
        padded = n == 1 and self.pad_steps
        if padded:  # [t, t]: row 0 is this step as a block computes it; row 1's keys/values are dropped below
            ids, n, keep = np.concatenate([ids, ids], axis=1), 2, 2 if keep else 0
        self._reserve(state, state.length + n)
        binding = self._session.io_binding()
        binding.bind_cpu_input("input_ids", ids)
        binding.bind_cpu_input("attention_mask", np.ones((1, state.length + n), np.int64))
        binding.bind_cpu_input(KEEP_INPUT, np.array([max(keep, 1)], np.int64))  # keep 0: one row, dropped
        binding.bind_output("logits")
        for past, present, value in zip(self._keys, self._presents, state.values):
            binding.bind_ortvalue_input(past, value)
            binding.bind_ortvalue_output(present, value)  # the same buffer: GQA writes the block in place
        try:
            self._session.run_with_iobinding(binding)
        except Exception as e:
            first = str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__
            raise ModelError(f"ONNX Runtime failed on a block of {n} tokens at position {state.length} for model "
                             f"{self.name!r}: {first}") from None
        state.length += n - int(padded)
        if keep == 0:
            return None
        logits = binding.get_outputs()[0].numpy()  # [1, keep, V] float32, a copy
        return torch.from_numpy(logits[0, :1] if padded else logits[0])
