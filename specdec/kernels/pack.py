"""Weights packed once, at load, in the layouts every kernel path streams (csrc/kernels.h states them).

    int8(W)            symmetric per output column: s = max|W[n]| / 127, q = round(W / s) in [-127, 127],
                       stored q + 128 as [N/16][K/4][16][4] bytes
    int4(W, group)     symmetric per 16 columns x `group` k, Q4_0's rule (the value of largest magnitude maps to
                       -8: s = that value / -8, q = round(W / s) clamped to [-8, 7]), s kept in fp16 and q
                       computed with the fp16 s; stored q + 8 as nibbles [N/16][K/8][16][4] (low: k = 8c + t,
                       high: k = 8c + 4 + t), scales [N/16][K/group][16]

W is [N, K] float (any float dtype; packed from float32). N is padded to 16 and K to 4 (int8) or to the group
(int4) with zero weights, which the kernels multiply by zero activations.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

COLS = 16  # csrc/kernels.h's COLS
INT4_GROUP = 32  # llama.cpp's Q4_0 block: fp16 scale per 32 weights


@dataclass(frozen=True)
class PackedLinear:
    """One Linear's packed weight: `kind` int8 or int4, `weight` uint8 bytes, `scale` float32 [N] (int8) or
    fp16 groups (int4), `bias` float32 [N] or None, and the logical [N, K]."""

    kind: str
    weight: torch.Tensor
    scale: torch.Tensor
    bias: torch.Tensor | None
    out_features: int
    in_features: int
    group: int = 0

    @property
    def nbytes(self) -> int:
        """Bytes a forward streams for this Linear (weights and scales)."""
        return self.weight.numel() + self.scale.numel() * self.scale.element_size()


SLAB = 256  # output rows packed at a time (a multiple of COLS): a slab's temporaries stay in cache, not in memory


def _slabs(weight: torch.Tensor, k_multiple: int):
    """(first padded row, the slab as float32 [SLAB or fewer, K padded]) over `weight`'s rows, zero-padded to a
    multiple of COLS rows and `k_multiple` columns: every row is packed on its own, so a slab's rows give the bytes the
    whole matrix would (packing the 1.5B in one pass of whole-matrix temporaries took 21 s of its 26 s load; in
    slabs, 2026-12-01)."""
    n, k = weight.shape
    rows, cols = _padded_shape(weight, k_multiple)
    for start in range(0, rows, SLAB):
        stop = min(start + SLAB, rows)
        slab = torch.zeros(stop - start, cols, dtype=torch.float32)
        if start < n:
            slab[: min(stop, n) - start, :k] = weight[start : min(stop, n)].float()
        yield start, slab


def _padded_shape(weight: torch.Tensor, k_multiple: int) -> tuple[int, int]:
    n, k = weight.shape
    return -(-n // COLS) * COLS, -(-k // k_multiple) * k_multiple


def int8(weight: torch.Tensor, bias: torch.Tensor | None = None) -> PackedLinear:
    n, k = weight.shape
    rows, cols = _padded_shape(weight, 4)
    blocks = torch.empty(rows // COLS, cols // 4, COLS, 4, dtype=torch.uint8)
    scale = torch.empty(rows, dtype=torch.float32)
    for start, w in _slabs(weight, 4):
        s = (w.abs().amax(dim=1) / 127).clamp(min=torch.finfo(torch.float32).tiny)  # [slab]
        q = torch.round(w / s[:, None]).clamp(-127, 127).to(torch.int16) + 128  # in 1..255
        blocks[start // COLS : (start + w.shape[0]) // COLS] = q.to(torch.uint8).view(-1, COLS, cols // 4, 4).permute(0, 2, 1, 3)
        scale[start : start + w.shape[0]] = s
    return PackedLinear("int8", blocks.view(-1), scale[:n].contiguous(), _bias(bias), n, k)


def int4(weight: torch.Tensor, bias: torch.Tensor | None = None, group: int = INT4_GROUP) -> PackedLinear:
    if group % 8:
        raise ValueError(f"an int4 group holds a multiple of 8 weights, got {group}")
    n, k = weight.shape
    rows, cols = _padded_shape(weight, group)
    nibbles = torch.empty(rows // COLS, cols // 8, COLS, 4, dtype=torch.uint8)
    scales = torch.empty(rows // COLS, cols // group, COLS, dtype=torch.float16)
    for start, w in _slabs(weight, group):
        grouped = w.view(w.shape[0], cols // group, group)
        extreme = grouped.gather(2, grouped.abs().argmax(dim=2, keepdim=True)).squeeze(2)  # [slab, G] signed
        scale = (extreme / -8).to(torch.float16)
        exact = scale.float()
        safe = torch.where(exact == 0, torch.ones_like(exact), exact)
        q = torch.round(grouped / safe[..., None]).clamp(-8, 7).to(torch.int16) + 8  # [slab, G, group] in 0..15
        q = torch.where(exact[..., None] == 0, torch.full_like(q, 8), q).view(w.shape[0], cols).to(torch.uint8)
        halves = q.view(-1, COLS, cols // 8, 2, 4)  # k = 8c + 4 half + t
        blocks = slice(start // COLS, (start + w.shape[0]) // COLS)
        nibbles[blocks] = (halves[:, :, :, 0] | (halves[:, :, :, 1] << 4)).permute(0, 2, 1, 3)  # [N/16, K/8, 16, 4]
        scales[blocks] = scale.view(-1, COLS, cols // group).permute(0, 2, 1)  # [N/16, K/group, 16]
    return PackedLinear("int4", nibbles.view(-1), scales.view(-1), _bias(bias), n, k, group)


def rows(packed: PackedLinear, ids: torch.Tensor) -> PackedLinear:
    """An int8 Linear of the output rows `ids` (sorted unique longs, in range) only, in the same layout. Whole blocks
    of 16 from row 0 (a leading run 0, 1, ..., a drafter's frequent ids) are copied as they lie; the other rows are
    gathered 16 to a block (the last padded by repeating its last id: columns past out_features). Every output is
    its row's in `packed`, bit for bit: an output column is its own exact dot product and scale."""
    if packed.kind != "int8":
        raise ValueError(f"rows are gathered from an int8 Linear, got {packed.kind}")
    m, cols = ids.numel(), -(-packed.in_features // 4) * 4
    blocks = packed.weight.view(-1, cols // 4, COLS, 4)
    run = int((ids == torch.arange(m)).to(torch.int64).cumprod(0).sum()) // COLS * COLS
    rest = ids[run:]
    parts = [blocks[: run // COLS].reshape(-1)]
    if rest.numel():
        padded = torch.cat([rest, rest[-1:].expand(-(-rest.numel() // COLS) * COLS - rest.numel())])
        gathered = blocks[padded // COLS, :, padded % COLS, :]  # [rows, K/4, 4]: the indexed dimension comes first
        parts.append(gathered.view(-1, COLS, cols // 4, 4).permute(0, 2, 1, 3).reshape(-1))
    bias = None if packed.bias is None else packed.bias[ids].contiguous()
    return PackedLinear("int8", torch.cat(parts), packed.scale[ids].contiguous(), bias, m, packed.in_features)


def dequantized(packed: PackedLinear) -> torch.Tensor:
    """The float32 [N, K] weight the kernels compute with (for tests and drift reports)."""
    n, k = packed.out_features, packed.in_features
    if packed.kind == "int8":
        cols = -(-k // 4) * 4
        q = packed.weight.view(-1, cols // 4, COLS, 4).permute(0, 2, 1, 3).reshape(-1, cols).to(torch.int16) - 128
        return (q[:n, :k].float() * packed.scale[:, None])
    cols, group = -(-k // packed.group) * packed.group, packed.group
    nibbles = packed.weight.view(-1, cols // 8, COLS, 4).permute(0, 2, 1, 3)  # [N/16, 16, K/8, 4]
    q = torch.stack([nibbles & 0x0F, nibbles >> 4], dim=3).reshape(-1, cols).to(torch.int16) - 8  # [Np, Kp]
    scale = packed.scale.view(-1, cols // group, COLS).permute(0, 2, 1).reshape(-1, cols // group).float()
    return (q.float().view(q.shape[0], -1, group) * scale[..., None]).view(q.shape[0], cols)[:n, :k]


def _bias(bias: torch.Tensor | None) -> torch.Tensor | None:
    return None if bias is None else bias.detach().float().contiguous().clone()
