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


def _padded(weight: torch.Tensor, k_multiple: int) -> torch.Tensor:
    n, k = weight.shape
    rows, cols = -(-n // COLS) * COLS, -(-k // k_multiple) * k_multiple
    out = torch.zeros(rows, cols, dtype=torch.float32)
    out[:n, :k] = weight.float()
    return out


def int8(weight: torch.Tensor, bias: torch.Tensor | None = None) -> PackedLinear:
    n, k = weight.shape
    w = _padded(weight, 4)
    scale = (w.abs().amax(dim=1) / 127).clamp(min=torch.finfo(torch.float32).tiny)  # [Np]
    q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int16) + 128  # [Np, Kp] in 1..255
    blocks = q.to(torch.uint8).view(w.shape[0] // COLS, COLS, w.shape[1] // 4, 4).permute(0, 2, 1, 3).contiguous()
    return PackedLinear("int8", blocks.view(-1), scale[:n].contiguous(), _bias(bias), n, k)


def int4(weight: torch.Tensor, bias: torch.Tensor | None = None, group: int = INT4_GROUP) -> PackedLinear:
    if group % 8:
        raise ValueError(f"an int4 group holds a multiple of 8 weights, got {group}")
    n, k = weight.shape
    w = _padded(weight, group)
    rows, cols = w.shape
    grouped = w.view(rows, cols // group, group)
    extreme = grouped.gather(2, grouped.abs().argmax(dim=2, keepdim=True)).squeeze(2)  # [Np, G] signed
    scale = (extreme / -8).to(torch.float16)
    exact = scale.float()
    safe = torch.where(exact == 0, torch.ones_like(exact), exact)
    q = torch.round(grouped / safe[..., None]).clamp(-8, 7).to(torch.int16) + 8  # [Np, G, group] in 0..15
    q = torch.where(exact[..., None] == 0, torch.full_like(q, 8), q).view(rows, cols).to(torch.uint8)
    halves = q.view(rows // COLS, COLS, cols // 8, 2, 4)  # k = 8c + 4 half + t
    nibbles = (halves[:, :, :, 0] | (halves[:, :, :, 1] << 4)).permute(0, 2, 1, 3).contiguous()  # [N/16, K/8, 16, 4]
    scales = scale.view(rows // COLS, COLS, cols // group).permute(0, 2, 1).contiguous()  # [N/16, K/group, 16]
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
