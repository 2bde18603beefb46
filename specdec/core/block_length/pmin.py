"""Stop a block after the first token whose top-1 probability falls below P (llama.cpp's
`--draft-p-min`; HF's `assistant_confidence_threshold` applies the same test)."""
from __future__ import annotations

from dataclasses import dataclass

from specdec.core.block_length.rules import register_stop
from specdec.errors import ConfigError


@register_stop("pmin")
@dataclass(frozen=True)
class MinProbabilityStop:
    p: float

    def __post_init__(self) -> None:
        if not 0.0 <= self.p <= 1.0:
            raise ConfigError(f"draft stop pmin:P needs a probability P in [0, 1], got {self.p}")

    def __call__(self, dist, entropy_nats: float) -> bool:
        return float(dist.max()) < self.p
