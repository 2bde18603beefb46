"""A static KV cache: every layer's keys and values preallocated as [B, H_kv, capacity, D] on the model's
device, written in place at explicit positions, and a 4-D mask built from those positions. What a CUDA
graph needs (no tensor is allocated or resized from step to step, no host value decides anything), and
what makes a crop exact for free: crop(L) sets the length, nothing else.

Why a crop is exact: a block at positions L..L+n-1 writes slots L..L+n-1 in every layer before that
layer's attention reads them, and a query at position p sees only slots j <= p (the mask). So a slot past
the accepted length is never read before it is rewritten, whatever an abandoned draft left there.

    cache     StaticKV.update(keys, values, layer) is all a transformers decoder layer calls (5.17 passes
              nothing else, 5.24 a `kwargs=`); `write_at` [n] holds the block's positions
    mask      additive, [B, 1, n, capacity]: 0 where slot j <= the query's position, the dtype's min elsewhere
              (transformers takes a 4-D mask as given, skipping its own mask building and any cache query)
    steps     static: eager; compiled: blocks of up to GRAPH_TOKENS tokens under torch.compile; graphs: the
              same blocks replayed as CUDA graphs (cuda_graphs.py, the one CUDA-only module); longer blocks
              (a prompt) run eagerly in every mode
    trees     a token tree's rows at slots past the unseen tokens, in node order, a node's slot not its position,
              the mask made on the device from the rows' own [m, m] block (hf_causal.py's) and the cache's length
              (`tree_forward`); commit_path copies the kept path's keys and values to the chain's slots.
              Captured under graphs (one graph per row count, up to GRAPH_TREE_ROWS), eager under static and
              compiled

Models: decoders whose layers are all full attention and whose attention takes a 4-D mask (Llama, Qwen2,
Qwen3); the others keep transformers' DynamicCache (hf_causal.py). One sequence at a time per backend: the
backend holds one cache, and a new prefill takes it over (the engine runs one generation at a time; the
server, whose sessions interleave, has a cache of many sequences: static_slots.py).
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from specdec.backends.buffers import grown_capacity
from specdec.backends.cuda_graphs import CapturedSteps, CapturedTrees
from specdec.backends.devices import STEPS, is_cuda
from specdec.backends.hf_causal import (
    HFCausalBackend,
    as_mask,
    block_positions,
    tree_ids,
    tree_positions,
    tree_visible,
)
from specdec.backends.hf_util import FULL_ATTENTION_TYPES, full_attention_decoder
from specdec.backends.prompt import Prompt
from specdec.errors import InputError, ModelError, SpecdecError
from specdec.settings import Steps

GRAPH_TOKENS = 16  # blocks up to this long are compiled / captured (1 token, k + 1, the server's rows x tokens)
GRAPH_TREE_ROWS = 32  # token trees up to this many rows (the unseen tokens and the nodes) are captured, one graph a count
CAPACITY = 1024  # slots a cache starts with (capped at the model's positions); it doubles when a forward needs more


FastSteps = Callable[[torch.Tensor, int], torch.Tensor]  # (ids [1, n], start) -> logits [1, n, V], its own copy


class StaticKV:
    """keys[layer], values[layer]: [B, H_kv, capacity, D], written in place at `write_at` ([n] positions, the
    same for every row)."""

    def __init__(self, config, capacity: int, dtype: torch.dtype, device: torch.device, batch: int = 1) -> None:
        heads = config.num_key_value_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        shape = (batch, heads, capacity, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_hidden_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_hidden_layers)]
        self.capacity = capacity
        self.write_at: torch.Tensor | None = None

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        """Write the block's [B, H_kv, n, D] keys and values at `write_at`; return the layer's whole cache."""
        assert self.write_at is not None, "static_forward sets write_at before the model's forward updates the cache"
        self.keys[layer_idx].index_copy_(2, self.write_at, key_states)
        self.values[layer_idx].index_copy_(2, self.write_at, value_states)
        return self.keys[layer_idx], self.values[layer_idx]

    def copy_prefix(self, other: StaticKV, length: int) -> None:
        """The first `length` slots of `other` (a cache that ran out of room) into this larger one."""
        for mine, theirs in zip(self.keys + self.values, other.keys + other.values):
            mine[:, :, :length].copy_(theirs[:, :, :length])


def static_mask(positions: torch.Tensor, capacity: int, dtype: torch.dtype) -> torch.Tensor:
    """[B, n] positions -> additive mask [B, 1, n, capacity]: 0 where slot j <= position, the dtype's min elsewhere."""
    slots = torch.arange(capacity, device=positions.device)
    hidden = slots > positions[..., None]  # [B, n, capacity]
    return torch.zeros(hidden.shape, dtype=dtype, device=positions.device).masked_fill_(hidden, torch.finfo(dtype).min)[:, None]


def static_forward(model: PreTrainedModel, cache_kwarg: str, kv: StaticKV, ids: torch.Tensor, positions: torch.Tensor,
                   keep: int = 0, slots: torch.Tensor | None = None, mask: torch.Tensor | None = None) -> torch.Tensor:
    """One forward of [B, n] ids at [B, n] positions (every row at the same ones) on `kv`: logits [B, keep, V]
    (keep 0: all n). Plain tensor code with shapes fixed by (B, n): what torch.compile and a CUDA graph take.
    A token tree gives its rows' `slots` [n] (a node's slot is not its position) and its `mask` [1, 1, n, capacity]."""
    kv.write_at = positions[0] if slots is None else slots
    if mask is None:
        mask = static_mask(positions, kv.capacity, kv.keys[0].dtype)
    out = model(input_ids=ids, position_ids=positions, attention_mask=mask, **{cache_kwarg: kv}, use_cache=True,
                logits_to_keep=keep)
    return out.logits


def tree_forward(model: PreTrainedModel, cache_kwarg: str, kv: StaticKV, ids: torch.Tensor, positions: torch.Tensor,
                 block: torch.Tensor, keep: int = 0) -> torch.Tensor:
    """A token tree's forward on `kv`: [1, m] ids at [1, m] positions (the first is the cache's length: an unseen
    token's), written at the m slots from there on, each row seeing the slots before them and, among its own m, those
    `block` [m, m] marks (hf_causal.tree_visible's block). Slots and mask are made here, on the device, with shapes
    fixed by m: a CUDA graph replays it with only ids, positions and block copied in."""
    m, device = ids.shape[1], ids.device
    slots = positions[0, :1] + torch.arange(m, device=device)
    mask = as_mask(tree_columns(positions[0, :1], block, kv.capacity), model, kv.keys[0].dtype, device)
    return static_forward(model, cache_kwarg, kv, ids, positions, keep, slots, mask)


def tree_columns(start: torch.Tensor, block: torch.Tensor, columns: int) -> torch.Tensor:
    """[m, columns] bool, True where a query attends: a tree's m rows written at the columns from `start` ([1], on the
    device: the cache's length) on, each row seeing every column before them and, among its own m, those `block`
    [m, m] marks. Made on the device from tensors only (what a captured graph replays)."""
    m = block.shape[0]
    offset = torch.arange(columns, device=block.device) - start  # each column past the cache's length
    inside = (offset >= 0) & (offset < m)
    return (offset < 0)[None, :] | (block[:, offset.clamp(0, m - 1)] & inside[None, :])


def keep_path(caches: list[torch.Tensor], length: int, path: list[int]) -> None:
    """A tree's kept path into place: each cache [B, H, columns, D] holds the nodes' keys or values at columns
    length + node (node order); the path's move to columns length .. length + len(path) - 1, where a chain's would be."""
    device = caches[0].device
    source = torch.tensor(path, device=device) + length
    target = torch.arange(length, length + len(path), device=device)
    for cache in caches:
        cache.index_copy_(2, target, cache.index_select(2, source))


def static_capable(model: PreTrainedModel) -> bool:
    """The model can run on a static cache: a decoder of full-attention layers that takes a 4-D mask."""
    return full_attention_decoder(model)


def check_static(model: PreTrainedModel) -> None:
    if not static_capable(model):
        raise ModelError(f"a static KV cache runs {', '.join(FULL_ATTENTION_TYPES)} models whose layers are all full "
                         f"attention; this one is {model.config.model_type!r}: use --kv-cache dynamic")


@dataclass
class StaticState:
    length: int  # token positions held (slots 0 .. length-1 of the backend's cache)
    owner: int  # which prefill took the cache: a state of an earlier one is stale
    cache: None = None  # no cache of its own (a stateless verify's state has none either)
    tree: bool = False  # forward_tree wrote its nodes at slots length.. (node order); commit_path moves a path's


class StaticCausalBackend(HFCausalBackend):
    """HFCausalBackend on a static cache (`steps`: static, compiled or graphs; module docstring). Logits of
    steps, blocks and crops equal the dynamic cache's (fp32: tests/test_static_cache.py)."""

    batchable = False  # one cache, one sequence: the server's static cache is static_slots.py

    def __init__(self, model: PreTrainedModel, name: str = "", steps: str = "static", capacity: int = CAPACITY) -> None:
        check_static(model)
        if steps not in STEPS or steps == Steps.DYNAMIC:
            raise ValueError(f"steps must be one of {STEPS[1:]}, got {steps!r}")
        if steps == Steps.GRAPHS and not is_cuda(next(model.parameters()).device):
            raise ModelError("captured CUDA graphs need the model on a CUDA device: use --cuda-graphs off on the CPU")
        super().__init__(model, name)
        self.steps = steps
        self.capacity = min(capacity, getattr(model.config, "max_position_embeddings", None) or capacity)
        self.kv: StaticKV | None = None
        self.owner = 0
        self.fast: FastSteps | None = None  # compiled or captured forwards of short blocks (built with the cache)
        self.trees: CapturedTrees | None = None  # captured token trees' forwards (graphs only; built with the cache)

    # --- protocol -----------------------------------------------------------------------
    def prefill(self, prompt: Prompt, token_ids: torch.Tensor, keep: int = 0, use_cache: bool = True):
        if not use_cache:  # a stateless verify: one forward, no cache kept
            return super().prefill(prompt, token_ids, keep, use_cache=False)
        if prompt.features:
            raise InputError(f"model {self.name!r} is text-only but the prompt has {sorted(prompt.features)}")
        self.owner += 1
        state = StaticState(0, self.owner)
        if token_ids.numel() == 0:
            return state, None
        return state, self._run(state, token_ids, keep)


    def _drop_past(self, state, length: int) -> None:
        """Nothing: slots past the length are masked until rewritten (module docstring)."""

    # --- internals ----------------------------------------------------------------------
    @torch.inference_mode()
    def forward_tree(self, state, token_ids: torch.Tensor, tree) -> torch.Tensor:
        """The unseen tokens at their slots and positions, then the nodes at slots past them in node order, each at
        position (the root's) + its depth, under the tree's mask (hf_causal.py): [1 + n, V]. Captured on CUDA under
        `graphs` (one graph per row count up to GRAPH_TREE_ROWS), eager otherwise."""
        self._check_tree(token_ids)
        self._check_owner(state)
        unseen, n, past = token_ids.numel(), tree.size, state.length
        rows = unseen + n
        kv = self._make_room(past + rows)
        ids = tree_ids(token_ids, tree, self.device)
        positions = tree_positions(past, unseen, tree, self.device)
        block = tree_visible(0, unseen, tree, rows).to(self.device, non_blocking=True)  # [rows, rows]: the rest is made there
        if self.trees is not None and rows <= GRAPH_TREE_ROWS:
            logits = self.trees(ids, positions, block)[0, unseen - 1 :]
        else:
            logits = tree_forward(self.model, self._cache_kwarg, kv, ids, positions, block, n + 1)[0]
        state.length, state.tree = past + unseen, True
        return logits.float()

    @torch.inference_mode()
    def commit_path(self, state, tree, path: list[int]) -> None:
        if not state.tree:
            raise ValueError("commit_path follows forward_tree")
        self._check_owner(state)
        if path:
            assert self.kv is not None  # forward_tree made it
            keep_path(self.kv.keys + self.kv.values, state.length, path)
        state.length += len(path)
        state.tree = False

    def _check_owner(self, state) -> None:
        if state.owner != self.owner:
            raise SpecdecError(f"model {self.name!r} keeps one static KV cache, now another sequence's: run one "
                               "generation at a time on it, or use --kv-cache dynamic")

    @torch.inference_mode()  # the cache and a graph's buffers are made here: inference tensors, written only here
    def _run(self, state, token_ids: torch.Tensor, keep: int) -> torch.Tensor | None:
        if not isinstance(state, StaticState):  # a stateless verify's cache-free state
            return super()._run(state, token_ids, keep)
        self._check_owner(state)
        state.tree = False  # a block after forward_tree without a commit: the nodes' slots are written over
        n = token_ids.numel()
        kv = self._make_room(state.length + n)
        ids = token_ids.to(self.device, non_blocking=True).view(1, n)
        if self.fast is not None and n <= GRAPH_TOKENS:
            logits = self.fast(ids, state.length)[0]  # [n, V], this call's own copy
        else:
            positions = block_positions(state.length, n, self.device)
            logits = static_forward(self.model, self._cache_kwarg, kv, ids, positions, keep)[0]
        state.length += n
        return logits[-keep:].float() if keep else None

    def _make_room(self, needed: int) -> StaticKV:
        """A cache with room for `needed` positions: the first one, or twice the last (its slots copied over)."""
        if self.kv is not None and needed <= self.kv.capacity:
            return self.kv
        limit = getattr(self.model.config, "max_position_embeddings", None) or needed
        capacity = grown_capacity(0 if self.kv is None else self.kv.capacity, needed, self.capacity, limit)
        dtype = next(self.model.parameters()).dtype
        kv = StaticKV(self.model.config, capacity, dtype, self.device)
        if self.kv is not None:
            kv.copy_prefix(self.kv, self.kv.capacity)
        self.kv = kv
        self.fast = self._fast_steps(kv)
        if self.steps == Steps.GRAPHS:
            self.trees = CapturedTrees(functools.partial(tree_forward, self.model, self._cache_kwarg, kv), self.device)
        return kv

    def _fast_steps(self, kv: StaticKV) -> FastSteps | None:
        """(ids [1, n], start) -> logits [1, n, V] for short blocks: compiled or captured over `kv`; None: eager."""
        def step(ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
            return static_forward(self.model, self._cache_kwarg, kv, ids, positions)

        if self.steps == Steps.GRAPHS:
            return CapturedSteps(step, self.device, kv.capacity)
        if self.steps == Steps.COMPILED:
            compiled = torch.compile(step, dynamic=None)

            def run(ids: torch.Tensor, start: int) -> torch.Tensor:
                return compiled(ids, block_positions(start, ids.shape[-1], self.device)).clone()

            return run
        return None


def placed(backend, device: str, steps: str = "dynamic"):
    """A Whisper or Omni backend with its model moved to `device`; those keep their own caches."""
    if steps != Steps.DYNAMIC:
        raise ModelError(f"a static KV cache runs {', '.join(FULL_ATTENTION_TYPES)} models; {backend.name!r} keeps its "
                         "own cache: use --kv-cache dynamic")
    backend.model.to(device)
    backend.device = torch.device(device)
    return backend
