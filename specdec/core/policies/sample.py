"""Speculative sampling (Leviathan et al. 2023, Alg. 1; Chen et al. 2023): lossless in distribution.

accept d_i with probability min(1, cloud_probs(d_i) / draft_probs(d_i));
at the first rejection resample from norm(max(0, cloud_probs - draft_probs));
on full acceptance sample the bonus token from cloud_probs[n].

A draft-free proposal (draft_probs None) is a point mass on each d_i: draft_probs(d_i) = 1, so d_i
is accepted with probability cloud_probs(d_i) and a rejection resamples from cloud_probs without d_i;
the rule above with that draft distribution, hence still lossless.
"""
from __future__ import annotations

import torch

from specdec.core.policies.registry import register_policy
from specdec.core.sampling import accepted_prefix


@register_policy("sample", samples=True, lossless=True)
def speculative_sample(draft_tokens, draft_probs, cloud_logits, cloud_probs, do_sample, generator):
    n = draft_tokens.numel()
    if draft_probs is None:  # a point mass per token: [n, V] one-hot
        draft_probs = torch.zeros_like(cloud_probs[:-1]).scatter_(-1, draft_tokens.unsqueeze(-1), 1.0)
    index = draft_tokens.unsqueeze(-1)
    cloud_p = cloud_probs[:-1].gather(-1, index).squeeze(-1)  # [n] target prob of each draft
    draft_p = draft_probs.gather(-1, index).squeeze(-1)  # [n] > 0: each d_i was sampled from it
    u = torch.rand(n, generator=generator)
    accepted = accepted_prefix(u * draft_p < cloud_p)  # u < p/q, without dividing
    if accepted == n:
        target = cloud_probs[n]
    else:
        target = (cloud_probs[accepted] - draft_probs[accepted]).clamp_min(0)
        if not bool(target.sum() > 0):  # p == q: a rejection had probability 0
            target = cloud_probs[accepted]
    return accepted, torch.multinomial(target, 1, generator=generator).squeeze(0)
