"""Attention that computes each row of a batch exactly as that row's own forward would.

A server batching sessions pads them (pasts left-padded to the longest, blocks right-padded) and
runs one attention over the padded tensors. In fp32 a row's result then differs from its own
forward only by rounding (the reduction runs over more, masked, keys), but under per-token int8
activations (`@int8t`) that rounding is not small: a value that moves by 1e-7 across a rounding
boundary of the int8 grid moves by a whole grid step in the next Linear, and over 28 layers the
1.5B's logits moved by 1.1–1.9 with the greedy token changed on 3 of 4 rows (measured
2026-11-25: four sessions of 33–61 tokens, blocks of 3–5). Replayed edges against such a server saw
verdicts differ from their recording in 7 of 68 verifies at 4 edges.

`rowwise_attention` takes, for every row, each real query and the real keys it attends (read off the
mask: a query is real when its own key is) and calls SDPA on exactly those, one query at a time: the
shapes, the mask and so the kernel are the ones a one-token step at that position gets, batch or
block or not. With every Linear per-token (`TokenScaledInt8`) and the norms per row, a row's logits
are then bit for bit its single forward's, and a (k+1)-token block's rows are k+1 steps' logits
(`tests/test_int8_batch.py`; the calibration measures it on the real model, `block_vs_steps`). One
SDPA call over a row's n queries was not enough for the second: the kernel splits its work by n, and
on an Intel Xeon (2026-11-26) the 1.5B's block logits moved by up to 1.7 against its steps. Padding
queries get zeros (their logits are never read). The cost is one SDPA call per query per layer: a
600-token prompt's prefill makes 600 x 28 small calls.
"""
from __future__ import annotations

import torch
from torch.nn import functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import repeat_kv
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

NAME = "specbench_rowwise"


def rowwise_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs):
    """query [B, H, q, d], key/value [B, H_kv, kv, d], attention_mask [B, 1, q, kv] bool (True:
    attend) or None (every row real and causal); returns [B, q, H, d] as transformers' SDPA does."""
    batch, heads, q_len, _ = query.shape
    kv_len = key.shape[2]
    groups = getattr(module, "num_key_value_groups", 1)
    out = query.new_zeros(batch, q_len, heads, value.shape[-1])
    if attention_mask is None:  # no padding: every row the causal pattern of the last q_len positions
        shared = torch.ones(q_len, kv_len, dtype=torch.bool)
        if getattr(module, "is_causal", True):
            shared = shared.tril(kv_len - q_len)
    for row in range(batch):
        mask = shared if attention_mask is None else attention_mask[row, 0].bool()  # [q, kv]
        keys_real = mask.any(dim=0)
        queries_real = keys_real[kv_len - q_len:]  # query j is position kv_len - q_len + j
        n = int(queries_real.sum())
        if n == 0:
            continue
        # one SDPA call per real query, over exactly the keys it attends: the call a one-token step at that
        # position makes, so a (k+1)-token block's rows are bit for bit k+1 steps' (one call over n queries
        # let the kernel split its work by n: the 1.5B's block logits moved by up to 1.7 against its steps
        # on an Intel Xeon, 2026-11-26)
        for j in torch.nonzero(queries_real).flatten().tolist():
            attends = mask[j]  # [kv]
            q = query[row : row + 1, :, j : j + 1].contiguous()  # [1, H, 1, d]
            k = repeat_kv(key[row : row + 1, :, attends], groups).contiguous()  # [1, H, R, d]
            v = repeat_kv(value[row : row + 1, :, attends], groups).contiguous()
            every = torch.ones(1, 1, 1, k.shape[2], dtype=torch.bool)  # what a step alone passes
            attended = F.scaled_dot_product_attention(q, k, v, attn_mask=every, dropout_p=dropout, scale=scaling)
            out[row, j] = attended[0, :, 0]
    return out, None


def install(model) -> None:
    """Make `model`, a decoder-only transformers model (its queries are the last positions of its
    keys), run `rowwise_attention` in every attention layer."""
    AttentionInterface.register(NAME, rowwise_attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    model.set_attn_implementation(NAME)
