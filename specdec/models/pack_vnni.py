"""Runtimes vnni-int8 / vnni-int4 from a model's folder: loaded in float32, packed for the kernels
(specdec/backends/vnni.py), the float weights handed back. Nothing is written to disk: packing the 1.5B takes about
30 s of its load, about what reading a kept copy would cost, and a copy would be one more artifact to keep fresh."""
from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import torch

from specdec.backends.vnni import VnniBackend, check_model
from specdec.kernels import kernels
from specdec.models.derive import give_back_memory


def load_vnni(model_dir: Path | str, log: Callable[[str], object] = print, name: str = "",
              weights: str = "int8") -> VnniBackend:
    """The model folder loaded in float32, packed for the kernels (the float weights are freed after)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    check_model(AutoConfig.from_pretrained(model_dir))
    kernels()  # builds once per machine (about a minute); refuses here on a CPU without VNNI
    start = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    backend = VnniBackend.from_model(model, weights, name=name or Path(model_dir).name)
    del model
    give_back_memory()
    log(f"{backend.name}: packed for vnni-{weights} in {time.perf_counter() - start:.0f} s")
    return backend
