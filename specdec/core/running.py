"""Running means: the two kinds the engine keeps of what it measures.

    ema(mean, value)     x <- alpha * value + (1 - alpha) * x, the first value starting it (alpha 0.5: the
                         newest measurement counts as much as all before it; a step time, a round trip, τ̂)
    RunningMean          Σ amount / Σ count over everything added: seconds per call (count 1 each) or per
                         token (count = the tokens a call fed or emitted)
"""
from __future__ import annotations

from dataclasses import dataclass

ALPHA = 0.5  # the newest value's weight in an exponential mean


def ema(mean: float | None, value: float, alpha: float = ALPHA) -> float:
    """The exponential mean after `value`; `mean` None: nothing before it, `value` starts it."""
    return value if mean is None else alpha * value + (1 - alpha) * mean


@dataclass
class RunningMean:
    """Σ amount / Σ count of what was added; None before anything was."""

    total: float = 0.0
    count: float = 0

    def add(self, amount: float, count: float = 1) -> None:
        self.total += amount
        self.count += count

    @property
    def mean(self) -> float | None:
        return self.total / self.count if self.count else None
