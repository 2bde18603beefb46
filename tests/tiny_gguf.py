"""A tiny random HF Llama written as a GGUF file (F32 tensors) with the pinned `gguf` package, so
llama.cpp runs the very weights torch runs.

Mapping as llama.cpp's convert_hf_to_gguf.py does for `llama`: tensors keep torch's [out, in]
shape (GGUF stores dims reversed, which is ggml's [in, out]); q_proj and k_proj rows are permuted
from HF's rotate-half rope layout to llama.cpp's interleaved pairs. The tokenizer metadata is a
minimal sentencepiece-style vocabulary of `vocab_size` placeholder pieces: llama.cpp needs one to
load, and the backend only ever sees token ids (the HF tokenizer beside the file encodes text).
"""
from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np


def _rope_permute(weight: np.ndarray, heads: int) -> np.ndarray:
    """[heads * head_dim, in]: each head's (first half, second half) rows -> interleaved pairs."""
    return weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def write_llama_gguf(model, path: str | Path, eos_token_id: int | None = None) -> Path:
    config = model.config
    theta = getattr(config, "rope_theta", None) or config.rope_parameters["rope_theta"]
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny-llama")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(float(theta))
    writer.add_rope_dimension_count(config.hidden_size // config.num_attention_heads)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("llama")
    writer.add_token_list([f"<t{i}>" for i in range(config.vocab_size)])
    writer.add_token_scores([0.0] * config.vocab_size)
    writer.add_token_types([gguf.TokenType.NORMAL] * config.vocab_size)
    if eos_token_id is not None:
        writer.add_eos_token_id(eos_token_id)
    names = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
    per_layer = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
                 "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
                 "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    for key, tensor in model.state_dict().items():
        module = key.removesuffix(".weight")
        data = tensor.detach().float().numpy().copy()
        if module.startswith("model.layers."):
            index, rest = module.removeprefix("model.layers.").split(".", 1)
            name = f"blk.{index}.{per_layer[rest]}"
            if rest == "self_attn.q_proj":
                data = _rope_permute(data, config.num_attention_heads)
            elif rest == "self_attn.k_proj":
                data = _rope_permute(data, config.num_key_value_heads)
        else:
            name = names[module]
        writer.add_tensor(name + ".weight", data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(path)
