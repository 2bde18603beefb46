"""Distributions, entropy and token choice. Temperature is applied here and nowhere else."""
from __future__ import annotations

import torch


def distribution(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """[..., V] processed logits -> probabilities. Temperature exactly once (twice over-sharpens);
    greedy decoding (temperature 0) measures the T = 1 distribution."""
    scale = temperature if temperature > 0 else 1.0
    return torch.softmax(logits / scale, dim=-1)


def entropy_nats(probs: torch.Tensor) -> torch.Tensor:
    """[..., V] -> [...]: H = -sum p ln p, in nats (0 ln 0 = 0)."""
    return -torch.special.xlogy(probs, probs).sum(-1)


def choose(logits: torch.Tensor, probs: torch.Tensor | None, do_sample: bool, generator: torch.Generator) -> torch.Tensor:
    """One token id per row of [..., V]. Greedy takes argmax of the logits (as HF generate does); sampling draws from
    `probs` (None only under greedy decoding, which never computes them)."""
    if do_sample:
        assert probs is not None, "sampling draws from probs: compute them when do_sample"
        return torch.multinomial(probs.reshape(-1, probs.shape[-1]), 1, generator=generator).view(probs.shape[:-1])
    return logits.argmax(-1)


def accepted_prefix(ok: torch.Tensor) -> int:
    """[n] bool -> length of the leading run of True (the accepted draft prefix)."""
    return int(ok.to(torch.int64).cumprod(0).sum())
