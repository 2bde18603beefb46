"""The blocks of several sessions verified in one forward: what lets one cloud serve many edges.

At small batch a forward is memory-bound (the weights are read once per forward, whatever the
rows), so B blocks cost far less than B forwards until the matmuls turn compute-bound. Each row
keeps its own KV cache; `HFCausalBackend.forward_batch` pads them into one forward and gives each
row back exactly its own positions, so a row's verdict is the one it gets alone (fp32: equal up to
rounding; tested token for token against the unbatched server and in process).

    verdicts, forward_s = verify_rows(backend, [Row(verifier, seq, draft_tokens, draft_probs), ...])
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from specdec.backends.base import Backend
from specdec.cloud import LocalVerifier, Verdict
from specdec.session import AcceptedSequence


@dataclass
class Row:
    """One session's block in a batch."""

    verifier: LocalVerifier
    seq: AcceptedSequence
    draft_tokens: torch.Tensor  # [n], n >= 0 (0: a plain next-token step, as in cloud-only serving)
    draft_probs: torch.Tensor | None = None


def shares_forwards(backend: Backend) -> bool:
    return bool(getattr(backend, "batchable", False))


def verify_rows(backend: Backend, rows: list[Row]) -> tuple[list[Verdict], float]:
    """Verdicts for every row, and the seconds spent in model forwards. Rows that cannot share a
    forward (a backend without `forward_batch`, a first call carrying audio) run alone."""
    start = time.perf_counter()
    logits: list[torch.Tensor | None] = [None] * len(rows)
    if len(rows) > 1 and shares_forwards(backend):
        plans = {i: row.verifier.logits_of.block(row.seq, row.draft_tokens) for i, row in enumerate(rows)}
        shared = [i for i, plan in plans.items() if plan is not None]
        if len(shared) == 1:
            state, tokens, keep = plans[shared[0]]
            logits[shared[0]] = backend.forward(state, tokens, keep)
        elif shared:
            states, blocks, keeps = zip(*(plans[i] for i in shared))
            for i, row_logits in zip(shared, backend.forward_batch(list(states), list(blocks), list(keeps))):
                logits[i] = row_logits
    for i, row in enumerate(rows):
        if logits[i] is None:
            logits[i] = row.verifier.logits_of.logits(row.seq, row.draft_tokens)
    forward_s = time.perf_counter() - start
    verdicts = [row.verifier.decide(row.seq, row.draft_tokens, row.draft_probs, row_logits)
                for row, row_logits in zip(rows, logits)]
    return verdicts, forward_s
