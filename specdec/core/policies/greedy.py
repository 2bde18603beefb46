"""Greedy verification: accept d_i while it is the cloud's argmax. Lossless for greedy decoding:
the output is token for token the cloud's own greedy output."""
from __future__ import annotations

import torch

from specdec.core.policies.registry import register_policy


# cloud_probs is None here: a greedy verify skips the softmax over the vocabulary (about 1-2 ms a step on
# 152k logits at 2 threads, where a 1.5B step in llama.cpp takes 37-75 ms; plain decoding never paid it)
@register_policy("greedy", needs_probs=False, lossless=True, argmax=True)
def greedy(draft_tokens, draft_probs, cloud_logits, cloud_probs, do_sample, generator) -> tuple[int, torch.Tensor]:
    cloud_argmax = cloud_logits.argmax(-1)  # [n+1]
    accepted = (draft_tokens == cloud_argmax[:-1]).to(torch.int64).cumprod(0).sum()  # 0-d, on the logits' device
    accepted, next_token = torch.stack([accepted, cloud_argmax[accepted]]).tolist()  # the cycle's one host read
    return accepted, torch.tensor(next_token)

