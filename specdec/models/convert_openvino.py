"""A Hugging Face causal LM folder (Qwen2, Llama) -> an OpenVINO IR with weight-compressed linears,
cached beside the model in `<model_dir>/openvino-<weights>/` (needs `openvino` and `nncf`).

The IR is stateless: the KV cache is explicit inputs and outputs, so a backend owns it as arrays and
rolls it back by slicing (specdec/backends/openvino.py):

    inputs   input_ids [1, n] int64, position_ids [1, n] int64 (explicit positions L .. L+n-1),
             logit_rows [keep] int64 (the block rows whose logits are computed: the head runs on them only),
             past_key.{i}, past_value.{i} [L, H_kv, D] float32, one pair per layer
    outputs  logits [keep, V] float32, new_key.{i}, new_value.{i} [n, H_kv, D] float32 (the block's rows only)

The past is laid out position-major ([L, H_kv, D], not HF's [1, H_kv, L, D]) so that the first L rows
of a growing buffer are one contiguous array, fed without a copy.

Attention (`attention`): "rowwise" (default) computes each query row of a block on its own, over exactly
the keys 0 .. its position, in an OpenVINO Loop over the rows (`_rows_attended`): a block's row then goes
through the same ops with the same shapes as the one-token step at its position, and since the int8
weight-compressed linears quantize activations per row (DYNAMIC_QUANTIZATION_GROUP_SIZE groups of a row)
and the norms and RoPE are per row, a block's logits equal its steps' bit for bit (measured on the real
0.5B and 1.5B: blocks of 2..16 after 1..300 cached tokens, and prefills of up to 316 rows). "sdpa" is one
SDPA over the block with a causal mask built from position_ids: ~2-3 ms less per extra row on the 1.5B,
but the SDPA kernel's work split depends on the block length, and the resulting f32 rounding, ~1e-7, is
turned by the int8 activation quantization of the next linear into logit moves of up to 0.3-0.46 on some
rows (the same effect specdec/models/rowwise_attention.py describes for torch).

Recipe (`convert`): transformers loads the weights in float32, a wrapper module (`KVWrapper`) builds a
DynamicCache from the past tensors and passes a prepared 4D mask (so transformers' mask code, whose
choices depend on shapes that tracing would freeze, never runs), `openvino.convert_model` traces it
(TorchScript) with a 2-row block on a 3-row past (2, not 1: transformers' sdpa path takes another branch
for one query row), `nncf.compress_weights` compresses the weights (data-free), `openvino.save_model`
writes the IR without fp16 compression. Peak memory: ~1.3x the float32 weights (9.4 GB for the 1.5B).

The IR is a cached artifact (specdec/models/artifact.py): built under a lock into a temporary folder beside
the cache and swapped in, its marker (`specbench-artifact.json`) written last with the recipe, the source
files' size, mtime and sha256 and the outputs' size and sha256. It is reused while the recipe and the source
match, and converted again when the source changed or the IR or its marker is damaged. A damaged source
(a safetensors file truncated or padded) is refused in one line before anything else.
"""
from __future__ import annotations

import gc
import json
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import cast

import torch

from specdec.backends.openvino import OPENVINO_PINS, OpenVinoBackend
from specdec.errors import ConfigError, ModelError
from specdec.models import artifact, registry

MARKER = artifact.MARKER
IR_XML, IR_BIN = "openvino_model.xml", "openvino_model.bin"
FORMAT = 2  # the IR's inputs/outputs and graph as described above; bump when either changes
MODEL_TYPES = ("qwen2", "llama")
SOURCE_FILES = ("config.json",)  # besides the *.safetensors files (and their index)
# Weight compression modes: nncf mode, group size (-1: per output channel), ratio of int4 layers.
# INT4 modes keep the embedding and the output head in INT8_ASYM (nncf's backup mode).
WEIGHTS = {
    "int8": ("INT8_ASYM", -1, None),
    "int4-g128": ("INT4_SYM", 128, 1.0),
    "int4-g64": ("INT4_SYM", 64, 1.0),
    "f32": (None, None, None),  # no compression: for checks (4 bytes a weight)
}
DEFAULT_WEIGHTS = "int8"
# How the graph attends (module docstring): "rowwise" blocks equal steps bit for bit, "sdpa" is a little faster.
ATTENTION = ("rowwise", "sdpa")
DEFAULT_ATTENTION = "rowwise"
ROWWISE = "specbench_ov_rowwise"


def ir_dir(model_dir: Path | str, weights: str = DEFAULT_WEIGHTS, attention: str = DEFAULT_ATTENTION) -> Path:
    """Where the IR of `model_dir` compressed as `weights` is cached."""
    return Path(model_dir) / f"openvino-{weights}{'' if attention == DEFAULT_ATTENTION else '-' + attention}"


def convert(model_dir: Path | str, weights: str = DEFAULT_WEIGHTS, log: Callable[[str], None] | None = None,
            hashes: bool = True, attention: str = DEFAULT_ATTENTION) -> Path:
    """The folder holding the IR of `model_dir` (IR_XML, IR_BIN, MARKER), converted on first use and
    whenever the source changed or the IR is damaged. `hashes`: check the outputs' sha256 (else their sizes
    only) on reuse."""
    log = log or (lambda message: None)
    model_dir = Path(model_dir)
    if weights not in WEIGHTS:
        raise ConfigError(f"unknown OpenVINO weight compression {weights!r}: use one of {', '.join(WEIGHTS)}")
    if attention not in ATTENTION:
        raise ConfigError(f"unknown OpenVINO attention {attention!r}: use one of {', '.join(ATTENTION)}")
    spec = ir_artifact(model_dir, weights, attention)
    return artifact.ensure(spec, partial(_build, model_dir, spec.recipe), log, hashes=hashes)


def ir_artifact(model_dir: Path | str, weights: str = DEFAULT_WEIGHTS,
                attention: str = DEFAULT_ATTENTION) -> artifact.Artifact:
    """The IR of `model_dir` as a cached artifact: built from its config and safetensors by this recipe."""
    model_dir = Path(model_dir)
    return artifact.Artifact(model_dir, ir_dir(model_dir, weights, attention).name, _check_source(model_dir),
                             _recipe(weights, attention), label=f"OpenVINO {weights} IR ({attention} attention)",
                             required=(IR_XML, IR_BIN))


def read_marker(folder: Path | str) -> dict | None:
    return registry.read_marker(Path(folder), MARKER)


def load_openvino(model_dir: Path | str, log: Callable[[str], None] | None = None, weights: str = DEFAULT_WEIGHTS,
                  name: str = "", config: dict | None = None, hashes: bool = True,
                  attention: str = DEFAULT_ATTENTION) -> OpenVinoBackend:
    """An OpenVinoBackend of the HF causal LM folder `model_dir`, converted (and cached beside it in
    `openvino-<weights>/`) on first use. `config`: OpenVINO CPU properties over the backend's DEFAULT_CONFIG;
    `hashes`: check the cached IR's sha256 (about 2 s for the 1.5B's 1.8 GB) besides its sizes."""
    model_dir = Path(model_dir)
    folder = convert(model_dir, weights, log=log, hashes=hashes, attention=attention)
    return open_ir(folder, name=name or model_dir.name, config=config, eos_ids=generation_eos_ids(model_dir))


def open_ir(folder: Path | str, name: str = "", config: dict | None = None,
            eos_ids: frozenset[int] = frozenset()) -> OpenVinoBackend:
    """An OpenVinoBackend of a folder `convert` made (no checks of its files: `convert` makes them)."""
    folder = Path(folder)
    marker = registry.read_marker(folder, MARKER)
    if marker is None or not isinstance(marker.get("model"), dict):
        raise ModelError(f"{folder} is not an OpenVINO copy made by specbench (no readable {MARKER}): convert the "
                         "model folder with specdec.models.convert_openvino.load_openvino")
    return OpenVinoBackend(folder / IR_XML, marker["model"], name=name or folder.parent.name, config=config,
                           eos_ids=eos_ids)


def generation_eos_ids(model_dir: Path | str) -> frozenset[int]:
    """The eos ids a HF folder declares (generation_config.json, then config.json)."""
    ids: set[int] = set()
    for name in ("generation_config.json", "config.json"):
        try:
            value = json.loads((Path(model_dir) / name).read_text()).get("eos_token_id")
        except (OSError, ValueError, AttributeError):
            continue
        if value is not None:
            ids.update(value if isinstance(value, list) else [value])
    return frozenset(int(i) for i in ids)


# --- source -------------------------------------------------------------------------------------
def _source_names(model_dir: Path) -> list[str]:
    names = sorted(p.name for p in model_dir.glob("*.safetensors")) + sorted(
        p.name for p in model_dir.glob("*.safetensors.index.json"))
    return [n for n in SOURCE_FILES if (model_dir / n).is_file()] + names


def _check_source(model_dir: Path) -> tuple[str, ...]:
    """The files the conversion reads; the folder's damage is artifact.ensure's to find."""
    if not (model_dir / "config.json").is_file():
        raise ModelError(f"{model_dir} is not a Hugging Face model folder (no config.json): point at one")
    names = _source_names(model_dir)
    if not any(n.endswith(".safetensors") for n in names):
        raise ModelError(f"{model_dir} has no .safetensors weights: the OpenVINO conversion reads safetensors only")
    return tuple(names)


def _recipe(weights: str, attention: str) -> dict:
    """What made an IR: a cached one made otherwise is converted again. Versions from the installed
    metadata (importing nncf to ask it costs a second at every load)."""
    versions = {package: artifact.package_version(package) for package in ("openvino", "nncf", "transformers")}
    if missing := [package for package, version in versions.items() if not version]:
        raise ConfigError(f"the OpenVINO conversion needs {missing[0]}, which is not installed: {OPENVINO_PINS}")
    return {"format": FORMAT, "weights": weights, "attention": attention, **versions}


# --- build --------------------------------------------------------------------------------------
def _build(model_dir: Path, recipe: dict, tmp: Path) -> dict:
    """Trace, compress and save the IR into `tmp`; the marker's extras."""
    import openvino

    try:
        ov_model, info = export(model_dir, recipe["attention"])
        ov_model = compress(ov_model, recipe["weights"])
        openvino.save_model(ov_model, tmp / IR_XML, compress_to_fp16=False)
        del ov_model
    finally:
        gc.collect()  # the float32 torch model and the traced graph: GBs for a 1.5B
    return {"model": info}


class KVWrapper(torch.nn.Module):
    """A causal LM as a function of (input_ids, position_ids, logit_rows, *past) -> (logits, *new k/v)."""

    def __init__(self, model) -> None:
        super().__init__()
        self.model = model
        self.layers = model.config.num_hidden_layers

    def forward(self, input_ids, position_ids, logit_rows, *past):
        from transformers import DynamicCache

        n = input_ids.shape[1]
        cache = DynamicCache(config=self.model.config)
        for index, layer in enumerate(cache.layers):
            keys = past[2 * index].permute(1, 0, 2).unsqueeze(0)  # [L, H, D] -> [1, H, L, D]
            values = past[2 * index + 1].permute(1, 0, 2).unsqueeze(0)
            # Set, not update(): update's lazy init concatenates onto an empty 1-D tensor, which does not convert.
            layer.keys, layer.values, layer.device, layer.is_initialized = keys, values, keys.device, True
        key_positions = torch.arange(past[0].shape[0] + n, dtype=torch.long)
        hidden = position_ids[0].unsqueeze(1) < key_positions.unsqueeze(0)  # [n, L+n]: key after the query
        mask = torch.zeros(hidden.shape, dtype=torch.float32).masked_fill(hidden, torch.finfo(torch.float32).min)
        out = self.model.model(input_ids=input_ids, position_ids=position_ids, attention_mask=mask[None, None],
                               cache=cache, use_cache=True)
        logits = self.model.lm_head(out.last_hidden_state[0].index_select(0, logit_rows))
        new = []
        for layer in cache.layers:
            new.append(layer.keys[0, :, -n:].permute(1, 0, 2))  # [n, H, D]
            new.append(layer.values[0, :, -n:].permute(1, 0, 2))
        return (logits, *new)


def model_info(config) -> dict:
    heads = config.num_attention_heads
    return {"model_type": config.model_type, "layers": config.num_hidden_layers,
            "kv_heads": getattr(config, "num_key_value_heads", None) or heads,
            "head_dim": getattr(config, "head_dim", None) or config.hidden_size // heads,
            "vocab_size": config.vocab_size, "max_positions": config.max_position_embeddings}


def load_torch(model_dir: Path, attention: str = "sdpa"):
    """The HF model in float32 with `attention` (sdpa or rowwise), its type checked and every weight loaded."""
    from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedModel

    try:
        config = AutoConfig.from_pretrained(model_dir)
        if config.model_type not in MODEL_TYPES:
            raise ModelError(f"{model_dir} is a {config.model_type!r} model: the OpenVINO conversion takes "
                             f"{' or '.join(MODEL_TYPES)} causal LMs")
        if "sliding_attention" in (getattr(config, "layer_types", None) or ()):
            raise ModelError(f"{model_dir} has sliding-window layers, which the OpenVINO conversion does not mask")
        # output_loading_info: (model, what the load found), which transformers types as the model alone
        model, info = cast(tuple[PreTrainedModel, dict], AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=torch.float32, attn_implementation="sdpa", output_loading_info=True))
    except (OSError, ValueError) as e:
        raise ModelError(f"cannot load {model_dir} for the OpenVINO conversion: {e}") from e
    if info["missing_keys"] or info["mismatched_keys"]:
        raise ModelError(f"cannot convert {model_dir}: its weights lack or mismatch tensors "
                         f"({sorted(info['missing_keys'] or info['mismatched_keys'])[0]}): restore the weight files")
    if attention == "rowwise":
        from transformers import AttentionInterface

        AttentionInterface.register(ROWWISE, rowwise_attention)
        model.set_attn_implementation(ROWWISE)
    return model.eval()


@torch.jit.script
def _rows_attended(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scaling: float) -> torch.Tensor:
    """query [1, H, q, d] at the last q positions of key/value [1, H_kv, kv, d] (head h reads kv head
    h // (H / H_kv), as transformers' repeat_kv lays them out): each query row attends keys 0 .. its own
    position on its own, with the shapes a one-token step at that position has. Scripted, so that tracing
    keeps the loop (an OpenVINO Loop over the block's rows) instead of unrolling it.

    The weights times values product gets a leading zero weight on a zero value row (exact: 0 * 0 adds
    +0.0): OpenVINO 2026.4.1's CPU plugin computes a MatMul in a Loop body wrongly for every later
    reduction of 16+ when the first one it ran reduced over a single key (a prompt's first row), and
    so does its SDPA there; with the zero row the reduction is never over one key."""
    heads, rows, dim = query.size(1), query.size(2), query.size(3)
    kv_heads = key.size(1)
    groups = heads // kv_heads
    start = key.size(2) - rows
    grouped = query.reshape(1, kv_heads, groups, rows, dim)
    keys_t = key.transpose(2, 3)  # [1, H_kv, d, kv]
    values = torch.cat([torch.zeros_like(value[:, :, :1]), value], dim=2)  # [1, H_kv, 1 + kv, d]
    zero_weight = torch.zeros_like(grouped[:, :, :, 0, :1])  # [1, H_kv, G, 1]
    out = []
    for i in range(rows):
        end = start + i + 1
        scores = torch.matmul(grouped[:, :, :, i], keys_t[:, :, :, :end]) * scaling  # [1, H_kv, G, end]
        weights = torch.cat([zero_weight, torch.softmax(scores, dim=-1)], dim=3)
        out.append(torch.matmul(weights, values[:, :, : end + 1]).reshape(1, heads, 1, dim))
    return torch.cat(out, dim=2)


def rowwise_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs):
    """A transformers attention function (the mask is implied: the block's queries are causal over the past
    and the block); returns [1, q, H, d] as transformers' SDPA does."""
    scale = float(scaling if scaling is not None else query.shape[-1] ** -0.5)
    return _rows_attended(query, key, value, scale).transpose(1, 2).contiguous(), None


def export(model_dir: Path, attention: str = DEFAULT_ATTENTION):
    """(openvino.Model in float32 with named, dynamic inputs/outputs, model_info) of the HF folder."""
    import openvino

    model = load_torch(model_dir, attention)
    info = model_info(model.config)
    layers, heads, dim = info["layers"], info["kv_heads"], info["head_dim"]
    past_len, n = 3, 2  # n >= 2: see the module docstring
    example = (torch.zeros(1, n, dtype=torch.long), torch.arange(past_len, past_len + n).unsqueeze(0),
               torch.arange(n), *[torch.zeros(past_len, heads, dim) for _ in range(2 * layers)])
    with torch.no_grad():
        ov_model = openvino.convert_model(KVWrapper(model), example_input=example)
    del model
    past_names = [f"past_{kv}.{i}" for i in range(layers) for kv in ("key", "value")]
    shapes = {"input_ids": [1, -1], "position_ids": [1, -1], "logit_rows": [-1]}
    for port, name in zip(ov_model.inputs, ["input_ids", "position_ids", "logit_rows", *past_names]):
        port.get_tensor().set_names({name})
        shapes.setdefault(name, [-1, heads, dim])
    ov_model.reshape({name: openvino.PartialShape(shape) for name, shape in shapes.items()})
    out_names = ["logits"] + [f"new_{kv}.{i}" for i in range(layers) for kv in ("key", "value")]
    for port, name in zip(ov_model.outputs, out_names):
        port.get_tensor().set_names({name})
    for key, value in info.items():
        ov_model.set_rt_info(str(value), ["specbench", key])
    _unshare_constants(ov_model)
    return ov_model, info


def _unshare_constants(ov_model) -> None:
    """Give each Loop body its own copies of constants the torch frontend shares between the body and the
    main graph: nncf walks a constant's consumers by name and fails on one inside a body."""
    import openvino

    main = {op.get_instance_id() for op in ov_model.get_ops()}
    for op in ov_model.get_ops():
        if op.get_type_name() != "Constant":
            continue
        for target in list(op.output(0).get_target_inputs()):
            if target.get_node().get_instance_id() not in main:
                copy = openvino.opset13.constant(op.get_data(), dtype=op.get_element_type(), shared_memory=False)
                target.replace_source_output(copy.output(0))


def compress(ov_model, weights: str):
    """`ov_model` with its weights compressed as `weights` (data-free nncf)."""
    mode, group, ratio = WEIGHTS[weights]
    if mode is None:
        return ov_model
    import nncf

    kwargs = {"mode": getattr(nncf.CompressWeightsMode, mode)}
    if group != -1:
        kwargs.update(group_size=group, ratio=ratio)
    return nncf.compress_weights(ov_model, **kwargs)
