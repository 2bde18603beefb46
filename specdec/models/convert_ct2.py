"""CTranslate2 Whisper checkpoints (`model.bin` + `config.json` + `tokenizer.json`) -> a Hugging Face
`WhisperForConditionalGeneration` directory. Needs neither ctranslate2 nor the network.

`model.bin` (binary version 6, little-endian; `ModelSpec._serialize` in CTranslate2's
python/ctranslate2/specs/model_spec.py):

    u32 version | str spec name | u32 spec revision | u32 n
    n x (str name | u8 ndim | ndim x u32 dim | u8 dtype id | u32 nbytes | nbytes of data)
    u32 m | m x (str alias | str target)          # e.g. decoder/projection/weight -> decoder/embeddings/weight
    str = u16 length (with the NUL) | utf-8 bytes | NUL

The Whisper layout (`WhisperSpec`) fuses projections: self-attention `linear_0` is q|k|v [3D, D]
and cross-attention `linear_1` is k|v [2D, D]. Whisper's k projection has no bias: its slice of the
fused bias is zero and is dropped. The output projection is an alias of the token embeddings
(tied). Special-token ids come from `tokenizer.json`, the suppression lists from `config.json`.

`convert_whisper` writes a directory (fetch.py caches the registry's); `ensure_whisper` converts a local
CTranslate2 Whisper folder once into `hf-<dtype>/` beside its files, a cached artifact
(specdec/models/artifact.py: lock, marker written last, swap-in, rebuilt when damaged).
"""
from __future__ import annotations

import json
import mmap
import re
import struct
from functools import partial
from pathlib import Path
from typing import cast

import numpy as np
import torch

from specdec.errors import ConfigError, ModelError
from specdec.models import artifact

CT2_DTYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16}  # 5 = bfloat16, unused here
SUPPORTED_VERSIONS = (5, 6)
N_MELS = 80  # every Whisper checkpoint before large-v3
TASKS = ("transcribe", "translate")
MULTILINGUAL_VOCAB = 51865
CT2_FILES = ("model.bin", "config.json", "tokenizer.json")  # and vocabulary.txt where the folder has one
DTYPES = ("float16", "bfloat16", "float32")
FORMAT = 1  # the directory convert_whisper writes; bump when it changes


class _Reader:
    def __init__(self, buffer) -> None:
        self.buffer, self.offset = buffer, 0

    def unpack(self, fmt: str):
        (value,) = struct.unpack_from("<" + fmt, self.buffer, self.offset)
        self.offset += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        n = self.unpack("H")  # includes the trailing NUL
        text = bytes(self.buffer[self.offset : self.offset + n - 1]).decode("utf-8")
        self.offset += n
        return text


def read_ct2(path: Path | str) -> tuple[str, dict[str, np.ndarray]]:
    """(spec name, {variable name: array}) of a CTranslate2 model.bin, aliases resolved.
    Arrays are copies: the file is closed on return."""
    path = Path(path)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buffer:
        r = _Reader(buffer)
        version = r.unpack("I")
        if version not in SUPPORTED_VERSIONS:
            raise ModelError(f"{path}: CTranslate2 binary version {version} is not supported (only {SUPPORTED_VERSIONS})")
        spec, _revision, n = r.string(), r.unpack("I"), r.unpack("I")
        variables: dict[str, np.ndarray] = {}
        for _ in range(n):
            name = r.string()
            shape = tuple(r.unpack("I") for _ in range(r.unpack("B")))
            dtype_id, nbytes = r.unpack("B"), r.unpack("I")
            if dtype_id not in CT2_DTYPES:
                raise ModelError(f"{path}: variable {name} has dtype id {dtype_id}, which this converter does not read")
            dtype = np.dtype(CT2_DTYPES[dtype_id])
            # One expression: the view into the map dies at once (a live view blocks closing it).
            variables[name] = np.frombuffer(buffer, dtype, nbytes // dtype.itemsize, r.offset).reshape(shape).copy()
            r.offset += nbytes
        for _ in range(r.unpack("I")):
            alias, target = r.string(), r.string()
            variables[alias] = variables[target]
        if r.offset != len(buffer):
            trailing = len(buffer) - r.offset
            raise ModelError(f"{path}: {trailing} trailing bytes after the variables: not a CTranslate2 model.bin")
    return spec, variables


def _linear(out: dict, hf: str, ct2: dict, name: str) -> None:
    out[f"{hf}.weight"] = ct2[f"{name}/weight"]
    out[f"{hf}.bias"] = ct2[f"{name}/bias"]


def _layer_norm(out: dict, hf: str, ct2: dict, name: str) -> None:
    out[f"{hf}.weight"] = ct2[f"{name}/gamma"]
    out[f"{hf}.bias"] = ct2[f"{name}/beta"]


def _split_attention(out: dict, hf: str, fused_weight: np.ndarray, fused_bias: np.ndarray, names: tuple[str, ...]) -> None:
    """Fused [len(names) * D, D] projection -> one Linear per name; k has no bias (its slice is 0)."""
    for name, weight, bias in zip(names, np.split(fused_weight, len(names)), np.split(fused_bias, len(names))):
        out[f"{hf}.{name}_proj.weight"] = weight
        if name == "k":
            if np.any(bias):
                raise ModelError("the fused k bias is not zero: this is not a Whisper checkpoint")
        else:
            out[f"{hf}.{name}_proj.bias"] = bias


def whisper_state_dict(ct2: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    """CTranslate2 WhisperSpec variables -> `WhisperForConditionalGeneration` state dict (tied head)."""
    out: dict[str, np.ndarray] = {}
    for part in ("encoder", "decoder"):
        hf = f"model.{part}"
        for i in range(_count_layers(ct2, part)):
            src, dst = f"{part}/layer_{i}", f"{hf}.layers.{i}"
            self_attn = f"{src}/self_attention"
            qkv = ct2[f"{self_attn}/linear_0/weight"], ct2[f"{self_attn}/linear_0/bias"]
            _split_attention(out, f"{dst}.self_attn", *qkv, ("q", "k", "v"))
            _linear(out, f"{dst}.self_attn.out_proj", ct2, f"{self_attn}/linear_1")
            _layer_norm(out, f"{dst}.self_attn_layer_norm", ct2, f"{self_attn}/layer_norm")
            if part == "decoder":
                cross = f"{src}/attention"
                _linear(out, f"{dst}.encoder_attn.q_proj", ct2, f"{cross}/linear_0")
                kv = ct2[f"{cross}/linear_1/weight"], ct2[f"{cross}/linear_1/bias"]
                _split_attention(out, f"{dst}.encoder_attn", *kv, ("k", "v"))
                _linear(out, f"{dst}.encoder_attn.out_proj", ct2, f"{cross}/linear_2")
                _layer_norm(out, f"{dst}.encoder_attn_layer_norm", ct2, f"{cross}/layer_norm")
            _linear(out, f"{dst}.fc1", ct2, f"{src}/ffn/linear_0")
            _linear(out, f"{dst}.fc2", ct2, f"{src}/ffn/linear_1")
            _layer_norm(out, f"{dst}.final_layer_norm", ct2, f"{src}/ffn/layer_norm")
        _layer_norm(out, f"{hf}.layer_norm", ct2, f"{part}/layer_norm")
        out[f"{hf}.embed_positions.weight"] = ct2[f"{part}/position_encodings/encodings"]
    for conv in ("conv1", "conv2"):
        _linear(out, f"model.encoder.{conv}", ct2, f"encoder/{conv}")
    out["model.decoder.embed_tokens.weight"] = ct2["decoder/embeddings/weight"]
    if not np.array_equal(ct2["decoder/projection/weight"], ct2["decoder/embeddings/weight"]):
        raise ModelError("the output projection is not tied to the token embeddings: not a Whisper checkpoint")
    return {name: torch.from_numpy(array) for name, array in out.items()}


def _count_layers(ct2: dict, part: str) -> int:
    layer = re.compile(rf"^{part}/layer_(\d+)/")
    return len({m.group(1) for name in ct2 if (m := layer.match(name))})


def whisper_config(ct2: dict[str, np.ndarray], tokens: dict[str, int]):
    """A `WhisperConfig` from the weights' shapes and the tokenizer's special ids."""
    from transformers import WhisperConfig

    vocab, d_model = ct2["decoder/embeddings/weight"].shape
    activation = int(ct2["decoder/activation"])
    if activation != 3:  # CTranslate2 ActivationType: 0 ReLU, 1 GELUTanh, 2 Swish, 3 GELU
        raise ModelError(f"decoder activation id {activation} is not GELU (3): not a Whisper checkpoint")
    if int(ct2["encoder/num_heads"]) != int(ct2["decoder/num_heads"]):
        raise ModelError("encoder and decoder head counts differ: not a Whisper checkpoint")
    if ct2["encoder/conv1/weight"].shape[1] != N_MELS:
        raise ModelError(f"the encoder takes {ct2['encoder/conv1/weight'].shape[1]} mel bins; only {N_MELS} are supported")
    eot = tokens["<|endoftext|>"]
    return WhisperConfig(
        vocab_size=vocab,
        num_mel_bins=N_MELS,
        d_model=d_model,
        encoder_layers=_count_layers(ct2, "encoder"),
        decoder_layers=_count_layers(ct2, "decoder"),
        encoder_attention_heads=int(ct2["encoder/num_heads"]),
        decoder_attention_heads=int(ct2["decoder/num_heads"]),
        encoder_ffn_dim=ct2["encoder/layer_0/ffn/linear_0/weight"].shape[0],
        decoder_ffn_dim=ct2["decoder/layer_0/ffn/linear_0/weight"].shape[0],
        max_source_positions=ct2["encoder/position_encodings/encodings"].shape[0],
        max_target_positions=ct2["decoder/position_encodings/encodings"].shape[0],
        activation_function="gelu",
        scale_embedding=bool(ct2["decoder/scale_embeddings"]),
        bos_token_id=eot,
        eos_token_id=eot,
        pad_token_id=eot,
        decoder_start_token_id=tokens["<|startoftranscript|>"],
        tie_word_embeddings=True,
    )


def whisper_generation_config(config, tokens: dict[str, int], suppress: list[int], suppress_begin: list[int]):
    """What `generate` needs for language / task / timestamps, as in the openai checkpoints.
    Multilingual iff the vocabulary has 51865+ rows (openai/whisper's rule): English-only
    tokenizers list the language tokens too, but those models never learnt them."""
    from transformers import GenerationConfig
    from transformers.models.whisper.tokenization_whisper import LANGUAGES

    multilingual = config.vocab_size >= MULTILINGUAL_VOCAB
    languages = {}
    if multilingual:  # generate() detects the language whenever lang_to_id exists, even empty: omit it
        languages = dict(
            lang_to_id={f"<|{c}|>": tokens[f"<|{c}|>"] for c in LANGUAGES if f"<|{c}|>" in tokens},
            task_to_id={task: tokens[f"<|{task}|>"] for task in TASKS},
        )
    return GenerationConfig(
        decoder_start_token_id=config.decoder_start_token_id,
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
        max_length=config.max_target_positions,
        suppress_tokens=list(suppress),  # generate's (and specdec's) logits processors, not the model's
        begin_suppress_tokens=list(suppress_begin),
        no_timestamps_token_id=tokens["<|notimestamps|>"],
        prev_sot_token_id=tokens.get("<|startofprev|>"),
        is_multilingual=multilingual,
        return_timestamps=False,
        **languages,
    )


def whisper_tokenizer(tokenizer_json: Path, vocab_size: int, vocabulary_txt: Path | None = None):
    """The tokenizer.json as a `WhisperTokenizer`, completed with the timestamp tokens
    `<|0.00|>` .. `<|30.00|>` that follow `<|notimestamps|>` in the model's vocabulary (CTranslate2's
    tokenizer.json stops before them; `vocabulary.txt`, when given, must agree)."""
    from transformers import AddedToken, WhisperTokenizer

    tokenizer = WhisperTokenizer(tokenizer_file=str(tokenizer_json), unk_token="<|endoftext|>", bos_token="<|endoftext|>",
                                 eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    first = len(tokenizer)
    no_timestamps = cast(int, tokenizer.convert_tokens_to_ids("<|notimestamps|>"))  # one token in, one id out
    if first != no_timestamps + 1:
        raise ModelError(f"{tokenizer_json}: <|notimestamps|> is not the last token: not a Whisper tokenizer")
    stamps = [f"<|{0.02 * i:.2f}|>" for i in range(vocab_size - first)]
    if vocabulary_txt is not None:
        listed = Path(vocabulary_txt).read_text(encoding="utf-8").split("\n")[first:vocab_size]
        if listed != stamps:
            raise ModelError(f"{vocabulary_txt} does not list the timestamp tokens after <|notimestamps|>")
    tokenizer.add_tokens([AddedToken(s, special=False, normalized=False) for s in stamps])
    if len(tokenizer) != vocab_size:
        raise ModelError(f"the tokenizer has {len(tokenizer)} tokens but the model {vocab_size} rows")
    return tokenizer


def convert_whisper(model_bin: Path, ct2_config: Path, tokenizer_json: Path, out: Path, *,
                    dtype: str = "float16", vocabulary_txt: Path | None = None) -> Path:
    """Write a `WhisperForConditionalGeneration` directory (weights in `dtype`, config, generation
    config, tokenizer, 80-bin feature extractor) converted from a CTranslate2 Whisper model."""
    from transformers import WhisperFeatureExtractor, WhisperForConditionalGeneration

    spec, ct2 = read_ct2(model_bin)
    if spec != "WhisperSpec":
        raise ModelError(f"{model_bin} holds a {spec}, not a WhisperSpec")
    meta = json.loads(Path(ct2_config).read_text())
    vocab_size = ct2["decoder/embeddings/weight"].shape[0]
    tokenizer = whisper_tokenizer(tokenizer_json, vocab_size, vocabulary_txt)
    tokens = {t: i for t, i in tokenizer.get_vocab().items() if t.startswith("<|") and t.endswith("|>")}
    config = whisper_config(ct2, tokens)
    config.alignment_heads = meta.get("alignment_heads")
    with torch.device("meta"):
        model = WhisperForConditionalGeneration(config)
    weights = {k: v.to(getattr(torch, dtype)) for k, v in whisper_state_dict(ct2).items()}
    missing, unexpected = model.load_state_dict(weights, strict=False, assign=True)
    if unexpected or set(missing) != {"proj_out.weight"}:
        raise ModelError(f"conversion mismatch: missing {missing}, unexpected {unexpected}")
    model.tie_weights()
    model.generation_config = whisper_generation_config(config, tokens, meta["suppress_ids"], meta["suppress_ids_begin"])
    lang_ids = sorted(getattr(model.generation_config, "lang_to_id", {}).values())
    if lang_ids and lang_ids != sorted(meta.get("lang_ids", [])):
        raise ModelError(f"{ct2_config}: lang_ids disagree with the tokenizer's language tokens")
    generation = model.generation_config
    generation.alignment_heads = meta.get("alignment_heads")  # type: ignore[attr-defined]  # an undeclared GenerationConfig field
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    WhisperFeatureExtractor(feature_size=N_MELS).save_pretrained(out)
    return out


def hf_dir(ct2_dir: Path | str, dtype: str = "float16") -> Path:
    """Where `ensure_whisper` keeps the conversion of `ct2_dir` in `dtype`."""
    return Path(ct2_dir) / f"hf-{dtype}"


def whisper_artifact(ct2_dir: Path | str, dtype: str = "float16") -> artifact.Artifact:
    """The `dtype` conversion of the CTranslate2 Whisper folder `ct2_dir` as a cached artifact."""
    if dtype not in DTYPES:
        raise ConfigError(f"unknown dtype {dtype!r} for a Whisper conversion: use one of {', '.join(DTYPES)}")
    ct2_dir = Path(ct2_dir)
    inputs = CT2_FILES + (("vocabulary.txt",) if (ct2_dir / "vocabulary.txt").is_file() else ())
    recipe = {"format": FORMAT, "dtype": dtype, "transformers": artifact.package_version("transformers")}
    return artifact.Artifact(ct2_dir, hf_dir(ct2_dir, dtype).name, inputs, recipe,
                             label=f"Hugging Face {dtype} conversion", required=("model.safetensors", "config.json"))


def ensure_whisper(ct2_dir: Path | str, dtype: str = "float16", log: artifact.Log = print, *,
                   hashes: bool = False) -> Path:
    """The `WhisperForConditionalGeneration` directory of the CTranslate2 Whisper folder `ct2_dir`
    (CT2_FILES), converted on first use into `hf_dir(ct2_dir, dtype)` and reused while its files are
    unchanged. `hashes`: check the conversion's sha256 (else its sizes) on reuse."""
    ct2_dir = Path(ct2_dir).expanduser()
    return artifact.ensure(whisper_artifact(ct2_dir, dtype), partial(_build, ct2_dir, dtype), log, hashes=hashes)


def _build(ct2_dir: Path, dtype: str, tmp: Path) -> None:
    vocabulary = ct2_dir / "vocabulary.txt"
    convert_whisper(ct2_dir / "model.bin", ct2_dir / "config.json", ct2_dir / "tokenizer.json", tmp, dtype=dtype,
                    vocabulary_txt=vocabulary if vocabulary.is_file() else None)
