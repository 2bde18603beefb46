"""Stop a block after the first token whose entropy reaches a threshold (nats): the edge is
unsure, so the tokens after it are likely rejected and not worth drafting."""
from __future__ import annotations

import math
from dataclasses import dataclass

from specdec.core.block_length.rules import register_stop
from specdec.errors import ConfigError


@register_stop("entropy")
@dataclass(frozen=True)
class EntropyStop:
    nats: float

    def __post_init__(self) -> None:
        if not (self.nats >= 0 and math.isfinite(self.nats)):
            raise ConfigError(f"draft stop entropy:NATS needs a finite NATS >= 0, got {self.nats}")

    def __call__(self, dist, entropy_nats: float) -> bool:
        return entropy_nats >= self.nats
