"""What the torch backends ask of transformers, across its versions."""
from __future__ import annotations

import inspect

from specdec.errors import ModelError

FULL_ATTENTION_TYPES = ("llama", "qwen2", "qwen3")  # decoders whose layers can all be full attention
MASK_TAKING = ("sdpa", "eager", "specbench_rowwise")  # attention that reads a given 4-D mask (flash kernels do not)


def full_attention_decoder(model) -> bool:
    """A Llama, Qwen2 or Qwen3 decoder whose layers are all full attention: its attention is the causal pattern,
    which a 4-D mask from explicit positions replaces (a static cache's, a token tree's). Sliding windows (Gemma3),
    an Omni thinker's 3-D positions and others build masks of their own."""
    config = model.config
    full = all(kind == "full_attention" for kind in getattr(config, "layer_types", None) or ["full_attention"])
    return config.model_type in FULL_ATTENTION_TYPES and full


def takes_tree_mask(model) -> bool:
    """The model's attention reads a custom 4-D mask (a token tree's): a full-attention decoder under SDPA, eager
    attention or specbench's row-wise attention."""
    return full_attention_decoder(model) and getattr(model.config, "_attn_implementation", "sdpa") in MASK_TAKING


def cache_kwarg(forward) -> str:
    """The name under which `forward` takes its KV cache: `past_key_values` up to transformers 5.23,
    `cache` from 5.24 (which still takes the old name until 5.40 but warns on every call)."""
    return "cache" if "cache" in inspect.signature(forward).parameters else "past_key_values"


def from_pretrained_checked(model_class, path, model_types: tuple[str, ...], what: str, dtype=None):
    """`model_class.from_pretrained(path)` after checking the config's model type: from_pretrained
    only warns on another type, then leaves the weights random."""
    from transformers import AutoConfig

    try:
        model_type = AutoConfig.from_pretrained(path).model_type
        if model_type not in model_types:
            raise ModelError(f"{path!r} is a {model_type!r} model, not {what}")
        return model_class.from_pretrained(path, **({"dtype": dtype} if dtype is not None else {}))
    except (OSError, ValueError) as e:
        raise ModelError(f"cannot load a {what} model from {path!r}: {e}") from e
