"""The tensors a message carries as bytes (safetensors): an `open`'s audio features and a verify's
draft distributions, dense [n, V] or, when the edge drafts from a top-N truncated distribution, its
top-N rows as (index, value). What arrives is checked before any of it is used: shapes, dtypes,
indices in range, rows that are distributions."""
from __future__ import annotations

from typing import Any

import torch
from safetensors.torch import load as load_tensors
from safetensors.torch import save as save_tensors

from specdec.remote.protocol import ProtocolError


def pack_tensors(tensors: dict[str, torch.Tensor]) -> bytes:
    return save_tensors({name: t.contiguous() for name, t in tensors.items()})


def unpack_tensors(data: Any, what: str) -> dict[str, torch.Tensor]:
    if not isinstance(data, bytes):
        raise ProtocolError(f"{what} must be bytes (safetensors)")
    try:
        return load_tensors(data)
    except Exception as e:  # safetensors raises its own error types on malformed input
        raise ProtocolError(f"{what}: malformed tensors ({type(e).__name__})") from None


def pack_probs(draft_probs: torch.Tensor, topn: int | None) -> bytes:
    """[n, V] draft distributions. With top-N drafting each row has at most N non-zeros: send those."""
    if topn:
        values, index = draft_probs.topk(topn, dim=-1)
        return pack_tensors({"index": index.to(torch.int32), "value": values.float()})
    return pack_tensors({"probs": draft_probs.float()})


def unpack_probs(data: Any, n: int, vocab: int) -> torch.Tensor:
    tensors = unpack_tensors(data, "probs")
    if "probs" in tensors:
        probs = tensors["probs"]
        if probs.dtype != torch.float32 or probs.shape != (n, vocab):
            raise ProtocolError(f"probs must be float32 [{n}, {vocab}], got {probs.dtype} {list(probs.shape)}")
        return checked_distributions(probs)
    index, value = tensors.get("index"), tensors.get("value")
    if index is None or value is None or index.shape != value.shape or index.ndim != 2 or index.shape[0] != n:
        raise ProtocolError(f"top-N probs must be `index` and `value` of one shape [{n}, N]")
    if index.dtype != torch.int32 or value.dtype != torch.float32 or bool((index < 0).any() | (index >= vocab).any()):
        raise ProtocolError(f"top-N probs: int32 indices in [0, {vocab}) and float32 values expected")
    return checked_distributions(torch.zeros(n, vocab).scatter_(-1, index.long(), value))


def checked_distributions(probs: torch.Tensor) -> torch.Tensor:
    """[n, V] rows that are distributions: finite, >= 0, each summing to a positive total (the
    policy divides by them and draws from them)."""
    if not bool(torch.isfinite(probs).all()) or bool((probs < 0).any()) or bool((probs.sum(-1) <= 0).any()):
        raise ProtocolError("probs must be finite, non-negative rows with a positive sum")
    return probs
