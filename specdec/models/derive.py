"""Edge drafters derived from a model at load time, named `MODEL@OP[+OP...]`:

    int8   dynamic int8 quantization of every nn.Linear, output head included (weights int8 with
           one scale per tensor, activations quantized per call at run time;
           torch.ao.quantization.quantize_dynamic), float32 rest. Whisper and causal LMs.
    int8c  the same with one weight scale per output channel (per_channel_dynamic_qconfig): closer
           to the float weights where a few rows have outlying ranges, at about the same speed.
           Whisper and causal LMs.
    int8t  int8 with activations quantized per token (`TokenScaledInt8`) and, in a causal LM,
           attention computed row by row (`rowwise_attention`): a row's logits are bit for bit
           the same alone or batched beside other rows and padding, so a batching server's
           verdicts are a session's own; slower per Linear than int8 (a few elementwise passes
           and one anchor row) and one attention call per batched row.
    decN   the decoder's first N layers only (the final norm and tied head are kept): a
           layer-skipping drafter in the style of LayerSkip / self-speculative decoding
           (Elhoushi et al. 2024; Zhang et al. 2023). Whisper only.

e.g. `whisper-base@dec2`, `whisper-base@dec2+int8`, `/path/to/whisper@int8`, `qwen2.5-coder-1.5b@int8`
(what torch's dynamic-int8 runtime runs). Ops apply left to right. Nothing is written to disk: the
base is loaded, then transformed in memory. The registry's derived entries (`from` + `derive` in
models.toml) name such pairs; both spellings load the same. A derived edge shares its base's
tokenizer by construction, so it pairs with the base.
"""
from __future__ import annotations

import re
import warnings
from pathlib import Path

import torch
from torch import nn

from specdec.errors import ModelError

_DEC = re.compile(r"^dec([1-9][0-9]*)$")
_TINY = 1e-12  # a token's scale floor: an all-zero row stays zeros, not NaN
INT8 = ("int8", "int8c", "int8t")  # per tensor, per output channel; int8t: activations per token (batch-invariant)
OPS_HELP = "int8, int8c (per-channel int8), int8t (per-token int8), decN (first N decoder layers)"
CAUSAL_OPS = INT8  # what a causal LM can derive (decN truncates Whisper's decoder only)


def parse_ops(text: str) -> tuple[str, ...]:
    """'dec2+int8' -> ('dec2', 'int8'), each checked."""
    ops = tuple(op.strip() for op in text.split("+"))
    for op in ops:
        if op not in INT8 and not _DEC.match(op):
            raise ModelError(f"unknown derivation {op!r} in {text!r}: use {OPS_HELP}, joined with '+'")
    if len(set(ops)) != len(ops) or len(set(ops) & set(INT8)) > 1:
        raise ModelError(f"derivation {text!r} repeats an op (int8, int8c and int8t are one op, quantized three ways)")
    return ops


def split_name(name: str) -> tuple[str, tuple[str, ...]]:
    """'whisper-base@dec2' -> ('whisper-base', ('dec2',)); a name without '@', or an existing
    directory whose name has one, -> (name, ())."""
    base, sep, ops = name.rpartition("@")
    if sep and Path(name).expanduser().is_dir():
        return name, ()
    if not sep:
        return name, ()
    if not base:
        raise ModelError(f"model name {name!r} has derivations but no model before '@'")
    return base, parse_ops(ops)


def needs_float32(ops: tuple[str, ...]) -> bool:
    """Dynamic int8 Linear layers take float32 activations only."""
    return bool(set(INT8) & set(ops))


def check_derivable(model_type: str, ops: tuple[str, ...]) -> None:
    """Whisper takes every op; any other model (a causal LM) the int8 ones only."""
    if model_type == "whisper":
        return
    if other := [op for op in ops if op not in CAUSAL_OPS]:
        raise ModelError(f"derivation @{other[0]} is implemented for Whisper only, not {model_type!r}: "
                         f"a {model_type!r} model takes @int8 or @int8c")


def derive(model, ops: tuple[str, ...]):
    """Apply `ops` in order to a loaded model (in place) and return it."""
    check_derivable(model.config.model_type, ops)
    for op in ops:
        if op in INT8:
            model = quantize_int8(model, per_channel=op == "int8c", per_token=op == "int8t")
        else:
            layers = _DEC.match(op)
            assert layers is not None  # parse_ops let only INT8 and decN through
            model = truncate_decoder(model, int(layers.group(1)))
    if needs_float32(ops):
        give_back_memory()
    return model.eval()


def give_back_memory() -> None:
    """Collect the float model's remains (the loader's reference cycles kept the checkpoint mapped until a
    collection) and hand freed heap back to the OS (glibc keeps it otherwise): a 1.5B loaded @int8t went
    from 11.6 GB resident to 4.5 after the collection and 3.0 after the trim (2026-11-25)."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: the heap stays as the allocator leaves it
        pass


def truncate_decoder(model, n_layers: int):
    decoder = model.model.decoder
    total = len(decoder.layers)
    if not 1 <= n_layers < total:
        raise ModelError(f"dec{n_layers}: the decoder has {total} layers, keep between 1 and {total - 1}")
    decoder.layers = nn.ModuleList(list(decoder.layers)[:n_layers])
    model.config.decoder_layers = n_layers
    return model


def quantize_int8(model, per_channel: bool = False, per_token: bool = False):
    """Every nn.Linear -> a dynamic int8 Linear (in place): y = dequant(W_q) x_q, x quantized per call
    (per tensor), W_q int8 with one scale per tensor, or per output row when `per_channel`; with
    `per_token`, wrapped in a `TokenScaledInt8` (x quantized per token: batch-invariant)."""
    if next(model.parameters()).dtype != torch.float32:
        raise ModelError("int8 derivation needs the model in float32 (dynamic quantization runs float32 activations)")
    with warnings.catch_warnings():  # torch.ao.quantization is deprecated in favour of torchao, not installed here
        warnings.simplefilter("ignore")
        from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

        spec = {nn.Linear: per_channel_dynamic_qconfig} if per_channel else {nn.Linear}
        own_biases(model)  # before packing: a packed bias is a view of the tensor it was packed from
        model = quantize_dynamic(model, spec, dtype=torch.qint8, inplace=True)  # no second copy
    own_memory(model)
    if not per_token:
        return model
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, torch.ao.nn.quantized.dynamic.Linear):
                setattr(parent, name, TokenScaledInt8(child))
    if type(model).__name__.endswith("ForCausalLM"):  # a text LM (what a server batches): its attention too
        from specdec.models.rowwise_attention import install

        install(model)
    return model


def own_biases(model) -> None:
    """Copy every nn.Linear's bias out of the checkpoint before it is quantized (see `own_memory`).

    A quantized Linear packs its bias as a view of the float bias it was given, so Qwen2's q/k/v biases
    alone held the whole mapped file. Copying them before packing costs nothing; copying them after meant
    unpacking and repacking every weight (18 of a 1.5B's 28 s int8 load, 2026-11-25)."""
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.Linear) and module.bias is not None:
                module.bias.data = module.bias.data.clone()


def own_memory(model) -> None:
    """Copy the float tensors a quantized model keeps (embeddings, norms) out of the checkpoint.

    transformers maps a checkpoint's file and its float tensors are views of that mapping, so the few
    kept ones held the whole file's pages: a 1.5B loaded @int8t showed 8.1 GB resident, 6.1 GB of it the
    mapped checkpoint (clean file pages), against 3.0 GB once they are copies (2026-11-25). The biases a
    quantized Linear packs are copied before packing (`own_biases`)."""
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.data = parameter.data.clone()
        for module in model.modules():
            for name, buffer in module._buffers.items():
                if buffer is not None:
                    module._buffers[name] = buffer.clone()


class TokenScaledInt8(nn.Module):
    """torch's dynamic int8 Linear with its activations quantized per token instead of per call.

    The dynamic Linear quantizes a whole call's activations with one (scale, zero point) from its min
    and max, so a row's logits moved with the rows batched beside it (other sessions, padding). Here
    each row x is mapped onto [-1, 1] by its own range, x' = (x - c) / h with c, h its midpoint and
    half-range, and one anchor row holding -1 and +1 is appended: every call's range is then [-1, 1],
    so every row is quantized with the same fixed parameters on a grid as fine as its own range
    allows (a row alone gets at least the grid it got before), the int8 product is exact in int32, and

        y = W x + b = h · (W_q x')_deq + c · (W_q 1)_deq + b        ([M, out], W_q 1: row sums of W_q)

    is the same, bit for bit, for a row alone or in any batch."""

    row_sums: torch.Tensor  # buffers (register_buffer below)
    anchor: torch.Tensor

    def __init__(self, quantized: torch.ao.nn.quantized.dynamic.Linear) -> None:
        super().__init__()
        self.bias = quantized.bias()  # added after rescaling, not inside the scaled product
        weight = quantized.weight()
        quantized.set_weight_bias(weight, None)
        self.inner, self.in_features, self.out_features = quantized, quantized.in_features, quantized.out_features
        self.register_buffer("row_sums", weight.dequantize().sum(dim=1), persistent=False)  # [out]
        anchor = torch.zeros(1, self.in_features)
        anchor[0, 0], anchor[0, -1] = 1.0, -1.0  # in_features >= 2 for any model here
        self.register_buffer("anchor", anchor, persistent=False)

    def weight(self) -> torch.Tensor:
        """The quantized weight (a method, as the dynamic Linear has it)."""
        return self.inner.weight()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)  # [M, in]
        low, high = rows.amin(dim=1, keepdim=True), rows.amax(dim=1, keepdim=True)  # [M, 1]: one range per token
        center, half = (high + low) / 2, ((high - low) / 2).clamp(min=_TINY)
        # (x - c) / h can round to 1 + 1 ulp at a row's max: unclamped, that row would set the whole call's
        # quantization range instead of the anchor, and move every other row's rounding with it
        scaled = ((rows - center) / half).clamp(-1.0, 1.0)
        out = self.inner(torch.cat([scaled, self.anchor]))[:-1] * half + center * self.row_sums
        if self.bias is not None:
            out = out + self.bias
        return out.view(*x.shape[:-1], self.out_features)
