"""What the torch backends ask of transformers, across its versions."""
from __future__ import annotations

import inspect

from specdec.errors import ModelError


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
