"""KV buffers that grow: the positions a growable buffer takes, and a copy of one with more room (numpy or torch)."""
from __future__ import annotations

import numpy as np
import torch


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
