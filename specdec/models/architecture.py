"""A model architecture with random weights, built from a config file: `arch:PATH.json`.

What it is for: timing a model of the real size where its weights cannot travel (a GPU machine with no
network: issue 44's check). A forward's cost does not read the weights' values, so a random-weight Qwen2.5-7B
costs what the real one costs; what it decides is noise. So it serves token ids, not text, and a fleet's
replayed edges have it keep their recorded verdicts (`serve --follow-verdicts`; docs/gpu.md).

The file holds `model_type` and the config's fields (bench/gpu/qwen2.5-7b.json); the weights are drawn
with a fixed seed directly on the device (a 7B never passes through host memory). It has no tokenizer:
encoding text is refused in one line, and its vocabulary fingerprint is that of an empty vocabulary, so a
real edge is refused by the fingerprint check instead of being verified by noise.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from specdec.errors import InputError, ModelError

if TYPE_CHECKING:  # imported where a model is built: reading a config file needs no torch
    import torch

PREFIX = "arch:"
SEED = 0


def is_architecture(name: str) -> bool:
    return name.startswith(PREFIX)


class NoTokenizer:
    """The tokenizer of a random-weight architecture: none. Its vocabulary is empty, and text is refused."""

    eos_token_id = None
    chat_template = None

    def __init__(self, name: str) -> None:
        self.name = name

    def get_vocab(self) -> dict[str, int]:
        return {}

    def _refuse(self, *args, **kwargs):
        raise InputError(f"model {self.name!r} is a random-weight architecture without a tokenizer: it serves token "
                         "ids (a fleet's --edge-replay with --follow-verdicts), not text; load a real model for text")

    __call__ = encode = decode = apply_chat_template = convert_ids_to_tokens = _refuse


def read_settings(name: str) -> tuple[str, dict]:
    """(model_type, the config's other fields) of `arch:PATH`; a missing or broken file is one line."""
    path = Path(name.removeprefix(PREFIX)).expanduser()
    try:
        settings = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise ModelError(f"cannot read the architecture {path}: {e.strerror}; give arch:PATH to a config JSON file "
                         "(e.g. arch:bench/gpu/qwen2.5-7b.json)") from None
    except json.JSONDecodeError as e:
        raise ModelError(f"architecture {path} is not JSON ({e.msg} at line {e.lineno}): fix the file") from None
    if not isinstance(settings, dict) or not isinstance(settings.get("model_type"), str):
        raise ModelError(f"architecture {path} names no model_type: add e.g. \"model_type\": \"qwen2\"")
    settings = dict(settings)
    return settings.pop("model_type"), settings


def build_architecture(name: str, dtype: torch.dtype, device: str = "cpu", overrides: dict | None = None):
    """The causal LM of `arch:PATH` (`overrides` replace config fields) with seeded random weights, made on `device`."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    model_type, settings = read_settings(name)
    try:
        config = AutoConfig.for_model(model_type, **{**settings, **(overrides or {})})
    except (ValueError, TypeError) as e:
        raise ModelError(f"architecture {name.removeprefix(PREFIX)}: {e}; fix its fields") from None
    torch.manual_seed(SEED)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.eval()
