"""What a backend is given: one tokenized prompt with its non-text inputs."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from specdec.errors import InputError


@dataclass
class Prompt:
    """One tokenized prompt with its non-text inputs.

    `input_ids` already contains any modality placeholder tokens (e.g. the Omni thinker's
    `<|AUDIO|>` run); `features` holds the tensors those placeholders stand for
    (e.g. `input_features`, `feature_attention_mask`), passed to the model at prefill.
    """

    input_ids: torch.Tensor  # [P] int64
    features: dict[str, torch.Tensor] = field(default_factory=dict)
    text: str = ""

    def __post_init__(self) -> None:
        if self.input_ids.ndim != 1:
            raise ValueError(f"Prompt.input_ids must be 1-D [P], got shape {tuple(self.input_ids.shape)}")
        if self.input_ids.numel() == 0:
            raise InputError("the prompt is empty after tokenization: give it some text")

    @property
    def has_audio(self) -> bool:
        return "input_features" in self.features


def refuse_features(prompt: Prompt, model: str, runtime: str) -> None:
    """A text-only runtime given a prompt with audio features: one line naming the fix."""
    if prompt.features:
        raise InputError(f"model {model!r} runs in {runtime}, text only, but the prompt has "
                         f"{sorted(prompt.features)}: use a torch runtime with an audio model, or drop the audio")
