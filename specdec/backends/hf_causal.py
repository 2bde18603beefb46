"""Backend for any Hugging Face causal LM (Llama, Qwen2, Gemma3, ...).

KV state is a `DynamicCache`; every forward passes explicit `position_ids = length + arange(n)`
and no attention mask (batch 1, no padding), so positions can never drift (a 1×1 mask per step once
shifted them and filled outputs with punctuation).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache, PreTrainedModel

from specdec.backends.base import Prompt
from specdec.errors import InputError


@dataclass
class CausalState:
    cache: DynamicCache | None
    length: int  # token positions held in `cache`


def block_positions(start: int, n: int) -> torch.Tensor:
    """[1, n] positions start .. start+n-1 (cache length + offset)."""
    return torch.arange(start, start + n, dtype=torch.long).unsqueeze(0)


class HFCausalBackend:
    """Wraps a loaded `*ForCausalLM`; build with `load_backend` or directly from a model."""

    accepts_audio = False

    def __init__(self, model: PreTrainedModel, name: str = "") -> None:
        self.model = model.eval()
        self.name = name or model.config.name_or_path or type(model).__name__
        self.vocab_size = model.get_output_embeddings().weight.shape[0]

    # --- protocol -----------------------------------------------------------------------
    def prefill(self, prompt: Prompt, token_ids: torch.Tensor, keep: int = 0, use_cache: bool = True):
        if prompt.features:
            raise InputError(
                f"model {self.name!r} is text-only but the prompt has {sorted(prompt.features)}: "
                "use an audio-capable model (e.g. a Qwen2.5-Omni thinker) or drop the audio"
            )
        state = CausalState(self._new_cache() if use_cache else None, 0)
        if token_ids.numel() == 0:
            return state, None
        logits = self._run(state, token_ids, keep)
        return state, logits

    def forward(self, state: CausalState, token_ids: torch.Tensor, keep: int | None = None) -> torch.Tensor:
        return self._run(state, token_ids, token_ids.numel() if keep is None else keep)

    def crop(self, state: CausalState, length: int) -> None:
        if not 0 <= length <= state.length:
            raise ValueError(f"cannot crop a state of length {state.length} to {length}")
        # crop() takes minus the number of tokens to drop; crop(0) also trims sliding layers.
        state.cache.crop(length - state.length)
        state.length = length

    # --- internals ----------------------------------------------------------------------
    def _new_cache(self) -> DynamicCache:
        cache = DynamicCache(config=self.model.config)
        # Sliding-window layers (Gemma3) must keep past states until crop() to allow rollback.
        cache.activate_past_recording()
        return cache

    def _run(self, state: CausalState, token_ids: torch.Tensor, keep: int) -> torch.Tensor | None:
        n = token_ids.numel()
        out = self.model(
            input_ids=token_ids.view(1, n),
            position_ids=block_positions(state.length, n),
            past_key_values=state.cache,
            use_cache=state.cache is not None,
            logits_to_keep=keep,
        )
        state.length += n
        if keep == 0:
            return None
        return out.logits[0, -keep:].float()  # [keep, V]
