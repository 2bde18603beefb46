"""HF assisted generation's `num_assistant_tokens_schedule="heuristic"`: after a block accepted in
full, draft 2 more next time; otherwise 1 fewer (at least 1). Here capped at the configured k."""
from __future__ import annotations

from dataclasses import dataclass, field

from specdec.core.block_length.rules import register_schedule


@register_schedule("heuristic")
@dataclass
class HeuristicK:
    k_max: int
    k: int = field(init=False)

    def __post_init__(self) -> None:
        self.k = self.k_max

    def update(self, drafted: int, accepted: int) -> None:
        self.k = min(self.k_max, self.k + 2) if accepted == drafted else max(1, self.k - 1)
