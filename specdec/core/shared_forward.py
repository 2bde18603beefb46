"""The blocks of several sessions verified in shared forwards: what lets one cloud serve many edges.

At small batch a forward is memory-bound (the weights are read once per forward, whatever the
rows), so B blocks cost far less than B forwards until the matmuls turn compute-bound. Each row
keeps its own KV cache; `HFCausalBackend.forward_batch` pads them into one forward and gives each
row back exactly its own positions, so a row's verdict is the one it gets alone (fp32: equal up to
rounding; tested token for token against the unbatched server and in process).

Padding costs compute: every row of a forward is as long as its longest block. A session's first
call carries its whole prompt (tens to hundreds of tokens) while a steady-state verify carries
k + 1, so rows are grouped by block length (`length_groups`) and each group is one forward.

    logits, forwards = batch_logits(backend, [BatchRow(verifier, seq, draft_tokens, draft_probs), ...])

Only the forwards happen here: each row's logits go back to its owner, which decides (constraints,
policy) and crops (`specdec.remote.server_session.ServerSession.conclude`).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec.backends.base import Backend
from specdec.backends.devices import clock
from specdec.core.session import AcceptedSequence
from specdec.core.tree import TokenTree
from specdec.core.verifier import CachedVerifier, StatelessVerifier
from specdec.errors import SpecdecError

GROUP_SLACK_TOKENS = 8  # rows whose blocks differ by at most this many tokens (or 2x) share a forward


@dataclass
class BatchRow:
    """One session's block in a batch."""

    verifier: CachedVerifier | StatelessVerifier  # the session's cloud-logits forward
    seq: AcceptedSequence
    draft_tokens: torch.Tensor  # [n], n >= 0 (0: a plain next-token step, as in cloud-only serving)
    draft_probs: torch.Tensor | None = None
    tree: TokenTree | None = None  # draft_tokens are this tree's nodes: verified in a forward of its own


class RowFailed(SpecdecError):
    """One row's verdict could not be decided (its distribution is not finite, its policy raised):
    that row fails alone, with its own reason; the rows beside it in the forward are unaffected."""


@dataclass(frozen=True)
class Forward:
    """One model forward of a batch: which rows, how many token ids it fed, when and how long."""

    rows: tuple[int, ...]
    tokens: int
    max_block: int
    start: float  # time.perf_counter()
    seconds: float


def shares_forwards(backend: Backend) -> bool:
    return backend.batchable


def length_groups(lengths: dict[int, int]) -> list[list[int]]:
    """Row indices grouped so that padding stays small: sorted by block length, a new group starts
    where a block is more than twice and more than GROUP_SLACK_TOKENS longer than the group's shortest."""
    groups: list[list[int]] = []
    shortest = 0
    for i in sorted(lengths, key=lengths.__getitem__):
        n = lengths[i]
        if groups and (n <= 2 * shortest or n - shortest <= GROUP_SLACK_TOKENS):
            groups[-1].append(i)
        else:
            groups.append([i])
            shortest = n
    return groups


@torch.inference_mode()  # thread-local: the server calls this on its compute thread
def batch_logits(backend: Backend, rows: list[BatchRow]) -> tuple[list[torch.Tensor], list[Forward]]:
    """Every row's cloud logits [n+1, V], and the forwards that computed them. Rows that cannot
    share a forward (a backend without `forward_batch`, a first call carrying audio) run alone.

    Without inference mode every forward would record an autograd graph, and each cached key
    would keep its forward's activations alive for the session's life: a server carrying 16
    sessions grew past 24 GB."""
    logits: list[torch.Tensor | None] = [None] * len(rows)
    forwards: list[Forward] = []
    plans = {}
    if len(rows) > 1 and shares_forwards(backend):
        plans = {i: plan for i, row in enumerate(rows)
                 if row.tree is None and (plan := row.verifier.block(row.seq, row.draft_tokens)) is not None}
    device = backend.device  # a CUDA forward is timed after its queue drains
    for group in length_groups({i: plan[1].numel() for i, plan in plans.items()}):
        start = clock(device)
        states, blocks, keeps = zip(*(plans[i] for i in group))
        if len(group) == 1:
            outputs = [backend.forward(states[0], blocks[0], keeps[0])]
        else:
            outputs = backend.forward_batch(list(states), list(blocks), list(keeps))
        for i, row_logits in zip(group, outputs):
            logits[i] = row_logits
        forwards.append(Forward(tuple(group), sum(b.numel() for b in blocks), max(b.numel() for b in blocks), start,
                                clock(device) - start))
    computed: list[torch.Tensor] = []
    for i, row in enumerate(rows):
        row_logits = logits[i]
        if row_logits is None:
            start = clock(device)
            if row.tree is not None:  # the session checked it verifies trees (a cached verifier)
                assert isinstance(row.verifier, CachedVerifier)
                row_logits = row.verifier.tree_logits(row.seq, row.tree)
            else:
                row_logits = row.verifier.logits(row.seq, row.draft_tokens)
            fed = row.verifier.last_tokens_in
            forwards.append(Forward((i,), fed, fed, start, clock(device) - start))
        computed.append(row_logits)
    return computed, forwards
