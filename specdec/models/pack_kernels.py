"""The kernels' int8 and int4 runtimes from a model's folder: loaded in float32, packed for the kernels
(specdec/backends/packed.py), the float weights handed back. Nothing is written to disk: packing the 1.5B takes about
30 s of its load, about what reading a kept copy would cost, and a copy would be one more artifact to keep fresh."""
from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import torch

from specdec.backends.packed import PackedBackend, check_model
from specdec.kernels import kernels
from specdec.models.derive import give_back_memory


def load_packed(model_dir: Path | str, log: Callable[[str], object] = print, name: str = "",
              weights: str = "int8") -> PackedBackend:
    """The model folder loaded in float32, packed for the kernels (the float weights are freed after)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    check_model(AutoConfig.from_pretrained(model_dir))
    kernels()  # builds once per machine (about a minute); refuses here on a CPU without a vector path
    start = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    backend = PackedBackend.from_model(model, weights, name=name or Path(model_dir).name)
    del model
    give_back_memory()
    log(f"{backend.name}: packed for kernels-{weights} in {time.perf_counter() - start:.0f} s")
    return backend
