"""Logits processors and stop rules: the plug-in points for decoding constraints.

A processor sees the new tokens generated so far (never the prompt) and the raw logits of the
next position, and returns processed logits. Temperature is NOT a processor: it is applied
exactly once, after every processor, by `specdec.core.sampling.distribution` (applied twice, once in a
processor and again when sampling, it over-sharpened the distribution and punctuation won).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch


class LogitsProcessor(Protocol):
    def __call__(self, generated: Sequence[int], logits: torch.Tensor) -> torch.Tensor:
        """generated: new token ids so far (python ints); logits: [V] float32 -> [V] float32.
        Must not modify `logits` in place (the caller may reuse it)."""
        ...


@dataclass(frozen=True)
class StopRule:
    """When generation ends. `eos_ids` always stop; `sentence_end_ids` stop only once at least
    `min_new_tokens` tokens (this one included) have been generated."""

    eos_ids: frozenset[int] = frozenset()
    sentence_end_ids: frozenset[int] = frozenset()
    min_new_tokens: int = 0

    def stops(self, token_id: int, n_generated: int) -> bool:
        """n_generated counts `token_id` itself."""
        if token_id in self.eos_ids:
            return True
        return token_id in self.sentence_end_ids and n_generated >= self.min_new_tokens


@dataclass(frozen=True)
class Constraints:
    """A decoding profile: processors applied in order, then the stop rule."""

    processors: tuple[LogitsProcessor, ...] = ()
    stop: StopRule = field(default_factory=StopRule)

    def apply(self, generated: Sequence[int], logits: torch.Tensor) -> torch.Tensor:
        """The processors in order, on the host: they index with host token ids (a CUDA row is copied first)."""
        if self.processors:
            logits = logits.cpu()
        for processor in self.processors:
            logits = processor(generated, logits)
        return logits
