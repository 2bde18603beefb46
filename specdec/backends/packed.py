"""The kernels' int8 and int4 runtimes (formerly named for VNNI): a Llama/Qwen2-style decoder on
specbench's own exact kernels (specdec/kernels/: one scalar reference, one vector path per instruction set, chosen
for this CPU), whose verify blocks cost about one step and compute, bit for bit, the logits of the steps they stand
for, the same bits on every processor.

The model's folder is loaded in float32 and packed once (specdec/kernels/pack.py): q/k/v as one Linear, gate and up
as one, every decoder Linear int8 per output column (the int8 runtime) or int4 in groups of 32 with fp16 scales
(the int4 runtime: Q4_0's format, half the bytes); the output head is int8 in both (a tied head is the embedding
quantized; the embedding itself stays float32, a step reads one row of it). A forward is

    x = embed[ids]                                                   [n, hidden]
    per layer:  x = x + o(attention(qkv(rms_norm(x))))               every Linear: per-row int8 activations
                x = x + down(silu(gate) * up)(rms_norm(x))
    logits = head(rms_norm(x[last keep rows]))                       [keep, V] float32

(the last layer takes only the kept rows past its attention: every row's keys and values are cached by then). The
layers run in one C++ call (csrc/module.cpp's `Decoder`, without the GIL): the same kernels in the same order as a
Python loop over them, so the same bits (tests/test_packed.py holds the two equal), without a Python call between each
kernel; `forward_tree` keeps the Python loop, its attention being one call a root-to-leaf path.

Why blocks are steps: every activation row is quantized with its own scale and multiplied in exact int32; each
norm, each attention row (one query over exactly the keys a step at its position attends) and each elementwise
op is computed by one code path that depends on that row alone (specdec/kernels/csrc/kernels.h). Rows of other sessions in
`forward_batch` share the Linears' calls and change nothing either.

The state: a [layers, 2, capacity, kv_heads, head_dim] float32 cache per sequence; a block writes its keys and
values at rows length .. length+n-1, so `crop` only sets `length` (the next block overwrites what lay past it).
Capacity doubles as needed, up to the model's positions (the rotary table's rows).

Token trees (specdec/core/tree.py): every row of the block, the cached tokens' and the tree's nodes', goes through
each Linear in one call (a row's Linear is its own); attention runs once per root-to-leaf path, the path as a chain
after the cache, so each node attends exactly the keys its path's step would, in position order, and its row is that
step bit for bit. The nodes' q/k/v rows are kept so `commit_path` writes the accepted path's keys and values where a
chain's would be.
"""
from __future__ import annotations

import copy
import threading
from dataclasses import dataclass

import torch

from specdec.backends.base import Backend, kept_rows
from specdec.backends.buffers import grown, grown_capacity
from specdec.backends.prompt import Prompt, refuse_features
from specdec.errors import InputError, ModelError
from specdec.kernels import kernels, pack
from specdec.kernels.pack import PackedLinear
from specdec.runtime_registry import default_runtime, exact_elsewhere

MODEL_TYPES = ("qwen2", "llama")  # pre-norm decoders with rotate-half rotary, SiLU gated MLPs, RMSNorm
WEIGHTS = ("int8", "int4")
MAX_TABLE = 32768  # rotary positions computed at load (the 1.5B declares 32768)
# The MLP's rows a pass: its silu output (rows x intermediate float32) stays under this, below glibc's largest mmap
# threshold (32 MB), so the allocator reuses it from call to call; the gate_up output, twice that, is a workspace
# each thread keeps (`_gate_up_out`). A fresh tensor over 32 MB is new pages on every call: an 800-token prefill of
# the 1.5B faulted in 1.6 GB of them (~390,000 page faults) and took 4.06 s against 3.55 s without (2026-11-30).
MLP_SLAB_BYTES = 28 << 20
# A longer prompt (or block) goes through the model in chunks of this many rows, each after the cache the ones before
# wrote (rows are their own, so the bits are the one pass's): a pass's tensors stay the size of an 800-token
# prefill's, which the allocator reuses; 2,000 rows in one pass faulted in ~1 GB of fresh pages a prefill.
PREFILL_CHUNK = 1024
MIN_CAPACITY = 256


@dataclass(frozen=True)
class Layer:
    input_norm: torch.Tensor  # [hidden]
    qkv: PackedLinear  # [(heads + 2 kv_heads) head_dim, hidden]
    o: PackedLinear
    post_norm: torch.Tensor
    gate_up: PackedLinear  # [2 intermediate, hidden]
    down: PackedLinear


def _weights(packed: PackedLinear) -> tuple:
    """A packed Linear as the C++ Decoder takes it: (weight, scale, bias, N, K, group; group 0 for int8)."""
    return (packed.weight, packed.scale, packed.bias, packed.out_features, packed.in_features,
            packed.group if packed.kind == "int4" else 0)


class Workspace(threading.local):
    """What one thread's forwards reuse from call to call: gate_up's output, grown as needed (`_gate_up_out`)."""

    gate_up: torch.Tensor | None = None


@dataclass(frozen=True)
class PackedDecoder:
    """A decoder's weights as packed: its layers, the float32 embedding and final norm, the int8 output head."""

    layers: list[Layer]
    embed: torch.Tensor  # [vocab, hidden]
    norm: torch.Tensor  # [hidden]
    head: PackedLinear  # [vocab, hidden]


@dataclass
class PackedState:
    length: int  # token positions held
    kv: torch.Tensor | None = None  # [layers, 2, capacity, kv_heads, head_dim]
    tree_qkv: list[torch.Tensor] | None = None  # the last forward_tree's nodes' q/k/v rows, a layer each (commit_path)


def check_model(config) -> None:
    """The decoders this runtime computes, or one line naming what it cannot."""
    if config.model_type not in MODEL_TYPES:
        raise ModelError(f"runtime kernels runs {', '.join(MODEL_TYPES)} decoders, not {config.model_type!r}: "
                         f"{exact_elsewhere()}")
    if getattr(config, "hidden_act", "silu") != "silu":
        raise ModelError(f"runtime kernels computes SiLU MLPs, this model's act is {config.hidden_act!r}: use runtime "
                         f"{default_runtime()}")
    if getattr(config, "use_sliding_window", False) and getattr(config, "sliding_window", None):
        raise ModelError("runtime kernels attends to every cached position; this model uses a sliding window: use runtime "
                         f"{default_runtime()}")


def _linear(linears: list, weights: str) -> PackedLinear:
    """Several nn.Linear of one input (q, k, v; gate, up) packed as one, their outputs side by side."""
    weight = torch.cat([linear.weight.detach().float() for linear in linears])
    biases = [linear.bias for linear in linears]
    bias = None if all(b is None for b in biases) else torch.cat(
        [b.detach().float() if b is not None else torch.zeros(linear.out_features) for b, linear in zip(biases, linears)])
    return pack.int4(weight, bias) if weights == "int4" else pack.int8(weight, bias)


class PackedBackend(Backend):
    """A causal LM packed for specbench's kernels; build with `from_model` (specdec/models/pack_kernels.py loads a folder)."""

    accepts_audio = False
    accepts_trees = True  # forward_tree, commit_path
    cuts_head = True  # with_head_rows
    batchable = True  # forward_batch: rows of several states in one pass

    def __init__(self, name: str, weights: str, packed: PackedDecoder, rotary: tuple[torch.Tensor, torch.Tensor],
                 shape: dict, path: str | None = None) -> None:
        self.name, self.weights = name, weights
        self.layers, self.embed, self.norm, self.head = packed.layers, packed.embed, packed.norm, packed.head
        self.cos, self.sin = rotary
        self.heads, self.kv_heads, self.head_dim = shape["heads"], shape["kv_heads"], shape["head_dim"]
        self.eps, self.scaling = shape["eps"], self.head_dim ** -0.5
        self.vocab_size = self.head.out_features
        self.max_positions: int = self.cos.shape[0]
        self.device = torch.device("cpu")
        self.eos_ids: frozenset[int] = frozenset()  # the loader adds the folder's generation config's
        self.ops = kernels(path)  # the instruction-set path: this CPU's best unless named (specdec/kernels)
        self.kernel_path: str = self.ops.path
        self._local = Workspace()
        self.head_rows: torch.Tensor | None = None  # with_head_rows: the ids `head` computes (None: every id)
        # The layers in one C++ call (csrc/module.cpp's Decoder): the same kernels in the same order as a Python loop
        # over them (forward_tree's), without a Python call between each.
        self._decoder = self.ops.Decoder(self.cos, self.sin, self.heads, self.kv_heads, self.scaling, self.eps)
        for layer in self.layers:
            self._decoder.add_layer(layer.input_norm, layer.post_norm, *(_weights(p) for p in
                                                                          (layer.qkv, layer.o, layer.gate_up, layer.down)))

    @classmethod
    def from_model(cls, model, weights: str = "int8", name: str = "", path: str | None = None) -> PackedBackend:
        """Pack a loaded transformers `*ForCausalLM` (any float dtype; read as float32) for the kernels' `path`
        (default: the one chosen for this CPU)."""
        if weights not in WEIGHTS:
            raise ModelError(f"unknown kernels weights {weights!r}: use one of {', '.join(WEIGHTS)}")
        config = model.config
        check_model(config)
        kernels(path)  # refuse on this CPU before packing for it
        decoder = model.model
        layers = []
        for block in decoder.layers:
            attn, mlp = block.self_attn, block.mlp
            layers.append(Layer(block.input_layernorm.weight.detach().float().clone(),
                                _linear([attn.q_proj, attn.k_proj, attn.v_proj], weights), _linear([attn.o_proj], weights),
                                block.post_attention_layernorm.weight.detach().float().clone(),
                                _linear([mlp.gate_proj, mlp.up_proj], weights), _linear([mlp.down_proj], weights)))
        first = decoder.layers[0].self_attn
        head_dim = first.q_proj.out_features // config.num_attention_heads
        shape = {"heads": config.num_attention_heads, "kv_heads": config.num_key_value_heads, "head_dim": head_dim,
                 "eps": float(decoder.norm.variance_epsilon)}
        positions = min(int(getattr(config, "max_position_embeddings", MAX_TABLE) or MAX_TABLE), MAX_TABLE)
        with torch.no_grad():  # the model's own rotary module: its frequencies, scaling and attention factor
            probe = torch.zeros(1, dtype=torch.float32)
            cos, sin = decoder.rotary_emb(probe, torch.arange(positions).unsqueeze(0))
        head = model.get_output_embeddings().weight.detach()
        packed = PackedDecoder(layers, decoder.embed_tokens.weight.detach().float().clone(),
                               decoder.norm.weight.detach().float().clone(), pack.int8(head))
        rotary = (cos[0].float().contiguous(), sin[0].float().contiguous())
        return cls(name or config.name_or_path, weights, packed, rotary, shape, path)

    @property
    def streamed_bytes(self) -> int:
        """What a one-token step reads: every packed Linear, the head, the norms (one embedding row: nothing)."""
        return sum(p.nbytes for p in self._linears()) + 4 * sum(2 * layer.input_norm.numel() for layer in self.layers)

    def _linears(self) -> list[PackedLinear]:
        """Every packed Linear, the head last."""
        return [p for layer in self.layers for p in (layer.qkv, layer.o, layer.gate_up, layer.down)] + [self.head]

    @property
    def memory_bytes(self) -> int:
        """What the backend holds: the packed Linears, the float32 embedding, norms and rotary tables, and the calling
        thread's gate_up workspace (at most a slab of rows: ~56 MB for the 1.5B; each state's cache is its own and
        grows with it)."""
        linears = self._linears()
        floats = [self.embed, self.norm, self.cos, self.sin, *(t for layer in self.layers
                                                              for t in (layer.input_norm, layer.post_norm))]
        biases = [p.bias for p in linears if p.bias is not None]
        workspace = self._local.gate_up
        return (sum(p.nbytes for p in linears) + sum(t.numel() * t.element_size() for t in floats + biases)
                + (0 if workspace is None else workspace.numel() * 4))

    def with_head_rows(self, rows: torch.Tensor) -> PackedBackend:
        """A view sharing every weight and the states' layout whose head is the int8 head's rows `rows` only, gathered
        once into a head of their own (pack.rows): a row's logit is its own column's exact int32 dot product and
        scale, so each is the whole head's bit for bit; the other ids read -inf."""
        rows = torch.as_tensor(rows, dtype=torch.long).reshape(-1).unique()  # sorted
        if not rows.numel() or int(rows[0]) < 0 or int(rows[-1]) >= self.vocab_size:
            raise InputError(f"head rows must be ids in 0..{self.vocab_size - 1} of {self.name!r}'s head, at least one")
        view = copy.copy(self)
        view.head, view.head_rows = pack.rows(self.head, rows), rows
        return view

    # --- protocol -----------------------------------------------------------------------
    def prefill(self, prompt: Prompt, token_ids: torch.Tensor, keep: int = 0, use_cache: bool = True):
        refuse_features(prompt, self.name, f"kernels-{self.weights}")
        state = PackedState(0)
        if token_ids.numel() == 0:
            return state, None
        return state, self._chunked(state, token_ids, keep)

    def forward(self, state: PackedState, token_ids: torch.Tensor, keep: int | None = None) -> torch.Tensor | None:
        return self._chunked(state, token_ids, kept_rows(token_ids, keep))

    def forward_batch(self, states: list[PackedState], blocks: list[torch.Tensor],
                      keeps: list[int]) -> list[torch.Tensor | None]:
        """Each state's block in one pass over the weights: [keep_b, V] each, as `forward` gives it, bit for bit."""
        return self._rows(states, blocks, keeps)

    def forward_tree(self, state: PackedState, token_ids: torch.Tensor, tree) -> torch.Tensor:
        ops, r, n = self.ops, token_ids.numel(), tree.size
        if r < 1:
            raise InputError("a tree is verified after at least one token (the last accepted)")
        kv = self._reserve(state, state.length + r + tree.depth)
        paths = [torch.tensor(path) + r for path in tree.leaf_paths()]  # rows of the block
        fed, saved, x = state.length, [], self._embedded(torch.cat([token_ids.reshape(-1), tree.tokens]))
        with torch.inference_mode():
            for index, layer in enumerate(self.layers):
                qkv = self._linear(ops.rms_norm(x, layer.input_norm, self.eps), layer.qkv)
                heads = torch.empty(r + n, self.heads * self.head_dim)
                heads[:r] = self._attend(qkv[:r], kv, index, fed)
                for rows in paths:  # a node shared by several paths: the same bits each time
                    heads[rows] = self._attend(qkv[rows], kv, index, fed + r)
                saved.append(qkv[r:].clone())
                x = self._linear(heads, layer.o, residual=x)
                x = self._mlp(x, layer)
            logits = self._logits(ops.rms_norm(x[r - 1 :].contiguous(), self.norm, self.eps))
        state.length, state.tree_qkv = fed + r, saved
        return logits

    def commit_path(self, state: PackedState, tree, path: list[int]) -> None:
        if state.tree_qkv is None:
            raise ValueError("commit_path follows forward_tree")
        if path:
            assert state.kv is not None  # forward_tree reserved it
            rows = torch.tensor(path)
            with torch.inference_mode():
                for index, qkv in enumerate(state.tree_qkv):  # writes the path's keys and values; its output unused
                    self._attend(qkv[rows], state.kv, index, state.length)
        state.length += len(path)
        state.tree_qkv = None

    # --- internals ----------------------------------------------------------------------
    def _embedded(self, ids: torch.Tensor) -> torch.Tensor:
        """The rows of `ids`' embeddings, or one line naming an id outside the vocabulary."""
        ids = ids.to(torch.long)
        if int(ids.max()) >= self.embed.shape[0] or int(ids.min()) < 0:
            raise InputError(f"token id out of {self.name!r}'s vocabulary of {self.embed.shape[0]}")
        return self.embed[ids]

    def _attend(self, qkv: torch.Tensor, kv: torch.Tensor, layer: int, start: int) -> torch.Tensor:
        """Rows' attention as a chain at positions start.., their keys and values written there."""
        return self.ops.attention(qkv.contiguous(), kv[layer, 0], kv[layer, 1], start, self.cos, self.sin, self.heads,
                                  self.kv_heads, self.scaling)

    def _reserve(self, state: PackedState, needed: int) -> torch.Tensor:
        """The state's cache, grown first where it holds fewer than `needed` positions."""
        if needed > self.max_positions:
            raise InputError(f"{needed} positions exceed {self.name!r}'s {self.max_positions} in kernels-{self.weights}: shorten "
                             "the prompt or --max-new-tokens")
        if state.kv is not None and needed <= state.kv.shape[2]:
            return state.kv
        capacity = grown_capacity(0 if state.kv is None else state.kv.shape[2], needed, MIN_CAPACITY, self.max_positions)
        state.kv = (torch.empty(len(self.layers), 2, capacity, self.kv_heads, self.head_dim) if state.kv is None
                    else grown(state.kv, capacity, 2, state.length))
        return state.kv

    def _chunked(self, state: PackedState, token_ids: torch.Tensor, keep: int) -> torch.Tensor | None:
        """One state's rows, PREFILL_CHUNK at a time past that many; the last `keep` rows' logits."""
        ids, n = token_ids.reshape(-1), token_ids.numel()
        if n <= PREFILL_CHUNK:
            return self._rows([state], [ids], [keep])[0]
        kept = []
        for r0 in range(0, n, PREFILL_CHUNK):
            r1 = min(n, r0 + PREFILL_CHUNK)
            logits = self._rows([state], [ids[r0:r1]], [max(0, min(r1 - r0, keep - (n - r1)))])[0]
            if logits is not None:
                kept.append(logits)
        return torch.cat(kept) if kept else None

    def _rows(self, states: list[PackedState], blocks: list[torch.Tensor], keeps: list[int]) -> list[torch.Tensor | None]:
        """Every state's block in one pass; each block's last `keep` logits [keep, V] (None where keep is 0)."""
        ops, sizes = self.ops, [block.numel() for block in blocks]
        caches = [self._reserve(state, state.length + n) for state, n in zip(states, sizes)]
        x = self._embedded(torch.cat([block.reshape(-1) for block in blocks]))  # [R, hidden]
        starts = [sum(sizes[:i]) for i in range(len(sizes))]
        rows = torch.cat([torch.arange(start + n - keep, start + n) for start, n, keep in zip(starts, sizes, keeps)])
        # Past the last layer's attention only the kept rows go on (every row's keys and values are cached by then,
        # and a row's o, norm and MLP are its own): the same bits for them, and a prefill skips ~1/layers of its
        # Linears (llama.cpp selects its output rows before the last layer's feed-forward likewise).
        slab = self._mlp_slab(self.layers[0].down.in_features)
        workspace = self._gate_up_out(min(x.shape[0], slab), self.layers[0].gate_up.out_features)
        with torch.inference_mode():
            x = self._decoder.forward(x, caches, [state.length for state in states], sizes, rows, slab, workspace)
            logits = self._logits(ops.rms_norm(x, self.norm, self.eps)) if rows.numel() else None
        for state, n in zip(states, sizes):
            state.length += n
        out: list[torch.Tensor | None] = []
        offset = 0
        for keep in keeps:
            out.append(logits[offset : offset + keep] if logits is not None and keep else None)  # None: every keep is 0
            offset += keep
        return out

    def _logits(self, normed: torch.Tensor) -> torch.Tensor:
        """[rows, V]: the head over the final-normed rows; with head rows, theirs in place and -inf elsewhere."""
        if self.head_rows is None:
            return self._linear(normed, self.head)
        logits = torch.full((normed.shape[0], self.vocab_size), float("-inf"))
        logits[:, self.head_rows] = self._linear(normed, self.head)
        return logits

    def _mlp(self, x: torch.Tensor, layer: Layer) -> torch.Tensor:
        """x + down(silu(gate) * up)(rms_norm(x)), a slab of rows at a time (MLP_SLAB_BYTES), gate_up written into
        the thread's workspace: every row is its own, so the slabs change no bit."""
        ops = self.ops
        normed = ops.rms_norm(x, layer.post_norm, self.eps)
        slab = self._mlp_slab(layer.down.in_features)
        parts = []
        for r0 in range(0, x.shape[0], slab):
            r1 = min(x.shape[0], r0 + slab)
            gate_up = self._linear(normed[r0:r1], layer.gate_up, out=self._gate_up_out(r1 - r0, layer.gate_up.out_features))
            parts.append(self._linear(ops.silu_mul(gate_up), layer.down, residual=x[r0:r1]))
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    @staticmethod
    def _mlp_slab(intermediate: int) -> int:
        """The MLP's rows a pass: its silu output stays under MLP_SLAB_BYTES."""
        return max(8, MLP_SLAB_BYTES // (4 * intermediate))

    def _gate_up_out(self, rows: int, width: int) -> torch.Tensor:
        """This thread's [rows, width] float32 workspace for gate_up's output, grown as needed and kept: the largest
        of a prefill's tensors, which a fresh allocation would fault in page by page every layer."""
        buffer = self._local.gate_up
        if buffer is None or buffer.shape[0] < rows or buffer.shape[1] != width:
            buffer = self._local.gate_up = torch.empty(rows, width)
        return buffer[:rows]

    def _linear(self, x: torch.Tensor, packed: PackedLinear, residual: torch.Tensor | None = None,
                out: torch.Tensor | None = None) -> torch.Tensor:
        if packed.kind == "int4":
            return self.ops.linear_int4(x, packed.weight, packed.scale, packed.bias, residual, packed.out_features,
                                        packed.in_features, packed.group, out)
        return self.ops.linear_int8(x, packed.weight, packed.scale, packed.bias, residual, packed.out_features,
                                    packed.in_features, out)
