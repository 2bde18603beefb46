"""The backend protocol: the only thing the decoding loop knows about a model.

A backend turns token blocks into logits on a KV state it owns:

    state, logits = backend.prefill(prompt, token_ids, keep)   # one forward, multimodal inputs here
    logits = backend.forward(state, token_ids, keep)           # [keep, V] of [n, V]: row i predicts the token after token_ids[i]
    backend.crop(state, length)                                # drop cached positions >= length

Positions are always explicit: a block fed on a state of length L occupies positions L .. L+n-1.

What a backend is given lives beside it (prompt.py: `Prompt`), what its buffers do (buffers.py), what the torch
backends ask of transformers (hf_util.py); which runtime builds which backend is declared in specdec/runtimes.
"""
from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch

from specdec.backends.prompt import Prompt
from specdec.errors import ConfigError
from specdec.settings import DType

DTYPES: dict[str, torch.dtype] = {DType.FLOAT32: torch.float32, DType.BFLOAT16: torch.bfloat16}  # by name


@runtime_checkable
class State(Protocol):
    """A backend's KV state. `length` = number of token positions held in the cache."""

    length: int


class Backend:
    """The backend interface, declared: every runtime subclasses it and states what it can do.

    Three methods make a backend (the module docstring): `prefill`, `forward` and `crop`. A runtime writes
    `prefill`, `_run` (one block on a state: `forward` supplies its keep-default) and, where dropping positions
    needs more than a shorter length, `_drop_past` (`crop` checks the length once, here). What callers read
    beyond them is declared below with its default, so no caller probes a backend with getattr or hasattr, and a
    new runtime is one file that overrides what differs:

        device          where inputs go and logits live; None: the CPU (a CUDA forward is timed after its queue)
        batchable       forward_batch runs rows of several states in one forward (the server batches them)
        max_positions   the longest state it holds; None: the model's config says (LoadedModel.max_positions)
        eos_ids         end-of-sequence ids of its own (a GGUF's, a converted folder's), beside the tokenizer's
        processors      logits processors its decoding rule needs (Whisper's suppression)
        streamed_bytes  bytes a one-token step reads, where the runtime knows; None: count the torch model's
        memory_bytes    bytes it holds, where it has no torch model (llama.cpp, the kernels)
        extra_buffers   llama.cpp's repacked weight buffers in use; None for every other runtime
        model           the torch model, where there is one
        transcribes     takes audio alone and writes what it hears (Whisper): no text prompt, no chat template
        accepts_trees   forward_tree verifies a token tree in one block, each node's row its path's step bit for
                        bit, and commit_path keeps the accepted path (specdec/core/tree.py); others verify chains
        with_head_rows  a view whose output head computes only some ids' rows (a drafter's smaller vocabulary);
                        the runtimes whose head is their own code (the kernels) have one (`cuts_head`), the others
                        refuse
    """

    name: str = ""
    vocab_size: int = 0  # rows of the output head; may differ between edge and cloud
    accepts_audio: bool = False
    device: torch.device | None = None
    max_positions: int | None = None
    eos_ids: frozenset[int] = frozenset()
    extra_buffers: bool | None = None
    model: Any = None
    accepts_trees: bool = False
    cuts_head: bool = False  # with_head_rows gives a view; False: it refuses
    transcribes: bool = False

    # Declared as read-only properties: a runtime answers with a class attribute, an attribute set at load, or a
    # property that computes it, and callers only read them.
    @property
    def batchable(self) -> bool:
        return False

    @property
    def processors(self) -> tuple:
        return ()

    @property
    def streamed_bytes(self) -> int | None:
        return None

    @property
    def memory_bytes(self) -> int | None:
        return None

    def prefill(
        self, prompt: Prompt, token_ids: torch.Tensor, keep: int = 0, use_cache: bool = True
    ) -> tuple[Any, torch.Tensor | None]:
        """One forward over `token_ids` ([n], starting with the prompt's ids) with the prompt's
        multimodal features. Returns (state of length n, logits of the last `keep` positions
        [keep, V], or None when keep == 0). `use_cache=False` builds no reusable state."""
        raise NotImplementedError

    def forward(self, state: Any, token_ids: torch.Tensor, keep: int | None = None) -> torch.Tensor | None:
        """Feed `token_ids` [n] at positions state.length .. +n-1; returns the logits of the last
        `keep` positions [keep, V] (float32; all n when keep is None; None when keep == 0, as prefill's).
        The output head runs on those positions only."""
        return self._run(state, token_ids, kept_rows(token_ids, keep))

    def forward_batch(self, states: list, blocks: list[torch.Tensor], keeps: list[int]) -> list[torch.Tensor | None]:
        """Blocks of several states in one forward (only where `batchable`), each row's logits as `forward`'s."""
        raise NotImplementedError(f"{type(self).__name__} runs one state per forward (batchable is False)")

    def forward_tree(self, state: Any, token_ids: torch.Tensor, tree: Any) -> torch.Tensor:
        """Feed `token_ids` [r >= 1] as `forward` does (they stay cached), then the nodes of `tree` (a
        specdec.core.tree.TokenTree), each at position state.length + r - 1 + its depth, seeing the cache and its own
        ancestors only; returns [1 + n, V] logits: the last of token_ids' rows, then each node's. The nodes stay out
        of the state until commit_path. Only where `accepts_trees`."""
        raise NotImplementedError(f"{type(self).__name__} verifies chains only (accepts_trees is False)")

    def commit_path(self, state: Any, tree: Any, path: list[int]) -> None:
        """After forward_tree: the nodes of `path` (root to leaf) join the state as if fed as a block."""
        raise NotImplementedError(f"{type(self).__name__} verifies chains only (accepts_trees is False)")

    def with_head_rows(self, rows: torch.Tensor) -> Backend:
        """This backend, its states and weights shared, whose output head computes only the rows of `rows` (sorted
        unique ids): logits [keep, V] hold those rows' values, bit for bit the whole head's, and -inf elsewhere. A
        drafter's smaller vocabulary (FR-Spec's idea): a draft is only a proposal, so the verifier's text is unchanged,
        and the head is a large part of a small model's step."""
        raise ConfigError(f"{type(self).__name__} ({self.name}) computes its whole output head: a drafter's "
                          "head_vocab needs an edge runtime that computes part of it (kernels-int8, kernels-int4), "
                          "or drop head_vocab")

    def crop(self, state: Any, length: int) -> None:
        """Drop cached positions >= length (exact rollback)."""
        if not 0 <= length <= state.length:
            raise ValueError(f"cannot crop a state of length {state.length} to {length}")
        self._drop_past(state, length)
        state.length = length

    def _run(self, state: Any, token_ids: torch.Tensor, keep: int) -> torch.Tensor | None:
        raise NotImplementedError

    def _drop_past(self, state: Any, length: int) -> None:
        """What a crop must do besides shortening the state (nothing where positions past the length are masked
        or rewritten before a query reads them)."""


def kept_rows(token_ids: torch.Tensor, keep: int | None) -> int:
    """`forward`'s keep-default: the logits of every row of the block when keep is None."""
    return token_ids.numel() if keep is None else keep


