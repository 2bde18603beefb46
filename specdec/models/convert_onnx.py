"""A Hugging Face causal-LM folder -> an ONNX model for ONNX Runtime's CPU provider, built once by
onnxruntime-genai's model builder and kept beside the model:

    <model dir>/onnx-<variant>/model.onnx (+ model.onnx.data)   the graph and its weights
    <model dir>/onnx-<variant>/genai_config.json                 layers, heads, vocabulary, eos ids
    <model dir>/onnx-<variant>/specbench.json                    the marker, written last: the source files'
                                                                  size, mtime and sha256, the outputs' size
                                                                  and sha256, the builder's pin and command

Variants (`VARIANTS`): `int4` and `int8` are weight-only quantized MatMulNBits (block 32, symmetric,
round to nearest) with accuracy_level 4: activations are quantized to int8 per block of each row and
multiplied in MLAS' int8 kernels (VNNI where the CPU has it). The embedding table stays float32.

The build runs the builder in a child process (it loads the float32 torch model: a peak RSS of
~2.5x the safetensors bytes, 17 GB for the 1.5B; 40 s for the 0.5B, 100 s for the 1.5B int4), from the local folder only (no hub: HF_HUB_OFFLINE and hf_token=false),
into a temporary folder renamed into place when complete; one build per model folder at a time (an
flock on the folder). After the builder, one edit of the graph (`keep_last_rows`): an input
`num_logits_to_keep` [1] slices the final hidden states to their last rows before the output head,
so a prefill computes the logits of the rows it keeps only (the builder's prune_lm_head keeps one
row, which a verify block cannot use).

Reuse: the marker's source record must match the folder's weights, config and tokenizer files
(sizes and mtimes compared at every use; a file whose mtime moved is hashed again); a changed
source is rebuilt. A damaged source (a file of another size than its own folder's marker says, a
truncated safetensors) or damaged output (a file missing or of another size than recorded; other
bytes with `verify=True`) is refused in one line naming the file and the fix.
"""
from __future__ import annotations

import fcntl
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from specdec.backends.base import ONNX_EXTRA
from specdec.backends.onnxrt import KEEP_INPUT, OnnxRuntimeBackend
from specdec.errors import ConfigError, ModelError
from specdec.models import integrity
from specdec.models.registry import MARKER, read_marker

Log = Callable[[str], object]

BUILDER = "onnxruntime-genai==0.18.0"  # with onnxruntime 1.32.0, onnx 1.23.2, onnx-ir 1.1.0
# variant -> (builder precision, builder extra options)
VARIANTS = {
    "int4": ("int4", ("accuracy_level=4",)),
    "int8": ("int8", ("accuracy_level=4",)),
}
DEFAULT_VARIANT = "int4"
SOURCE_SUFFIXES = (".safetensors", ".json", ".jinja", ".txt", ".model", ".tiktoken")  # what the builder reads
MARKER_VERSION = 1


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
            raise ConfigError(f"the ONNX runtime needs {module}, which is not installed: {ONNX_EXTRA}")


def source_files(model_dir: Path) -> list[Path]:
    """The files of `model_dir` the builder reads (weights, configs, tokenizer): its own marker,
    subfolders and hidden files excluded."""
    return sorted(p for p in Path(model_dir).iterdir()
                  if p.is_file() and p.suffix in SOURCE_SUFFIXES and p.name != MARKER and not p.name.startswith("."))


def source_record(model_dir: Path, previous: dict[str, dict] | None = None) -> dict[str, dict]:
    """{name: {size, mtime_ns, sha256}} of the source files; a file whose size and mtime equal
    `previous`'s keeps its recorded sha256 (hashing 7 GB at every load is too slow)."""
    out = {}
    for path in source_files(model_dir):
        stat = path.stat()
        known = (previous or {}).get(path.name)
        same = known is not None and known.get("size") == stat.st_size and known.get("mtime_ns") == stat.st_mtime_ns
        out[path.name] = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns,
                          "sha256": known["sha256"] if same else integrity.sha256_of(path)}
    return out


def _same_source(a: dict[str, dict], b: dict[str, dict]) -> bool:
    strip = lambda record: {name: (e["size"], e["sha256"]) for name, e in record.items()}  # noqa: E731
    return strip(a) == strip(b)


def source_problem(model_dir: Path, hashed: dict[str, dict] | None = None) -> str | None:
    """What is wrong with the source folder (its files against the sizes its own marker records,
    when it has one, and with `hashed` = a fresh `source_record` against its sha256s too; each
    safetensors file against its header), or None."""
    if not (model_dir / "config.json").is_file():
        return "config.json is missing"
    recorded = (read_marker(model_dir) or {}).get("files") or {}
    found = integrity.problems(model_dir, recorded)
    for name, entry in (hashed or {}).items():
        if name in recorded and entry["sha256"] != recorded[name].get("sha256"):
            found.append(f"{name} has other bytes than when it was fetched (sha256 differs)")
    return found[0] if found else None


def _refuse_source(model_dir: Path, problem: str) -> ModelError:
    return ModelError(f"cannot convert {model_dir.name} to ONNX: {problem} in {model_dir}: restore that file "
                      "(fetch the model again)")


def ensure_onnx(model_dir: Path | str, variant: str = DEFAULT_VARIANT, log: Log = print, *,
                verify: bool = False) -> Path:
    """The `variant` conversion of the HF causal-LM folder `model_dir`, built on first use (minutes
    for a 1.5B model) and reused while its source is unchanged. `verify` also hashes the outputs
    (and the source files) against the marker. Returns the conversion's folder."""
    model_dir = Path(model_dir).expanduser()
    out = onnx_dir(model_dir, variant)
    if not model_dir.is_dir():
        raise ModelError(f"model directory {str(model_dir)!r} does not exist: check the path")
    if problem := source_problem(model_dir):
        raise _refuse_source(model_dir, problem)
    check_builder()
    with _locked(model_dir):
        marker, now = read_marker(out), None
        if marker is not None and marker.get("version") == MARKER_VERSION and marker.get("builder") == BUILDER:
            recorded = marker.get("source", {})
            now = source_record(model_dir, None if verify else recorded)
            if verify and (problem := source_problem(model_dir, now)):
                raise _refuse_source(model_dir, problem)
            if _same_source(now, recorded):
                if found := integrity.problems(out, marker.get("files"), hashes=verify):
                    raise ModelError(f"the ONNX {variant} conversion of {model_dir.name} is damaged: {found[0]} in {out}: "
                                     f"delete {out} and it is built again on the next load")
                if now != recorded:  # same bytes, touched files: record the new mtimes, skip hashing next time
                    _write_json(out / MARKER, {**marker, "source": now})
                return out
            log(f"the source of {out} changed since it was converted: converting {model_dir.name} again ...")
        elif marker is not None:
            log(f"{out} was built by another builder ({marker.get('builder')}): converting {model_dir.name} again ...")
        elif out.exists():
            log(f"{out} has no marker (an interrupted or foreign build): converting {model_dir.name} again ...")
        return _build(model_dir, variant, out, log, now)


def _build(model_dir: Path, variant: str, out: Path, log: Log, source: dict[str, dict] | None = None) -> Path:
    precision, options = VARIANTS[variant]
    tmp = out.with_name(f".{out.name}.tmp")  # also holds the builder's cache and log until it succeeds
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    cache, log_path = tmp / "builder-cache", tmp / "builder.log"
    source = source_record(model_dir, source)  # hashed before, sizes/mtimes checked after: a change mid-build is caught
    command = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(model_dir), "-o", str(tmp),
               "-p", precision, "-e", "cpu", "-c", str(cache), "--extra_options", *options, "hf_token=false"]
    log(f"converting {model_dir.name} to ONNX ({variant}, {BUILDER}; a one-time step of minutes) ...")
    start = time.perf_counter()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TQDM_DISABLE": "1"}
    with open(log_path, "w") as builder_log:
        done = subprocess.run(command, stdout=builder_log, stderr=subprocess.STDOUT, env=env, cwd=tmp)
    if done.returncode != 0 or not (tmp / "model.onnx").is_file():
        raise ModelError(f"the ONNX builder failed on {model_dir.name} (exit {done.returncode}: "
                         f"{_last_line(log_path)}): its log is {log_path}")
    shutil.rmtree(cache, ignore_errors=True)
    log_path.unlink()
    keep_last_rows(tmp / "model.onnx")
    if source_record(model_dir, source) != source:
        shutil.rmtree(tmp, ignore_errors=True)
        raise ModelError(f"{model_dir} changed while it was converted to ONNX: load it again")
    seconds = time.perf_counter() - start
    marker = {"version": MARKER_VERSION, "variant": variant, "builder": BUILDER, "command": command[1:],
              "onnxruntime": _version("onnxruntime"), "seconds": round(seconds, 1), "source": source,
              "files": integrity.record(tmp)}
    _write_json(tmp / MARKER, marker)  # last: its presence means complete
    old = out.with_name(f".{out.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    if out.exists():
        out.rename(old)
    tmp.rename(out)
    shutil.rmtree(old, ignore_errors=True)
    size = sum(e["size"] for e in marker["files"].values())
    log(f"converted {model_dir.name} to ONNX {variant} in {seconds:.0f} s ({size / 1e9:.2f} GB): {out}")
    return out


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


def _version(package: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return ""


def _write_json(path: Path, data: dict) -> None:
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(data, indent=1))
    partial.replace(path)


@contextmanager
def _locked(folder: Path) -> Iterator[None]:
    """One conversion of a folder at a time: an exclusive flock on the folder itself (no lock file
    beside the model's own files)."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def load_onnx(model_dir: Path | str, log: Callable[[str], Any] = print, *, variant: str = DEFAULT_VARIANT,
              name: str = "", spin: bool = True, max_positions: int | None = None) -> OnnxRuntimeBackend:
    """The HF causal-LM folder `model_dir` in ONNX Runtime: its `variant` conversion (built on first
    use, ensure_onnx) loaded into an OnnxRuntimeBackend."""
    folder = ensure_onnx(model_dir, variant, log)
    return OnnxRuntimeBackend(folder, name=name or Path(model_dir).name, spin=spin, max_positions=max_positions)
