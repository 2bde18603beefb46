"""The torch runtimes (specdec/backends/hf_causal.py and friends): the model in torch and transformers, in the run's
dtype (`torch`, the default, which also runs on a GPU), or derived in memory with dynamic int8 Linear layers and
float32 activations (`torch-int8`: NAME@int8), the same with activations quantized per token (`torch-int8t`:
NAME@int8t, whose blocks are its steps bit for bit)."""
from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import cast

from specdec.backends.base import DTYPES
from specdec.backends.devices import on_cpu
from specdec.errors import ModelError
from specdec.models import integrity, registry
from specdec.models.convert_ct2 import CT2_FILES, ensure_whisper
from specdec.models.derive import INT8 as INT8_OPS
from specdec.models.derive import check_derivable, derive, needs_float32, split_name
from specdec.models.loading import LoadedModel, LoadSettings, cast_copy, check_weights, load_errors, resolve, verbosity
from specdec.runtime_registry import CLOUD, EDGE, Runtime, declared, register
from specdec.settings import Steps

LOADER = f"{__name__}:load"
TORCH = register(Runtime("torch", "torch in --dtype", loader=LOADER, order=0, default=True, devices=True,
                         dtyped=True, caches=True,
                         auto=frozenset({CLOUD, EDGE}), calibrated=True))
INT8 = register(Runtime(
    "torch-int8", "torch with dynamic int8 Linear layers, float32 activations", loader=LOADER, order=1, derives="int8",
    block_drift="dynamic int8 quantizes a forward's activations with one scale over all its rows, so a (k+1)-row "
                "verify computes other logits than a one-token step (torch-int8t computes its steps' logits exactly)",
    weight_bits=8, auto=frozenset({CLOUD, EDGE}), measured_first=True, calibrated=True, peer=True))
INT8T = register(Runtime(
    "torch-int8t", "torch int8 with activations quantized per token (a block's logits are its steps')", loader=LOADER,
    order=2, derives="int8t", blocks_are_steps=True,
    block_drift="int8t's blocks are meant to compute its steps' logits bit for bit, and this machine's kernels did "
                "not (the calibration's block_vs_steps for torch-int8t, in the header, says by how much)",
    weight_bits=8, auto=frozenset({CLOUD})))


def runtime_of(ops: tuple[str, ...]) -> str:
    """The runtime a torch model with these derivations runs in (int8c counts as torch-int8)."""
    if INT8T.derives in ops:
        return INT8T.name
    return INT8.name if set(INT8_OPS) & set(ops) else TORCH.name


def load(name: str, settings: LoadSettings, log: Callable[[str], object] = print) -> LoadedModel:
    """`NAME@OPS` (or a derived registry alias) loads NAME and derives an edge from it in memory
    (`specdec.models.derive`); int8 derivations run in float32 whatever the dtype says, and runtime torch-int8 is
    NAME@int8 (torch-int8t NAME@int8t)."""

    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedModel
    from transformers.utils import logging as hf_logging

    from specdec.backends.omni_thinker import OMNI_MODEL_TYPES, default_feature_extractor, load_omni_thinker
    from specdec.backends.static_cache import placed, static_capable
    from specdec.backends.static_slots import causal_backend
    from specdec.backends.whisper import WHISPER_MODEL_TYPES, WhisperBackend, load_whisper, whisper_feature_extractor

    dtype, device = settings.dtype, settings.device
    base, ops = split_name(registry.expand(name))
    derives = declared(settings.runtime).derives
    if derives is not None and not set(INT8_OPS) & set(ops):
        ops = (*ops, derives)
    if ops and not on_cpu(device):
        raise ModelError(f"{name}: @{'+'.join(ops)} derives dynamic int8 layers, which run on the CPU only: use device cpu")
    location = resolve(base, log=log)
    if isinstance(location, Path) and all((location / f).is_file() for f in CT2_FILES):
        # A CTranslate2 Whisper folder (model.bin): its Hugging Face conversion, made once and kept beside it.
        location = ensure_whisper(location, "float16", log)
    if isinstance(location, Path) and (damaged := integrity.problems(location, None)):
        raise ModelError(f"cannot load model {name!r}: {damaged[0]} in {location}: restore that file, or point at a "
                         "whole model folder")
    with load_errors(name, location):
        config = AutoConfig.from_pretrained(location)
    check_derivable(config.model_type, ops)
    run_dtype = "float32" if needs_float32(ops) else dtype
    if run_dtype != dtype:
        log(f"{name}: int8 layers take float32 activations, so it runs in float32, not {dtype}")
    if config.model_type not in WHISPER_MODEL_TYPES:
        # Whisper registry copies are fp16 (exact for their CTranslate2 source) and cast at load.
        location = cast_copy(location, run_dtype, log)
    start = time.perf_counter()
    with load_errors(name, location):
        tokenizer = AutoTokenizer.from_pretrained(location)
    location = str(location)
    feature_extractor = None
    if config.model_type in WHISPER_MODEL_TYPES:
        with load_errors(name, location):
            model = load_whisper(location, DTYPES[run_dtype], name=name).model
        backend = placed(WhisperBackend(derive(model, ops), name=name), device, settings.steps(False))
        feature_extractor = whisper_feature_extractor(location, config.num_mel_bins)
    elif config.model_type in OMNI_MODEL_TYPES:
        if ops:
            raise ModelError(f"cannot load {name!r}: derivations (@{'+'.join(ops)}, runtime {INT8.name}) are not "
                             f"implemented for the Omni thinker: use runtime {TORCH.name}")
        with load_errors(name, location):
            backend = load_omni_thinker(location, DTYPES[dtype], name=name)
        backend = placed(backend, device, settings.steps(False))
        feature_extractor = default_feature_extractor()
    else:
        with load_errors(name, location), verbosity(hf_logging, hf_logging.ERROR):  # its load report: ours below
            # output_loading_info: (model, what the load found), which transformers types as the model alone
            model, info = cast(tuple[PreTrainedModel, dict], AutoModelForCausalLM.from_pretrained(
                location, dtype=DTYPES[run_dtype], output_loading_info=True, ignore_mismatched_sizes=True))
        check_weights(name, location, info)
        steps = settings.steps(static_capable(model) and not ops)
        if ops and steps != Steps.DYNAMIC:
            raise ModelError(f"{name}: a static KV cache runs the torch runtime's float weights, not @{'+'.join(ops)}: "
                             "use kv_cache dynamic or auto")
        backend = causal_backend(derive(model, ops).to(device), name, steps, settings.sessions)
    return LoadedModel(name, location, backend, tokenizer, time.perf_counter() - start, feature_extractor,
                       runtime_of(ops))  # `NAME@int8` runs int8 whatever was asked
