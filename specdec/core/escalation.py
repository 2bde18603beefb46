"""The edge's escalation gate: is this draft block uncertain enough to send to the cloud?"""
from __future__ import annotations

import torch

from specdec.core.config import SpecConfig
from specdec.settings import Uncertainty


def block_uncertainty(entropies_nats: torch.Tensor, how: Uncertainty) -> torch.Tensor:
    """[n] token entropies -> scalar block uncertainty (nats)."""
    if how == Uncertainty.MAX:
        return entropies_nats.max()
    if how == Uncertainty.MEAN:
        return entropies_nats.mean()
    return entropies_nats[0]


def should_escalate(entropies_nats: torch.Tensor | None, punct_density: float | None, cfg: SpecConfig) -> bool:
    """Escalate iff uncertainty >= threshold (0: always, inf: never), or, with the punctuation trigger
    on, the block's character-level punctuation density exceeds `cfg.punct_trigger`. A draft-free
    block (entropies None: no distribution to be unsure about) always escalates: nothing vouches for it."""
    if cfg.entropy_threshold == 0 or entropies_nats is None:
        return True
    if cfg.punct_trigger is not None and punct_density is not None and punct_density > cfg.punct_trigger:
        return True
    return bool(block_uncertainty(entropies_nats, cfg.uncertainty) >= cfg.entropy_threshold)
