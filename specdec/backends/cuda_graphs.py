"""CUDA graphs of a static-cache forward: the project's only CUDA-only code (tests: tests/test_cuda.py).

Eager transformers on a GPU is launch-bound: the host issues every kernel of a 1-token step one by one,
and a step of a 1.5B model took ~20 ms on an H100 whose memory reads its weights in ~1 ms (issue 44).
A graph replays the whole forward's kernels in one launch. As gpt-fast does: the forward runs on a static
cache (static_cache.py) whose tensors never move, reads its inputs from static buffers that each call
copies into before replaying, and writes its logits to a buffer that each call clones out of.

One graph per block length n, captured on first use (the engine's: 1 token and k + 1; the server's rows x
tokens x span in `CapturedRows`, over static_slots.py's cache of many sequences), all in one memory pool (they never run at
once, and every output is cloned before the next replay). Warm-up runs (a graph must not capture a first call's one-time work)
write the last n slots of the cache, past any live position, where a real block rewrites them before a
query can read them (static_cache.py's docstring).

What failed before and is avoided here: transformers' StaticCache advances a device-side counter on every
update, so warm-ups and replays walked it past the cache's end (`index_copy_(): index out of bounds`);
here positions are a buffer the caller fills. torch.compile's reduce-overhead mode reused an output
buffer the caller still held ("accessing tensor output of CUDAGraphs that has been overwritten"); here
every output is cloned.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from torch.cuda import _POOL_HANDLE  # what CUDAGraph.pool() returns and torch.cuda.graph(pool=...) takes

WARM_UPS = 2  # eager runs on a side stream before a capture (torch.cuda.graphs' own advice: >= 1, cuBLAS handles)


def captured(run: Callable[[], torch.Tensor], device: torch.device,
             pool: _POOL_HANDLE | None) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    """`run` (a forward over static buffers) warmed up on a side stream, then captured in `pool`: (graph, its output
    buffer). The graph's pool is `graph.pool()`, for the next capture to share."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(WARM_UPS):
            run()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        output = run()
    return graph, output


class CapturedSteps:
    """`forward(ids [B, n], positions [B, n]) -> logits [B, n, V]` replayed as one CUDA graph per (B, n)."""

    def __init__(self, forward: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], device: torch.device,
                 capacity: int) -> None:
        self.forward, self.device, self.capacity = forward, torch.device(device), capacity
        self.graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        self.pool: _POOL_HANDLE | None = None  # the graphs' shared memory pool, from the first capture on

    def __call__(self, ids: torch.Tensor, start: int) -> torch.Tensor:
        """The logits [B, n, V] of ids [B, n] (on the device) at positions start .. start+n-1: this call's own copy."""
        batch, n = ids.shape
        if (batch, n) not in self.graphs:
            with torch.cuda.device(self.device):  # cuda:N: its streams, not the current device's
                self.graphs[(batch, n)] = self.capture(batch, n)
        graph, static_ids, static_positions, static_logits = self.graphs[(batch, n)]
        static_ids.copy_(ids, non_blocking=True)
        static_positions.copy_(torch.arange(start, start + n, device=self.device).expand(batch, n), non_blocking=True)
        graph.replay()
        return static_logits.clone()

    def capture(self, batch: int, n: int):
        """(graph, its ids, positions and logits buffers) for blocks of [batch, n]."""
        static_ids = torch.zeros(batch, n, dtype=torch.long, device=self.device)
        # The cache's last n slots: past every live position while the cache has room (static_cache.py grows it).
        scratch = torch.arange(self.capacity - n, self.capacity, device=self.device)
        static_positions = scratch.expand(batch, n).contiguous()
        graph, static_logits = captured(lambda: self.forward(static_ids, static_positions), self.device, self.pool)
        self.pool = graph.pool()
        return graph, static_ids, static_positions, static_logits


class CapturedRows:
    """`forward(ids [B, n], positions [B, n], rows [B], span) -> logits [B, n, V]` (static_slots.py: each row its
    own slot and positions) replayed as one CUDA graph per (B, n, span). Warm-ups and the capture write the
    scratch row at the scratch column, which no session reads."""

    def __init__(self, forward: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int], torch.Tensor],
                 device: torch.device, scratch_row: int, scratch_column: int) -> None:
        self.forward, self.device = forward, torch.device(device)
        self.scratch_row, self.scratch_column = scratch_row, scratch_column
        self.graphs: dict[tuple[int, int, int], tuple] = {}
        self.pool: _POOL_HANDLE | None = None  # the graphs' shared memory pool, from the first capture on

    def __call__(self, ids: torch.Tensor, positions: torch.Tensor, rows: torch.Tensor, span: int) -> torch.Tensor:
        """The logits [B, n, V] of the block: this call's own copy (ids, positions, rows on the device)."""
        key = (*ids.shape, span)
        if key not in self.graphs:
            with torch.cuda.device(self.device):
                self.graphs[key] = self.capture(ids, positions, rows, span)
        graph, static_ids, static_positions, static_rows, static_logits = self.graphs[key]
        static_ids.copy_(ids, non_blocking=True)
        static_positions.copy_(positions, non_blocking=True)
        static_rows.copy_(rows, non_blocking=True)
        graph.replay()
        return static_logits.clone()

    def capture(self, ids: torch.Tensor, positions: torch.Tensor, rows: torch.Tensor, span: int):
        """(graph, its ids, positions, rows and logits buffers) for blocks shaped like `ids`; the buffers start as
        padding (the scratch row and column)."""
        static_ids = torch.zeros_like(ids)
        static_positions = torch.full_like(positions, self.scratch_column)
        static_rows = torch.full_like(rows, self.scratch_row)
        graph, static_logits = captured(lambda: self.forward(static_ids, static_positions, static_rows, span),
                                        self.device, self.pool)
        self.pool = graph.pool()
        return graph, static_ids, static_positions, static_rows, static_logits


class CapturedTrees:
    """`forward(ids [1, m], positions [1, m], block [m, m]) -> logits [1, m, V]` (a token tree's rows on
    static_cache.py's cache: `tree_forward`, which makes its slots and mask on the device) replayed as one CUDA graph
    per m. The capture runs on the first call's own inputs: its warm-ups write the slots that call writes, with the
    values it writes (they read only slots before them and the call's own rows), so they leave the cache as the call
    itself does."""

    def __init__(self, forward: Callable[..., torch.Tensor], device: torch.device) -> None:
        self.forward, self.device = forward, torch.device(device)
        self.graphs: dict[int, tuple] = {}
        self.pool: _POOL_HANDLE | None = None

    def __call__(self, ids: torch.Tensor, positions: torch.Tensor, block: torch.Tensor) -> torch.Tensor:
        """The logits [1, m, V] of the tree's rows (inputs on the device): this call's own copy."""
        m = ids.shape[1]
        if m not in self.graphs:
            with torch.cuda.device(self.device):
                self.graphs[m] = self.capture(ids, positions, block)
        graph, buffers, static_logits = self.graphs[m]
        for buffer, value in zip(buffers, (ids, positions, block)):
            buffer.copy_(value, non_blocking=True)
        graph.replay()
        return static_logits.clone()

    def capture(self, ids: torch.Tensor, positions: torch.Tensor, block: torch.Tensor):
        buffers = tuple(t.clone() for t in (ids, positions, block))
        graph, static_logits = captured(lambda: self.forward(*buffers), self.device, self.pool)
        self.pool = graph.pool()
        return graph, buffers, static_logits
