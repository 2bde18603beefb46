"""A static KV cache of many sequences, the verifier server's: one preallocated cache of `slots` rows, each
session holding a row (its slot) from its prefill until its state is dropped, and batched forwards whose rows
sit at their own positions. What lets the server's forwards (rows x tokens) replay as CUDA graphs.

    cache     keys[layer]: [slots + 1, H_kv, capacity + 1, D]. The extra row is padding rows' scratch, the extra
              column padding tokens' (a block shorter than its forward's longest writes its padding there,
              past every real position: never read by a real query)
    forward   ids [B, n] (padded), positions [B, n] (each row its own: length + arange), rows [B] (slots):
              the block's keys are scattered into the rows' slots, then each layer attends over its rows'
              first `span` columns, gathered (`span` = a power of two past the longest position: the
              gather and the attention cost what the contexts hold, not the capacity)
    graphs    on CUDA with `steps` graphs: forwards of up to GRAPH_TOKENS tokens replay as one graph per
              (rows, tokens, span), rows padded up to a power of two (cuda_graphs.py's CapturedRows); longer
              blocks (a prompt) run eagerly
    trees     under `static` (eager), one session's token tree in a forward of its own: its unseen tokens, then
              the nodes at the slot's columns past them in node order (a node's column is not its position),
              under the tree's mask (static_cache.tree_columns); commit_path copies the kept path's keys and
              values to the chain's columns, in that slot's row. Under `graphs` the sessions verify chains: a
              tree beside the captured rows would run eagerly, at several captured steps' cost on a GPU

Exactness (fp32, tests/test_static_slots.py): a row's logits and cache equal its own forward on the dynamic
cache, as for the single-sequence static cache (static_cache.py): a slot column past a row's length is never
read before its block rewrites it, and the mask shows each real query its row's columns up to its position.

A dropped state frees its slot (a finalizer), so the server needs no close hook; a prefill with every slot
held is one line naming the fix. One backend serves sessions on one thread (the server's compute thread).
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
from transformers import PreTrainedModel

from specdec.backends.base import kept_rows
from specdec.backends.cuda_graphs import CapturedRows
from specdec.backends.devices import is_cuda
from specdec.backends.hf_causal import HFCausalBackend, as_mask, tree_ids, tree_positions, tree_visible
from specdec.backends.prompt import Prompt
from specdec.backends.static_cache import (
    GRAPH_TOKENS,
    StaticCausalBackend,
    StaticKV,
    check_static,
    keep_path,
    static_mask,
    tree_columns,
)
from specdec.errors import InputError, ModelError, SpecdecError
from specdec.settings import Steps

CAPACITY = 2048  # positions a session may hold (capped at the model's): its prompt plus its new tokens
SPAN = 64  # the smallest span gathered


@dataclass
class SlotState:
    slot: int
    length: int  # positions held (columns 0 .. length-1 of the slot's row)
    cache: None = None  # what a stateless verify's state also has: no cache of its own
    tree: bool = False  # forward_tree wrote its nodes at columns length.. (node order); commit_path moves a path's
    _free: object = field(default=None, repr=False)


class SlotKV(StaticKV):
    """StaticKV whose forwards write each row at its own positions (`rows`, `write_at` [B, n]) and read their rows'
    first `span` columns."""

    def __init__(self, config, slots: int, capacity: int, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__(config, capacity + 1, dtype, device, batch=slots + 1)
        self.rows: torch.Tensor | None = None
        self.span = capacity + 1

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        assert self.rows is not None, "slot_forward sets the rows before the model's forward updates the cache"
        rows, at = self.rows[:, None], self.write_at  # [B, 1], [B, n]
        self.keys[layer_idx][rows, :, at] = key_states.transpose(1, 2)  # [B, n, H, D] at (row, position)
        self.values[layer_idx][rows, :, at] = value_states.transpose(1, 2)
        span = self.span
        return self.keys[layer_idx][self.rows, :, :span], self.values[layer_idx][self.rows, :, :span]


class TreeRows(NamedTuple):
    """A token tree's forward on the shared cache: the `columns` [1, n] its rows are written at (a node's column is
    not its position), its `mask` [1, 1, n, span], and the last `keep` rows' logits returned."""

    columns: torch.Tensor
    mask: torch.Tensor
    keep: int


def slot_forward(model: PreTrainedModel, cache_kwarg: str, kv: SlotKV, ids: torch.Tensor, positions: torch.Tensor,
                 rows: torch.Tensor, span: int, tree: TreeRows | None = None) -> torch.Tensor:
    """Logits [B, n, V] of ids [B, n] at positions [B, n] in slots `rows` [B], attending over `span` columns (a
    tree's: [1, tree.keep, V])."""
    kv.rows, kv.write_at, kv.span = rows, positions if tree is None else tree.columns, span
    mask = static_mask(positions, span, kv.keys[0].dtype) if tree is None else tree.mask
    out = model(input_ids=ids, position_ids=positions, attention_mask=mask, **{cache_kwarg: kv}, use_cache=True,
                logits_to_keep=0 if tree is None else tree.keep)
    return out.logits


class SlotCausalBackend(HFCausalBackend):
    """HFCausalBackend on one static cache of `slots` sequences (module docstring): `forward_batch` runs rows of
    different sessions at their own positions in one forward."""

    batchable = True

    def __init__(self, model: PreTrainedModel, name: str = "", steps: str = "static", slots: int = 16,
                 capacity: int = CAPACITY) -> None:
        check_static(model)
        if steps not in (Steps.STATIC, Steps.GRAPHS):
            raise ValueError(f"steps must be static or graphs, got {steps!r}")
        if steps == Steps.GRAPHS and not is_cuda(next(model.parameters()).device):
            raise ModelError("captured CUDA graphs need the model on a CUDA device: use --cuda-graphs off on the CPU")
        super().__init__(model, name)
        self.accepts_trees = self.accepts_trees and steps == Steps.STATIC  # under graphs: chains (module docstring)
        self.steps, self.slots = steps, slots
        self.max_positions: int = min(capacity, getattr(model.config, "max_position_embeddings", None) or capacity)
        self.kv: SlotKV | None = None
        self.free: list[int] = list(range(slots - 1, -1, -1))  # popped from the end: slot 0 first
        self.fast: CapturedRows | None = None

    # --- protocol -----------------------------------------------------------------------
    def prefill(self, prompt: Prompt, token_ids: torch.Tensor, keep: int = 0, use_cache: bool = True):
        if not use_cache:  # a stateless verify: one forward on the dynamic path, nothing kept
            return super().prefill(prompt, token_ids, keep, use_cache=False)
        if prompt.features:
            raise InputError(f"model {self.name!r} is text-only but the prompt has {sorted(prompt.features)}")
        if not self.free:
            raise SpecdecError(f"the static KV cache of model {self.name!r} holds {self.slots} sessions, all open: "
                               "close one, or start the server with a higher --max-sessions")
        slot = self.free.pop()
        state = SlotState(slot, 0)
        state._free = weakref.finalize(state, self.free.append, slot)
        if token_ids.numel() == 0:
            return state, None
        return state, self._rows([state], [token_ids], [keep])[0]

    def forward(self, state, token_ids: torch.Tensor, keep: int | None = None) -> torch.Tensor | None:
        if not isinstance(state, SlotState):  # a stateless verify's cache-free state
            return super().forward(state, token_ids, keep)
        return self._rows([state], [token_ids], [kept_rows(token_ids, keep)])[0]

    def forward_batch(self, states: list, blocks: list[torch.Tensor], keeps: list[int]) -> list[torch.Tensor | None]:
        return self._rows(states, blocks, keeps)

    def _drop_past(self, state, length: int) -> None:
        if not isinstance(state, SlotState):  # a stateless verify's cache-free state
            super()._drop_past(state, length)
        # a slot's columns past the length are rewritten before any query reads them

    @torch.inference_mode()
    def forward_tree(self, state, token_ids: torch.Tensor, tree) -> torch.Tensor:
        """One session's unseen tokens at their columns and positions, then the tree's nodes at the columns past them
        in node order, each at position (the root's) + its depth, under the tree's mask: [1 + n, V]. Eager."""
        if not isinstance(state, SlotState):  # a stateless verify's cache-free state
            return super().forward_tree(state, token_ids, tree)
        self._check_tree(token_ids)
        unseen, n, past = token_ids.numel(), tree.size, state.length
        rows = unseen + n
        self._check_room([state], [rows])
        kv = self._cache()
        positions = tree_positions(past, unseen, tree, self.device)
        block = tree_visible(0, unseen, tree, rows).to(self.device, non_blocking=True)
        span = min(_bucket(past + rows, SPAN), self.max_positions + 1)
        columns = positions[:, :1] + torch.arange(rows, device=self.device)  # [1, rows] from the cache's length on
        mask = as_mask(tree_columns(positions[0, :1], block, span), self.model, kv.keys[0].dtype, self.device)
        slot = torch.tensor([state.slot], device=self.device)
        logits = slot_forward(self.model, self._cache_kwarg, kv, tree_ids(token_ids, tree, self.device), positions,
                              slot, span, TreeRows(columns, mask, n + 1))
        state.length, state.tree = past + unseen, True
        return logits[0].float()

    @torch.inference_mode()
    def commit_path(self, state, tree, path: list[int]) -> None:
        if not isinstance(state, SlotState):
            return super().commit_path(state, tree, path)
        if not state.tree:
            raise ValueError("commit_path follows forward_tree")
        if path:
            assert self.kv is not None  # forward_tree made it
            keep_path([cache[state.slot : state.slot + 1] for cache in self.kv.keys + self.kv.values], state.length, path)
        state.length += len(path)
        state.tree = False

    # --- internals ----------------------------------------------------------------------
    def _cache(self) -> SlotKV:
        """The shared cache (and its captured rows), made at the first forward."""
        if self.kv is None:
            self.kv = SlotKV(self.model.config, self.slots, self.max_positions, next(self.model.parameters()).dtype,
                             self.device)
            self.fast = (CapturedRows(self._eager, self.device, self.slots, self.max_positions) if self.steps == Steps.GRAPHS
                         else None)
        return self.kv

    def _check_room(self, states: list[SlotState], sizes: list[int]) -> None:
        for state, size in zip(states, sizes):
            if state.length + size > self.max_positions:
                raise SpecdecError(f"a session of model {self.name!r} needs {state.length + size} positions; "
                                   f"the static KV cache holds {self.max_positions}: open shorter sessions")

    @torch.inference_mode()
    def _rows(self, states: list[SlotState], blocks: list[torch.Tensor], keeps: list[int]) -> list[torch.Tensor | None]:
        """One forward of every state's block at its own positions; each row's last `keep` logits [keep, V] (float;
        None where keep is 0)."""
        self._cache()
        n = max(block.numel() for block in blocks)
        self._check_room(states, [block.numel() for block in blocks])
        fast = self.fast if n <= GRAPH_TOKENS else None  # captured graphs run blocks up to GRAPH_TOKENS long
        batch = _bucket(len(states)) if fast is not None else len(states)  # a graph per power of two of rows
        ids = torch.zeros(batch, n, dtype=torch.long)
        positions = torch.full((batch, n), self.max_positions, dtype=torch.long)  # padding: the scratch column
        slots = torch.full((batch,), self.slots, dtype=torch.long)  # padding rows: the scratch row
        for row, (state, block) in enumerate(zip(states, blocks)):
            ids[row, : block.numel()] = block.cpu()
            positions[row, : block.numel()] = torch.arange(state.length, state.length + block.numel())
            slots[row] = state.slot
        longest = max(state.length + block.numel() for state, block in zip(states, blocks))
        span = min(_bucket(longest, SPAN), self.max_positions + 1)
        ids, positions, slots = (t.to(self.device, non_blocking=True) for t in (ids, positions, slots))
        if fast is not None:
            logits = fast(ids, positions, slots, span)
        else:
            logits = self._eager(ids, positions, slots, span)
        out: list[torch.Tensor | None] = []
        for row, (state, block, keep) in enumerate(zip(states, blocks, keeps)):
            state.length += block.numel()
            state.tree = False  # a block after forward_tree without a commit: the nodes' columns are written over
            out.append(logits[row, block.numel() - keep : block.numel()].float() if keep else None)
        return out

    def _eager(self, ids: torch.Tensor, positions: torch.Tensor, rows: torch.Tensor, span: int) -> torch.Tensor:
        assert self.kv is not None, "_rows makes the cache before its first forward"
        return slot_forward(self.model, self._cache_kwarg, self.kv, ids, positions, rows, span)


def _bucket(n: int, smallest: int = 1) -> int:
    """The power of two (at least `smallest`) at or above n."""
    size = smallest
    while size < n:
        size *= 2
    return size


def server_cache(backend) -> str | None:
    """The KV cache a server's backend keeps, as `serve --kv-cache` names it (its `ready` says so): static (this
    module's, captured or eager), dynamic (transformers'), None for a runtime with a cache of its own."""
    if isinstance(backend, SlotCausalBackend):
        return "static"
    return "dynamic" if isinstance(backend, HFCausalBackend) else None


def causal_backend(model: PreTrainedModel, name: str = "", steps: str = "dynamic",
                   sessions: int | None = None) -> HFCausalBackend:
    """The backend of a causal LM for `steps` (specdec/backends/devices.py's steps_of): transformers'
    DynamicCache, static_cache.py's static cache, or a server's (`sessions` sequences at once) this module's."""
    if steps == Steps.DYNAMIC:
        return HFCausalBackend(model, name=name)
    if sessions is not None:
        if steps == Steps.COMPILED:
            raise ModelError("the server's static KV cache runs eagerly or as CUDA graphs, not under torch.compile: use "
                             "--kv-cache static")
        return SlotCausalBackend(model, name=name, steps=steps, slots=sessions)
    return StaticCausalBackend(model, name=name, steps=steps)
