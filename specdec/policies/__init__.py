"""Acceptance policies: given a draft block and the cloud's view of it, how many draft tokens
survive and which token comes next (a correction, or the free bonus token on full acceptance).

Every policy is one callable:

    accepted, next_token = policy(draft_tokens, draft_probs, cloud_logits, cloud_probs, do_sample, generator)

    draft_tokens [n]        the edge's block d_0..d_{n-1}
    draft_probs  [n, V]     the edge distribution each d_i was drawn from
    cloud_logits [n+1, V]   processed cloud logits; row i predicts d_i, row n is the bonus position
    cloud_probs  [n+1, V]   their distribution (temperature applied once)
    -> accepted: int in [0, n]; next_token: 0-d int64 tensor from row `accepted`
"""
from __future__ import annotations

from typing import Callable

import torch

from specdec.policies.greedy import greedy
from specdec.policies.sample import speculative_sample
from specdec.policies.threshold import ThresholdPolicy

Policy = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, bool, torch.Generator], tuple[int, torch.Tensor]
]


def make_policy(name: str, accept_threshold: float) -> Policy:
    if name == "greedy":
        return greedy
    if name == "sample":
        return speculative_sample
    return ThresholdPolicy(accept_threshold)


__all__ = ["Policy", "make_policy", "greedy", "speculative_sample", "ThresholdPolicy"]
