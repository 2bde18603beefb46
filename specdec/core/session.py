"""The accepted sequence (the one source of truth) and model sessions derived from it.

Invariant, asserted at every use: a session's KV cache holds a prefix of the accepted sequence
(plus, while drafting, the edge's own draft tokens), and it is cropped back to the accepted
prefix after each cycle. The tokens a cache has not seen are read from the accepted sequence and fed
as one block: a hand-kept "last token" went stale after rollbacks and looped (音色中，音色中，音色中).
"""
from __future__ import annotations

import torch

from specdec.backends.base import Backend
from specdec.backends.devices import clock
from specdec.backends.prompt import Prompt


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
    """A backend and its KV state for one generation; times its own forwards.

    The prompt is not prefilled on its own: the first `feed` carries the whole prompt plus that
    step's block (the prompt's multimodal inputs with it) in ONE forward, as `generate()` does.
    A separate prefill would cost one extra forward of the block per generation, which on a
    memory-bound CPU costs as much as a whole draft or verify step."""

    def __init__(self, backend: Backend, prompt: Prompt) -> None:
        self.backend, self.prompt = backend, prompt
        self.device = backend.device  # a CUDA forward is timed after its queue drains
        self.state = None  # created by the first feed
        self.compute_s = 0.0
        self.prefill_s = 0.0  # the first forward: prompt + first block

    @property
    def length(self) -> int:
        return self.state.length if self.state is not None else 0

    def feed(self, token_ids: torch.Tensor, keep: int) -> torch.Tensor:
        """Feed a block; returns the logits of its last `keep` positions [keep, V]."""
        assert 1 <= keep <= token_ids.numel(), f"keep={keep} for a block of {token_ids.numel()}"
        start = clock(self.device)
        if self.state is None:
            self.state, logits = self.backend.prefill(self.prompt, token_ids, keep=keep)
            self.prefill_s = clock(self.device) - start
        else:
            logits = self.backend.forward(self.state, token_ids, keep)
        self.compute_s += clock(self.device) - start
        assert logits is not None  # keep >= 1 (asserted above): a backend returns [keep, V], None only for keep 0
        return logits

    def feed_tree(self, token_ids: torch.Tensor, tree) -> torch.Tensor:
        """Feed a block, then a token tree's nodes (Backend.forward_tree): [1 + nodes, V]. The first feed prefills
        the prompt in the same forward, as `feed` does."""
        start = clock(self.device)
        first = self.state is None
        if self.state is None:
            self.state, _ = self.backend.prefill(self.prompt, token_ids[:0])  # empty: the prompt rides in the block
        logits = self.backend.forward_tree(self.state, token_ids, tree)
        elapsed = clock(self.device) - start
        self.prefill_s = elapsed if first else self.prefill_s
        self.compute_s += elapsed
        return logits

    def commit_path(self, tree, path: list[int]) -> None:
        """After feed_tree: the accepted path joins the cache."""
        assert self.state is not None, "commit_path follows feed_tree"
        start = clock(self.device)
        self.backend.commit_path(self.state, tree, path)
        self.compute_s += clock(self.device) - start

    def unseen(self, seq: AcceptedSequence) -> torch.Tensor:
        """Accepted tokens this cache has not seen yet (>= 1: at least the last accepted one;
        the whole prompt before the first feed)."""
        assert self.length < seq.length, f"cache length {self.length} must be < accepted length {seq.length}"
        return seq.ids[self.length :]

    def rollback(self, length: int, seq: AcceptedSequence) -> None:
        assert length <= seq.length, f"rollback to {length} beyond the accepted sequence ({seq.length})"
        assert self.state is not None, "rollback before the first feed"
        self.backend.crop(self.state, length)
