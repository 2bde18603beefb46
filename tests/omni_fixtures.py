"""Tiny offline Qwen2.5-Omni pieces for tests: a random-weight thinker, a word-level tokenizer
with the Omni special tokens, and random waveforms. Plain functions, importable by any test."""
from __future__ import annotations

import numpy as np
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import (
    PreTrainedTokenizerFast,
    Qwen2_5OmniThinkerConfig,
    Qwen2_5OmniThinkerForConditionalGeneration,
)

from specdec.backends.omni_thinker import AUDIO_BOS, AUDIO_EOS, AUDIO_TOKEN

WORDS = (
    "<unk> <|endoftext|> system user assistant you are a helpful what is said in the audio clip "
    "hello world yes no one two three four five six seven eight nine ten . , ?"
).split()
SPECIALS = ["<|im_start|>", "<|im_end|>", AUDIO_BOS, AUDIO_TOKEN, AUDIO_EOS]
VOCAB_SIZE = 64  # model rows > tokenizer ids, as in the real thinker (152064 rows)

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def tiny_omni_tokenizer() -> PreTrainedTokenizerFast:
    """Word-level tokenizer: WORDS get ids 0.., then SPECIALS; ChatML chat template."""
    core = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    core.add_special_tokens(SPECIALS)  # matched before pre-tokenization, never split
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        unk_token="<unk>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        # Named like the real Omni tokenizer's (the HF processor reads tokenizer.audio_token).
        extra_special_tokens={"audio_token": AUDIO_TOKEN, "audio_bos_token": AUDIO_BOS, "audio_eos_token": AUDIO_EOS},
    )
    tok.chat_template = CHATML
    assert len(tok) <= VOCAB_SIZE
    return tok


def tiny_thinker_config(tokenizer: PreTrainedTokenizerFast | None = None) -> Qwen2_5OmniThinkerConfig:
    """2 text layers (hidden 32, head_dim 8, M-RoPE sections 2+1+1), 1 audio layer (d_model 16),
    a 1-block vision tower (built by the class, never used). Token ids match the tokenizer.

    Init std is raised (text 0.1, audio 0.2, default 0.02) so the audio is heard: at 0.02 the
    encoder's sinusoid position embedding swamps the mel content and two clips move the logits
    by ~1e-4; here by ~0.1 on logits of magnitude ~1."""
    tok = tokenizer or tiny_omni_tokenizer()
    tid = tok.convert_tokens_to_ids
    return Qwen2_5OmniThinkerConfig(
        text_config=dict(
            vocab_size=VOCAB_SIZE, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
            rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [2, 1, 1]},
            initializer_range=0.1,
        ),
        audio_config=dict(
            num_mel_bins=128, encoder_layers=1, encoder_attention_heads=2, encoder_ffn_dim=32,
            d_model=16, output_dim=32, initializer_range=0.2,
        ),
        vision_config=dict(
            depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=32,
            fullatt_block_indexes=[0],
        ),
        audio_token_index=tid(AUDIO_TOKEN),
        audio_start_token_id=tid(AUDIO_BOS),
        audio_end_token_id=tid(AUDIO_EOS),
        # Not a thinker-config field, but real Omni configs carry it and get_rope_index reads it.
        vision_start_token_id=VOCAB_SIZE - 1,
        initializer_range=0.1,
    )


def tiny_thinker(seed: int = 0, tokenizer: PreTrainedTokenizerFast | None = None):
    """A fp32 random-weight thinker in eval mode (~60k parameters)."""
    torch.manual_seed(seed)
    return Qwen2_5OmniThinkerForConditionalGeneration(tiny_thinker_config(tokenizer)).eval()


def random_waveform(seconds: float, seed: int = 0, sampling_rate: int = 16000) -> np.ndarray:
    """Mono float32 noise in [-0.5, 0.5): int(seconds * sampling_rate) samples."""
    rng = np.random.default_rng(seed)
    return (rng.random(int(seconds * sampling_rate), dtype=np.float32) - 0.5).astype(np.float32)
