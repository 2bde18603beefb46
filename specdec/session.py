"""The accepted sequence (the one source of truth) and model sessions derived from it.

Invariant, asserted at every use: a session's KV cache holds a prefix of the accepted sequence
(plus, while drafting, the edge's own draft tokens), and it is cropped back to the accepted
prefix after each cycle. The tokens a cache has not seen are fed as one block (seed 002/004).
"""
from __future__ import annotations

import time

import torch

from specdec.backends.base import Backend, Prompt


class AcceptedSequence:
    """Prompt + accepted new tokens in one preallocated buffer."""

    def __init__(self, prompt_ids: torch.Tensor, max_new_tokens: int) -> None:
        self.prompt_len = prompt_ids.numel()
        self.buffer = torch.empty(self.prompt_len + max_new_tokens, dtype=torch.long)
        self.buffer[: self.prompt_len] = prompt_ids
        self.length = self.prompt_len
        self.generated: list[int] = []  # host copy of the new tokens, for processors and results

    @property
    def ids(self) -> torch.Tensor:
        return self.buffer[: self.length]

    @property
    def remaining(self) -> int:
        return self.buffer.numel() - self.length

    def extend(self, tokens: list[int]) -> None:
        n = len(tokens)
        assert n <= self.remaining, f"{n} tokens exceed the budget ({self.remaining} left)"
        self.buffer[self.length : self.length + n] = torch.tensor(tokens, dtype=torch.long)
        self.length += n
        self.generated.extend(tokens)


class Session:
    """A backend and its KV state for one generation; times its own forwards."""

    def __init__(self, backend: Backend, prompt: Prompt, seq: AcceptedSequence) -> None:
        self.backend = backend
        self.compute_s = 0.0
        start = time.perf_counter()
        # Prefill everything but the last prompt token, which is fed with the first block:
        # every step then feeds >= 1 token and reads its logits (one uniform loop).
        self.state, _ = backend.prefill(prompt, seq.ids[:-1])
        self.compute_s += time.perf_counter() - start

    @property
    def length(self) -> int:
        return self.state.length

    def feed(self, token_ids: torch.Tensor) -> torch.Tensor:
        start = time.perf_counter()
        logits = self.backend.forward(self.state, token_ids)
        self.compute_s += time.perf_counter() - start
        return logits

    def unseen(self, seq: AcceptedSequence) -> torch.Tensor:
        """Accepted tokens this cache has not seen yet (>= 1: at least the last accepted one)."""
        assert self.length < seq.length, f"cache length {self.length} must be < accepted length {seq.length}"
        return seq.ids[self.length :]

    def rollback(self, length: int, seq: AcceptedSequence) -> None:
        assert length <= seq.length, f"rollback to {length} beyond the accepted sequence ({seq.length})"
        self.backend.crop(self.state, length)
