"""Backend for any Hugging Face causal LM (Llama, Qwen2, Gemma3, ...).

KV state is a `DynamicCache`; every forward passes explicit `position_ids = length + arange(n)`
and no attention mask (batch 1, no padding), so positions can never drift (a 1×1 mask per step once
shifted them and filled outputs with punctuation).

The model may sit on any device (specdec/backends/devices.py): token ids arrive on the host and are copied there,
positions are made there, and logits are returned there (the loop reads one verdict per cycle from them).
A preallocated static cache with exact crops, and captured CUDA graphs over it, are static_cache.py.

Token trees (specdec/core/tree.py) go through one forward with a 4-D mask: the unseen accepted tokens as a chain, then
each node at position (the root's) + its depth, seeing the cache, the unseen tokens and its own ancestors only
(`tree_positions`, `tree_visible`). Its nodes' keys and values are set aside and the cache cut back to the unseen
tokens; `commit_path` appends the accepted path's. A node's row is the step after its path by the chain's rule here:
equal within rounding in fp32 (the chain's 1e-5), and bit for bit under torch-int8t's row-wise attention, which
reads each query's keys off the mask (tests/test_torch_trees.py).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import cast

import torch
from transformers import DynamicCache, PreTrainedModel
from transformers.cache_utils import DynamicLayer

from specdec.backends.base import Backend
from specdec.backends.hf_util import cache_kwarg, takes_tree_mask
from specdec.backends.prompt import Prompt
from specdec.errors import InputError


@dataclass
class CausalState:
    cache: DynamicCache | None  # None: prefill(use_cache=False), one forward that keeps nothing
    length: int  # token positions held in `cache`
    tree_kv: list[tuple[torch.Tensor, torch.Tensor]] | None = None  # forward_tree's nodes' keys, values per layer

    def kept(self) -> DynamicCache:
        """The cache, where the state keeps one: a state built with use_cache=False serves its one forward and is
        never fed again, cropped or batched."""
        assert self.cache is not None, "a state built with use_cache=False keeps no cache"
        return self.cache


def block_positions(start: int, n: int, device: torch.device | str | None = None) -> torch.Tensor:
    """[1, n] positions start .. start+n-1 (cache length + offset)."""
    return torch.arange(start, start + n, dtype=torch.long, device=device).unsqueeze(0)


def tree_positions(past: int, unseen: int, tree, device: torch.device | str | None = None) -> torch.Tensor:
    """[1, unseen + nodes]: the unseen tokens at past .. past+unseen-1, then each node at the root's position (the
    last unseen token's) + its depth: where the token would sit in a chain down its path."""
    root = past + unseen - 1
    depths = torch.tensor(tree.depths, dtype=torch.long)
    return torch.cat([torch.arange(past, past + unseen), root + depths]).unsqueeze(0).to(device)


def tree_ids(token_ids: torch.Tensor, tree, device: torch.device | str | None = None) -> torch.Tensor:
    """[1, unseen + nodes]: the unseen tokens, then the tree's nodes in node order (the rows of its forward)."""
    return torch.cat([token_ids.reshape(-1).cpu(), tree.tokens]).unsqueeze(0).to(device, non_blocking=True)


def tree_visible(past: int, unseen: int, tree, slots: int) -> torch.Tensor:
    """[unseen + nodes, slots] bool, True where a query attends: the keys sit at slots 0 .. past-1 (the cache), then
    the unseen tokens', then the nodes' in node order. An unseen token sees the cache and the unseen tokens up to
    itself; a node sees the cache, every unseen token, its ancestors and itself."""
    rows, nodes = unseen + tree.size, past + unseen
    visible = torch.zeros(rows, slots, dtype=torch.bool)
    visible[:unseen, :nodes] = torch.ones(unseen, nodes, dtype=torch.bool).tril(past)
    visible[unseen:, :nodes] = True
    visible[unseen:, nodes : nodes + tree.size] = tree.ancestry
    return visible


def as_mask(visible: torch.Tensor, model: PreTrainedModel, dtype: torch.dtype, device) -> torch.Tensor:
    """[q, slots] visibility -> the [1, 1, q, slots] mask the model's attention reads: bool for specbench's row-wise
    attention (it reads each query's keys off it), additive (0, or the dtype's min) for SDPA and eager attention."""
    if getattr(model.config, "_attn_implementation", "") == "specbench_rowwise":
        return visible[None, None].to(device)
    additive = torch.zeros(visible.shape, dtype=dtype, device=visible.device).masked_fill_(~visible, torch.finfo(dtype).min)
    return additive[None, None].to(device)


class HFCausalBackend(Backend):
    """Wraps a loaded `*ForCausalLM`; build with `load_backend` or directly from a model."""

    accepts_audio = False

    def __init__(self, model: PreTrainedModel, name: str = "") -> None:
        self.model = model.eval()
        self.name = name or model.config.name_or_path or type(model).__name__
        weight = model.get_output_embeddings().weight
        self.vocab_size = (weight() if callable(weight) else weight).shape[0]  # a dynamic int8 head's is a method
        self._cache_kwarg = cache_kwarg(model.forward)
        self.device: torch.device = next(model.parameters(), torch.empty(0)).device  # where weights, caches, logits live
        self.accepts_trees = takes_tree_mask(model)  # a 4-D mask replaces its causal one (module docstring)

    # --- protocol -----------------------------------------------------------------------
    def prefill(self, prompt: Prompt, token_ids: torch.Tensor, keep: int = 0, use_cache: bool = True):
        if prompt.features:
            raise InputError(
                f"model {self.name!r} is text-only but the prompt has {sorted(prompt.features)}: "
                "use an audio-capable model (e.g. a Qwen2.5-Omni thinker) or drop the audio"
            )
        state = CausalState(self._new_cache() if use_cache else None, 0)
        if token_ids.numel() == 0:
            return state, None
        logits = self._run(state, token_ids, keep)
        return state, logits


    @functools.cached_property
    def batchable(self) -> bool:
        """Rows of several states can share one forward only when every cache layer is a plain
        growing one (a sliding-window layer's rollback history is kept per cache)."""
        return all(type(layer).__name__ == "DynamicLayer" for layer in self._new_cache().layers)

    def forward_batch(self, states: list[CausalState], blocks: list[torch.Tensor],
                      keeps: list[int]) -> list[torch.Tensor | None]:
        """Feed blocks [n_b] on states of lengths L_b in ONE forward; returns each row's last `keep`
        logits [keep_b, V], as `forward` would, and appends each row's new keys/values to its own cache.

        Layout: past keys left-padded to max L, blocks right-padded to max n, a [B, maxL + maxn]
        key mask, and positions L_b + arange(max n) per row. A real query of row b attends to its own
        past and block prefix only (padding keys are masked; padding queries come after every real
        one, so no real query sees them), so each row is its single forward up to rounding."""
        batch, past_len, block_len = len(states), max(s.length for s in states), max(b.numel() for b in blocks)
        ids = torch.zeros(batch, block_len, dtype=torch.long)
        mask = torch.zeros(batch, past_len + block_len, dtype=torch.long)
        for row, (state, block) in enumerate(zip(states, blocks)):
            ids[row, : block.numel()] = block.cpu()
            mask[row, past_len - state.length : past_len + block.numel()] = 1
        positions = torch.stack([block_positions(s.length, block_len)[0] for s in states])  # [B, max n]
        ids, mask, positions = (t.to(self.device, non_blocking=True) for t in (ids, mask, positions))
        cache = DynamicCache(config=self.model.config)
        if past_len:
            template = next(s.kept() for s in states if s.length)  # shapes and dtype of a filled cache
            for index in range(len(cache.layers)):
                like = layer_kv(template, index)[0]
                keys, values = zip(*[_left_padded(s, index, past_len, like) for s in states])
                cache.update(torch.cat(keys), torch.cat(values), index)
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, **{self._cache_kwarg: cache},
                         use_cache=True, logits_to_keep=block_len)
        logits: list[torch.Tensor | None] = []
        for row, (state, block, keep) in enumerate(zip(states, blocks, keeps)):
            n = block.numel()
            for index in range(len(cache.layers)):  # this row's new keys/values into its own cache
                new = slice(past_len, past_len + n)
                batch_keys, batch_values = layer_kv(cache, index)
                state.kept().update(batch_keys[row : row + 1, :, new], batch_values[row : row + 1, :, new], index)
            state.length += n
            logits.append(out.logits[row, n - keep : n].float())  # [keep, V]
        return logits

    def forward_tree(self, state: CausalState, token_ids: torch.Tensor, tree) -> torch.Tensor:
        """One forward of the unseen tokens and the tree's nodes under a 4-D mask (module docstring): [1 + n, V]."""
        self._check_tree(token_ids)
        unseen, n, past = token_ids.numel(), tree.size, state.length
        ids = tree_ids(token_ids, tree, self.device)
        mask = as_mask(tree_visible(past, unseen, tree, past + unseen + n), self.model, self._dtype, self.device)
        out = self.model(input_ids=ids, position_ids=tree_positions(past, unseen, tree, self.device),
                         attention_mask=mask, **{self._cache_kwarg: state.cache}, use_cache=True, logits_to_keep=n + 1)
        cache = state.kept()
        state.tree_kv = [(keys[:, :, past + unseen :], values[:, :, past + unseen :])
                         for keys, values in (layer_kv(cache, index) for index in range(len(cache.layers)))]
        if n:
            cache.crop(-n)  # the nodes leave the cache; commit_path brings the accepted path's back
        state.length = past + unseen
        return out.logits[0].float()

    def commit_path(self, state: CausalState, tree, path: list[int]) -> None:
        if state.tree_kv is None:
            raise ValueError("commit_path follows forward_tree")
        if path:
            rows = torch.tensor(path, device=self.device)
            for index, (keys, values) in enumerate(state.tree_kv):
                state.kept().update(keys[:, :, rows], values[:, :, rows], index)
        state.length += len(path)
        state.tree_kv = None

    def _check_tree(self, token_ids: torch.Tensor) -> None:
        if not self.accepts_trees:
            raise NotImplementedError(f"{type(self).__name__} ({self.name}) verifies chains only (accepts_trees is False)")
        if token_ids.numel() < 1:
            raise InputError("a tree is verified after at least one token (the last accepted)")

    @functools.cached_property
    def _dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    def _drop_past(self, state: CausalState, length: int) -> None:
        # crop() takes minus the number of tokens to drop; crop(0) also trims sliding layers.
        state.kept().crop(length - state.length)

    # --- internals ----------------------------------------------------------------------
    def _new_cache(self) -> DynamicCache:
        cache = DynamicCache(config=self.model.config)
        # Sliding-window layers (Gemma3) must keep past states until crop() to allow rollback.
        cache.activate_past_recording()
        return cache

    def _run(self, state: CausalState, token_ids: torch.Tensor, keep: int) -> torch.Tensor | None:
        n = token_ids.numel()
        out = self.model(
            input_ids=token_ids.to(self.device, non_blocking=True).view(1, n),
            position_ids=block_positions(state.length, n, self.device),
            **{self._cache_kwarg: state.cache},
            use_cache=state.cache is not None,
            logits_to_keep=keep,
        )
        state.length += n
        if keep == 0:
            return None
        return out.logits[0, -keep:].float()  # [keep, V]


def _left_padded(state: CausalState, index: int, past_len: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Layer `index` of a state's cache, left-padded with zeros to `past_len` positions [1, H, past_len, D]."""
    if state.length == 0:  # nothing cached yet: a session's first verify carries its whole prompt
        empty = like.new_zeros(1, like.shape[1], past_len, like.shape[3])
        return empty, empty
    (keys, values), pad = layer_kv(state.kept(), index), past_len - state.length
    return torch.nn.functional.pad(keys, (0, 0, pad, 0)), torch.nn.functional.pad(values, (0, 0, pad, 0))


def layer_kv(cache: DynamicCache, index: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Layer `index`'s keys and values [B, H, L, D] in a cache forward_batch reads: every layer a filled DynamicLayer
    (`batchable` checks the kind; a layer read here holds positions)."""
    layer = cast(DynamicLayer, cache.layers[index])  # transformers types a layer as any kind, some keyless
    assert layer.keys is not None and layer.values is not None, "an empty cache layer"
    return layer.keys, layer.values
