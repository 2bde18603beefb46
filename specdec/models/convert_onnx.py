"""A Hugging Face causal-LM folder -> an ONNX model for ONNX Runtime's CPU provider, built once by
onnxruntime-genai's model builder and kept beside the model (the cached-artifact rule of
specdec/models/artifact.py: a lock, a marker written last, a build swapped in, rebuilt when damaged):

    <model dir>/onnx-<variant>/model.onnx (+ model.onnx.data)   the graph and its weights
    <model dir>/onnx-<variant>/genai_config.json                 layers, heads, vocabulary, eos ids
    <model dir>/onnx-<variant>/specbench-artifact.json           the marker: the builder's pin, the source
                                                                  files' size, mtime and sha256, the outputs'
                                                                  size and sha256, the builder's command

Variants (`VARIANTS`): `int4` and `int8` are weight-only quantized MatMulNBits (block 32, symmetric,
round to nearest) with accuracy_level 4: activations are quantized to int8 per block of each row and
multiplied in MLAS' int8 kernels (VNNI where the CPU has it). The embedding table stays float32.

The build runs the builder in a child process (it loads the float32 torch model: a peak RSS of
~2.5x the safetensors bytes, 17 GB for the 1.5B; 40 s for the 0.5B, 100 s for the 1.5B int4), from the
local folder only (no hub: HF_HUB_OFFLINE and hf_token=false); a failed build's log is kept beside the
folder as `.onnx-<variant>.builder.log`. After the builder, one edit of the graph (`keep_last_rows`): an
input `num_logits_to_keep` [1] slices the final hidden states to their last rows before the output head,
so a prefill computes the logits of the rows it keeps only (the builder's prune_lm_head keeps one row,
which a verify block cannot use). The `genai-int4` variant skips that edit: the builder's own graph, which
onnxruntime-genai's Generator can feed (a peer's, not a backend's).
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from specdec.backends.onnxrt import KEEP_INPUT, ONNX, OnnxRuntimeBackend
from specdec.errors import ConfigError, ModelError
from specdec.models import artifact
from specdec.models.registry import MARKER as FETCH_MARKER

Log = Callable[[str], object]

BUILDER = "onnxruntime-genai==0.18.0"  # with onnxruntime 1.32.0, onnx 1.23.2, onnx-ir 1.1.0
# variant -> (builder precision, builder extra options)
VARIANTS = {
    "int4": ("int4", ("accuracy_level=4",)),
    "int8": ("int8", ("accuracy_level=4",)),
    # the builder's output as it is, for onnxruntime-genai's own Generator (its n-gram speculation: a peer,
    # bench/measure/peers/ort_genai.py), which cannot feed the edit's input; no specbench backend loads it
    "genai-int4": ("int4", ("accuracy_level=4",)),
}
UNEDITED = frozenset({"genai-int4"})  # variants built without keep_last_rows
DEFAULT_VARIANT = "int4"
SOURCE_SUFFIXES = (".safetensors", ".json", ".jinja", ".txt", ".model", ".tiktoken")  # what the builder reads
MARKER_VERSION = 2  # the graph edit and the marker's layout; bump when either changes (2: artifact.py's marker)


def onnx_dir(model_dir: Path | str, variant: str = DEFAULT_VARIANT) -> Path:
    """Where the `variant` conversion of `model_dir` lives."""
    return Path(model_dir) / f"onnx-{_check_variant(variant)}"


def _check_variant(variant: str) -> str:
    if variant not in VARIANTS:
        raise ConfigError(f"unknown ONNX variant {variant!r}: use one of {', '.join(VARIANTS)}")
    return variant


def check_builder() -> None:
    """The builder and ONNX Runtime are installed (checked without importing them)."""
    for module in ("onnxruntime_genai", "onnxruntime", "onnx", "onnx_ir"):
        if importlib.util.find_spec(module) is None:
            raise ConfigError(f"the ONNX runtime needs {module}, which is not installed: {ONNX.extra}")


def source_files(model_dir: Path) -> list[Path]:
    """The files of `model_dir` the builder reads (weights, configs, tokenizer): its own fetch marker,
    subfolders and hidden files excluded."""
    return sorted(p for p in Path(model_dir).iterdir() if p.is_file() and p.suffix in SOURCE_SUFFIXES
                  and p.name != FETCH_MARKER and not p.name.startswith("."))


def onnx_artifact(model_dir: Path | str, variant: str = DEFAULT_VARIANT) -> artifact.Artifact:
    """The `variant` conversion of `model_dir` as a cached artifact: built from the files the builder reads
    (config.json always: without it the folder is refused), by this builder pin and graph edit."""
    model_dir = Path(model_dir)
    inputs = tuple(sorted({p.name for p in source_files(model_dir)} | {"config.json"}))
    recipe = {"version": MARKER_VERSION, "builder": BUILDER, "variant": _check_variant(variant)}
    return artifact.Artifact(model_dir, onnx_dir(model_dir, variant).name, inputs, recipe,
                             label=f"ONNX {variant} conversion", required=("model.onnx", "genai_config.json"))


def ensure_onnx(model_dir: Path | str, variant: str = DEFAULT_VARIANT, log: Log = print, *,
                verify: bool = False) -> Path:
    """The `variant` conversion of the HF causal-LM folder `model_dir`, built on first use (minutes
    for a 1.5B model) and reused while its source is unchanged. `verify` also hashes the outputs
    (and the source files) against the marker. Returns the conversion's folder."""
    model_dir = Path(model_dir).expanduser()
    _check_variant(variant)
    if not model_dir.is_dir():
        raise ModelError(f"model directory {str(model_dir)!r} does not exist: check the path")
    check_builder()
    return artifact.ensure(onnx_artifact(model_dir, variant), partial(_build, model_dir, variant), log,
                           hashes=verify, rehash_source=verify)


def _build(model_dir: Path, variant: str, tmp: Path) -> dict:
    """Run the builder into `tmp` and edit its graph; the marker's extras."""
    precision, options = VARIANTS[variant]
    cache = tmp / "builder-cache"
    log_path = onnx_dir(model_dir, variant).with_name(f".onnx-{variant}.builder.log")  # outlives a failed build
    command = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(model_dir), "-o", str(tmp),
               "-p", precision, "-e", "cpu", "-c", str(cache), "--extra_options", *options, "hf_token=false"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TQDM_DISABLE": "1"}
    with open(log_path, "w") as builder_log:
        done = subprocess.run(command, stdout=builder_log, stderr=subprocess.STDOUT, env=env, cwd=tmp)
    if done.returncode != 0 or not (tmp / "model.onnx").is_file():
        raise ModelError(f"the ONNX builder failed on {model_dir.name} (exit {done.returncode}: "
                         f"{_last_line(log_path)}): its log is {log_path}")
    log_path.unlink()
    shutil.rmtree(cache, ignore_errors=True)
    if variant not in UNEDITED:
        keep_last_rows(tmp / "model.onnx")
    return {"command": command[1:], "onnxruntime": artifact.package_version("onnxruntime")}


def keep_last_rows(model_path: Path) -> None:
    """Add an int64 input `num_logits_to_keep` [1] and slice the output head's input to the last
    that many rows of the block (weights untouched: the graph file alone is rewritten)."""
    import onnx
    from onnx import TensorProto, helper

    model = onnx.load(str(model_path), load_external_data=False)
    graph = model.graph
    if any(i.name == KEEP_INPUT for i in graph.input):
        return
    (head,) = [n for n in graph.node if n.name.startswith("/lm_head/")
               and n.op_type in ("MatMul", "MatMulNBits") and n.input[0] not in ("", None)] or [None]
    if head is None:
        raise ModelError(f"{model_path}: no /lm_head/ MatMul in the built graph: this builder version is not {BUILDER}")
    graph.input.append(helper.make_tensor_value_info(KEEP_INPUT, TensorProto.INT64, [1]))
    hidden, kept = head.input[0], "/lm_head/keep/Slice/output_0"
    graph.initializer.extend([
        helper.make_tensor("/lm_head/keep/ends", TensorProto.INT64, [1], [2**62]),
        helper.make_tensor("/lm_head/keep/axes", TensorProto.INT64, [1], [1]),
    ])
    nodes = [helper.make_node("Neg", [KEEP_INPUT], ["/lm_head/keep/Neg/output_0"], name="/lm_head/keep/Neg"),
             helper.make_node("Slice", [hidden, "/lm_head/keep/Neg/output_0", "/lm_head/keep/ends", "/lm_head/keep/axes"],
                              [kept], name="/lm_head/keep/Slice")]
    head.input[0] = kept
    at = list(graph.node).index(head)
    for offset, node in enumerate(nodes):
        graph.node.insert(at + offset, node)
    for output in graph.output:
        if output.name == "logits":
            output.type.tensor_type.shape.dim[1].dim_param = KEEP_INPUT
    onnx.save(model, str(model_path))


def _last_line(path: Path) -> str:
    try:
        lines = [line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return "no log"
    return lines[-1][:300] if lines else "no output"


def load_onnx(model_dir: Path | str, log: Callable[[str], Any] = print, *, variant: str = DEFAULT_VARIANT,
              name: str = "", spin: bool = True, max_positions: int | None = None) -> OnnxRuntimeBackend:
    """The HF causal-LM folder `model_dir` in ONNX Runtime: its `variant` conversion (built on first
    use, ensure_onnx) loaded into an OnnxRuntimeBackend."""
    if variant in UNEDITED:
        raise ConfigError(f"the ONNX variant {variant!r} is onnxruntime-genai's own graph, without the input a verify "
                          f"block needs: load one of {', '.join(sorted(set(VARIANTS) - UNEDITED))}")
    folder = ensure_onnx(model_dir, variant, log)
    return OnnxRuntimeBackend(folder, name=name or Path(model_dir).name, spin=spin, max_positions=max_positions)
