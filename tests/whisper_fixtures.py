"""Tiny offline Whisper pieces for tests: a random-weight multilingual model with the real
special-token layout (start, languages, tasks, no-timestamps after the text ids), its generation
config, and random waveforms. Plain functions, importable by any test."""
from __future__ import annotations

import numpy as np
import torch
from transformers import GenerationConfig, WhisperConfig, WhisperFeatureExtractor, WhisperForConditionalGeneration

TEXT_IDS = 48  # ids 0..47 are "text"
EOT, SOT, EN, ZH, TRANSCRIBE, TRANSLATE, NO_TIMESTAMPS = range(TEXT_IDS, TEXT_IDS + 7)
VOCAB = TEXT_IDS + 7  # no timestamp ids: generate() would treat them as segment boundaries
SUPPRESS, SUPPRESS_AT_BEGIN = [3, 7, SOT, NO_TIMESTAMPS], [1, EOT]


def tiny_whisper_config(decoder_layers: int = 3) -> WhisperConfig:
    """d_model 32, 1 encoder layer; 80 mel bins and 1500 encoder positions as in the real models
    (the encoder insists on 3000 mel frames). Init std 0.2 so the audio moves the logits."""
    return WhisperConfig(
        vocab_size=VOCAB, num_mel_bins=80, d_model=32, encoder_layers=1, decoder_layers=decoder_layers,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
        max_source_positions=1500, max_target_positions=64, init_std=0.2,
        bos_token_id=EOT, eos_token_id=EOT, pad_token_id=EOT, decoder_start_token_id=SOT,
        tie_word_embeddings=True,
    )


def tiny_generation_config() -> GenerationConfig:
    return GenerationConfig(
        decoder_start_token_id=SOT, bos_token_id=EOT, eos_token_id=EOT, pad_token_id=EOT, max_length=64,
        suppress_tokens=SUPPRESS, begin_suppress_tokens=SUPPRESS_AT_BEGIN, no_timestamps_token_id=NO_TIMESTAMPS,
        is_multilingual=True, lang_to_id={"<|en|>": EN, "<|zh|>": ZH},
        task_to_id={"transcribe": TRANSCRIBE, "translate": TRANSLATE}, return_timestamps=False,
    )


def tiny_whisper(seed: int = 0, decoder_layers: int = 3, eot_bias: float = 0.0) -> WhisperForConditionalGeneration:
    """Random weights shaped so greedy decoding is varied and hears the audio. Whisper ties its head
    to the token embeddings, so a random one mostly repeats the current token or follows an
    audio-blind constant; here the residual writes are scaled down (x0.2), positions up (x3),
    cross-attention queries sharpened (x4) and logits sharpened (final norm x4). `eot_bias` adds
    that multiple of <|endoftext|>'s unit embedding to the final norm's bias: samples end earlier."""
    torch.manual_seed(seed)
    model = WhisperForConditionalGeneration(tiny_whisper_config(decoder_layers)).eval()
    decoder = model.model.decoder
    with torch.no_grad():
        for layer in decoder.layers:
            layer.encoder_attn.q_proj.weight.mul_(4.0)
            for residual_write in (layer.self_attn.out_proj, layer.encoder_attn.out_proj, layer.fc2):
                residual_write.weight.mul_(0.2)
        decoder.embed_positions.weight.mul_(3.0)
        decoder.layer_norm.weight.mul_(4.0)
        eot = decoder.embed_tokens.weight[EOT]  # the pad row (pad = eot), zeroed at init; trained ones are not
        eot.normal_(0.0, model.config.init_std)
        decoder.layer_norm.bias.add_(eot_bias * eot / eot.norm())
    model.generation_config = tiny_generation_config()
    return model


def feature_extractor() -> WhisperFeatureExtractor:
    return WhisperFeatureExtractor(feature_size=80)


def random_waveform(seconds: float = 1.0, seed: int = 0) -> np.ndarray:
    """Noise with a random tone on top, 16 kHz mono."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(16000 * seconds)) / 16000
    tone = np.sin(2 * np.pi * rng.uniform(100, 2000) * t)
    return (0.3 * tone + 0.1 * rng.standard_normal(t.size)).astype(np.float32)


def write_tokenizer_json(path) -> None:
    """A word-level tokenizer.json with the tiny model's ids: words w0..w47, then the specials."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    core = Tokenizer(models.WordLevel({f"w{i}": i for i in range(TEXT_IDS)}, unk_token="w0"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    core.add_special_tokens(["<|endoftext|>", "<|startoftranscript|>", "<|en|>", "<|zh|>", "<|transcribe|>",
                             "<|translate|>", "<|notimestamps|>"])
    assert core.token_to_id("<|notimestamps|>") == NO_TIMESTAMPS
    core.save(str(path))


def ct2_variables(model: WhisperForConditionalGeneration) -> dict[str, np.ndarray]:
    """The CTranslate2 WhisperSpec variables of `model`, written independently of the converter:
    q|k|v and k|v fused with a zero k bias, layer norms as gamma/beta, scalars as CT2 stores them."""
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    zeros = np.zeros(model.config.d_model, np.float32)
    out: dict[str, np.ndarray] = {}

    def linear(dst: str, src: str) -> None:
        out[f"{dst}/weight"], out[f"{dst}/bias"] = sd[f"{src}.weight"], sd[f"{src}.bias"]

    def norm(dst: str, src: str) -> None:
        out[f"{dst}/gamma"], out[f"{dst}/beta"] = sd[f"{src}.weight"], sd[f"{src}.bias"]

    for part in ("encoder", "decoder"):
        for i in range(len(getattr(model.model, part).layers)):
            src, dst = f"model.{part}.layers.{i}", f"{part}/layer_{i}"
            a = f"{src}.self_attn"
            out[f"{dst}/self_attention/linear_0/weight"] = np.concatenate([sd[f"{a}.{x}_proj.weight"] for x in "qkv"])
            q_bias, v_bias = sd[f"{a}.q_proj.bias"], sd[f"{a}.v_proj.bias"]
            out[f"{dst}/self_attention/linear_0/bias"] = np.concatenate([q_bias, zeros, v_bias])
            linear(f"{dst}/self_attention/linear_1", f"{a}.out_proj")
            norm(f"{dst}/self_attention/layer_norm", f"{src}.self_attn_layer_norm")
            if part == "decoder":
                c = f"{src}.encoder_attn"
                linear(f"{dst}/attention/linear_0", f"{c}.q_proj")
                kv = [sd[f"{c}.k_proj.weight"], sd[f"{c}.v_proj.weight"]]
                out[f"{dst}/attention/linear_1/weight"] = np.concatenate(kv)
                out[f"{dst}/attention/linear_1/bias"] = np.concatenate([zeros, sd[f"{c}.v_proj.bias"]])
                linear(f"{dst}/attention/linear_2", f"{c}.out_proj")
                norm(f"{dst}/attention/layer_norm", f"{src}.encoder_attn_layer_norm")
            linear(f"{dst}/ffn/linear_0", f"{src}.fc1")
            linear(f"{dst}/ffn/linear_1", f"{src}.fc2")
            norm(f"{dst}/ffn/layer_norm", f"{src}.final_layer_norm")
        norm(f"{part}/layer_norm", f"model.{part}.layer_norm")
        out[f"{part}/position_encodings/encodings"] = sd[f"model.{part}.embed_positions.weight"]
        out[f"{part}/num_heads"] = np.array(getattr(model.config, f"{part}_attention_heads"), np.int16)
    for conv in ("conv1", "conv2"):
        linear(f"encoder/{conv}", f"model.encoder.{conv}")
    out["decoder/embeddings/weight"] = sd["model.decoder.embed_tokens.weight"]
    out["decoder/activation"] = np.array(3, np.int8)  # GELU
    out["decoder/scale_embeddings"] = np.array(0, np.int8)
    return out


def write_ct2(path, variables: dict[str, np.ndarray], aliases: dict[str, str], version: int = 6) -> None:
    """model.bin as CTranslate2's ModelSpec._serialize writes it (names sorted)."""
    import struct

    type_ids = {np.dtype(np.float32): 0, np.dtype(np.int8): 1, np.dtype(np.int16): 2, np.dtype(np.int32): 3,
                np.dtype(np.float16): 4}
    with open(path, "wb") as f:
        def string(text: str) -> None:
            f.write(struct.pack("<H", len(text) + 1) + text.encode() + b"\0")

        f.write(struct.pack("<I", version))
        string("WhisperSpec")
        f.write(struct.pack("<II", 3, len(variables)))
        for name, value in sorted(variables.items()):
            string(name)
            f.write(struct.pack("<B", value.ndim) + struct.pack(f"<{value.ndim}I", *value.shape))
            f.write(struct.pack("<BI", type_ids[value.dtype], value.nbytes) + value.tobytes())
        f.write(struct.pack("<I", len(aliases)))
        for alias, target in aliases.items():
            string(alias)
            string(target)
