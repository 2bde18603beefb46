"""Every block drafts up to k tokens."""
from __future__ import annotations

from dataclasses import dataclass

from specdec.core.block_length.rules import register_schedule


@register_schedule("constant")
@dataclass
class ConstantK:
    k: int

    def update(self, drafted: int, accepted: int) -> None:
        """k never moves."""
