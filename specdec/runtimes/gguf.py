"""llama.cpp (specdec/backends/llamacpp.py, through llama-cpp-python): a GGUF file as shipped. A model given as a
`.gguf` file runs here by default, and nowhere else."""
from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from specdec.backends.llamacpp import LLAMA_CPP, LlamaCppBackend  # imports llama_cpp only when it builds one
from specdec.backends.llamacpp_probe import CACHE_FILE
from specdec.errors import ModelError
from specdec.models import fetch as fetching
from specdec.models import registry
from specdec.models.derive import split_name
from specdec.models.loading import LoadedModel, LoadSettings, load_errors
from specdec.runtime_registry import CLOUD, EDGE, Runtime, default_runtime, register

RUNTIME = register(Runtime(
    "llamacpp", "llama.cpp on the registry's GGUF file as shipped, or a .gguf path", loader=f"{__name__}:load", order=3,
    file_suffix=".gguf", file_kind="GGUF", runner="llama.cpp", package=LLAMA_CPP, timed_packages=("llama_cpp",),
    block_drift="llama.cpp quantizes a block's activations for its quantized matmuls as a whole, so a (k+1)-token "
                "verify rounds otherwise than a one-token step",
    weight_bits=4, whole_file=True, extra_buffers=True, auto=frozenset({CLOUD, EDGE}), measured_first=True,
    calibrated=True, peer=True))


def load(name: str, settings: LoadSettings, log: Callable[[str], object] = print) -> LoadedModel:
    """A registry GGUF entry (its kept, verified file; the tokenizer and stop tokens of its converted folder, so both
    runtimes encode and stop alike) or a `.gguf` path (the tokenizer of the folder beside it when it has one, else the
    one in the file's metadata), or a model folder holding one `.gguf` file beside its HF files (one name for both
    runtimes, so a sweep can take the runtime as an axis)."""
    from transformers import AutoTokenizer, GenerationConfig

    RUNTIME.check()
    base, ops = split_name(registry.expand(name))
    if ops:
        raise ModelError(f"cannot load {name!r} in llama.cpp: @{'+'.join(ops)} derives a torch model, and llama.cpp "
                         f"runs the GGUF file as shipped: drop the derivation, or run it in runtime {default_runtime()}")
    if registry.is_alias(base):
        gguf, folder, from_file = fetching.fetch_gguf(base, log=log), registry.model_dir(base), False
    elif base.endswith(".gguf") or len(found := sorted(Path(base).expanduser().glob("*.gguf"))) == 1:
        gguf = Path(base).expanduser() if base.endswith(".gguf") else found[0]
        if not gguf.is_file():
            raise ModelError(f"GGUF file {base!r} does not exist: check the path")
        folder = gguf.parent
        from_file = not any((folder / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json"))
    else:
        raise ModelError(f"runtime {RUNTIME.name} runs a GGUF file: {name!r} is neither a registry GGUF entry, a .gguf "
                         f"path nor a model folder holding one .gguf file (a model folder or hub id runs in {default_runtime()})")
    start = time.perf_counter()
    # First: it names a damaged file in one line. Its extra-buffer probe verdicts live in the model cache.
    backend = LlamaCppBackend(gguf, name=name, extra_buffers=settings.extra_buffers,
                              probe_cache=registry.home() / CACHE_FILE)
    with load_errors(name, folder):
        tokenizer = AutoTokenizer.from_pretrained(folder, **({"gguf_file": gguf.name} if from_file else {}))
    if (folder / "generation_config.json").is_file():  # the converted folder's stop tokens, as torch reads them
        declared = GenerationConfig.from_pretrained(folder).eos_token_id
        backend.eos_ids |= frozenset(declared if isinstance(declared, (list, tuple))
                                     else [declared] if declared is not None else [])
    return LoadedModel(name, str(gguf), backend, tokenizer, time.perf_counter() - start, runtime=RUNTIME.name)
