"""The Qwen2.5-Omni thinker backend on a tiny random thinker (fp32, CPU): incremental steps with
rollback equal one full forward with the audio, the audio reaches the logits, the placeholder
count matches the audio tower, and text-only backends refuse audio."""
from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import (
    Qwen2_5OmniConfig,
    Qwen2_5OmniForConditionalGeneration,
    Qwen2_5OmniThinkerForConditionalGeneration,
    Qwen2Config,
    Qwen2ForCausalLM,
)
from transformers.models.qwen2_5_omni.processing_qwen2_5_omni import _get_feat_extract_output_lengths

from specdec.backends.hf_causal import HFCausalBackend
from specdec.backends.omni_thinker import (
    AUDIO_BOS,
    AUDIO_EOS,
    OmniThinkerBackend,
    audio_token_count,
    build_omni_prompt,
    default_feature_extractor,
    load_omni_thinker,
)
from specdec.backends.prompt import Prompt
from specdec.errors import InputError, ModelError
from tests.omni_fixtures import random_waveform, tiny_omni_tokenizer, tiny_thinker

TOL = 1e-5
QUESTION = "what is said in the audio clip ?"


@pytest.fixture(scope="module")
def tok():
    return tiny_omni_tokenizer()


@pytest.fixture(scope="module")
def fe():
    return default_feature_extractor()


@pytest.fixture(scope="module")
def model(tok):
    return tiny_thinker(seed=0, tokenizer=tok)


@pytest.fixture(autouse=True)
def _inference():
    with torch.inference_mode():
        yield


def full_logits(model, ids: torch.Tensor, features: dict) -> torch.Tensor:
    """Reference: one plain HF forward over the whole sequence, [T, V]. The attention mask makes
    the thinker compute its own M-RoPE positions with get_rope_index, as generate() does."""
    ids = ids.view(1, -1)
    return model(input_ids=ids, attention_mask=torch.ones_like(ids), **features).logits[0].float()


def words(tok, text: str) -> torch.Tensor:
    return torch.tensor(tok(text, add_special_tokens=False)["input_ids"])


def test_steps_with_rollback_equal_full_recompute(model, tok, fe):
    prompt = build_omni_prompt(tok, fe, QUESTION, random_waveform(1.0, seed=0))
    P = prompt.input_ids.numel()
    a = words(tok, "one two three four five six seven eight nine ten")  # first continuation
    b = words(tok, "yes no hello world . , ? a")  # replaces a[3:] after the rollback
    seq_a = torch.cat([prompt.input_ids, a])
    seq_b = torch.cat([prompt.input_ids, a[:3], b])
    ref_a, ref_b = full_logits(model, seq_a, prompt.features), full_logits(model, seq_b, prompt.features)

    backend = OmniThinkerBackend(model)
    state, logits = backend.prefill(prompt, prompt.input_ids, keep=4)
    assert state.length == P and state.rope_deltas == 0
    assert (logits - ref_a[P - 4 : P]).abs().max() <= TOL

    pos = P
    for n in (1, 3, 2, 4):  # blocks over a
        got = backend.forward(state, seq_a[pos : pos + n])
        assert got.shape == (n, model.config.text_config.vocab_size) and got.dtype == torch.float32
        assert (got - ref_a[pos : pos + n]).abs().max() <= TOL, f"block at {pos}"
        pos += n
    assert state.length == P + 10

    backend.crop(state, P + 3)  # reject a[3:]
    assert state.length == P + 3 and state.cache.get_seq_length() == P + 3
    pos = P + 3
    for n in (2, 1, 5):  # blocks over b
        got = backend.forward(state, seq_b[pos : pos + n])
        assert (got - ref_b[pos : pos + n]).abs().max() <= TOL, f"block at {pos} after rollback"
        pos += n

    backend.crop(state, P)  # back to the bare prompt, then one more step
    ref = full_logits(model, torch.cat([prompt.input_ids, b[:1]]), prompt.features)
    assert (backend.forward(state, b[:1]) - ref[-1:]).abs().max() <= TOL

    # Prefill beyond the prompt, without a cache: every kept row still matches.
    state, logits = backend.prefill(prompt, seq_a, keep=seq_a.numel(), use_cache=False)
    assert state.cache is None and state.length == seq_a.numel()
    assert (logits - ref_a).abs().max() <= TOL


def test_logits_follow_the_audio(model, tok, fe):
    backend = OmniThinkerBackend(model)
    prompts = [build_omni_prompt(tok, fe, QUESTION, random_waveform(1.0, seed=s)) for s in (1, 2)]
    assert torch.equal(prompts[0].input_ids, prompts[1].input_ids)  # same text and length: only the audio differs
    got = []
    for p in prompts:
        state, logits = backend.prefill(p, p.input_ids, keep=1)
        step = backend.forward(state, words(tok, "hello"))
        ref = full_logits(model, torch.cat([p.input_ids, words(tok, "hello")]), p.features)
        assert (logits - ref[-2:-1]).abs().max() <= TOL and (step - ref[-1:]).abs().max() <= TOL
        got.append(torch.cat([logits, step]))
    assert (got[0] - got[1]).abs().max() > 1e-3


def test_text_only_prompt_on_the_omni_backend(model, tok):
    prompt = build_omni_prompt(tok, None, QUESTION, system="you are a helpful assistant")
    assert not prompt.features and not prompt.has_audio
    assert (prompt.input_ids == model.config.audio_token_id).sum() == 0
    backend = OmniThinkerBackend(model)
    state, logits = backend.prefill(prompt, prompt.input_ids, keep=1)
    tail = words(tok, "yes no")
    seq = torch.cat([prompt.input_ids, tail])
    ref = full_logits(model, seq, {})
    assert (logits - ref[-3:-2]).abs().max() <= TOL
    assert (backend.forward(state, tail) - ref[-2:]).abs().max() <= TOL


@pytest.mark.parametrize("samples", [400, 16_000, 16_001, 32_160, 70_000])  # L = 3, 100, 101, 201 (2 encoder chunks), 438
def test_placeholder_count_matches_the_audio_tower(model, tok, fe, samples):
    prompt = build_omni_prompt(tok, fe, QUESTION, random_waveform(samples / 16000, seed=3))
    frames = int(prompt.features["feature_attention_mask"].sum())
    assert frames == -(-samples // 160) == prompt.features["input_features"].shape[-1]
    n = audio_token_count(frames)
    assert n == int(_get_feat_extract_output_lengths(torch.tensor(frames))) == ((frames - 1) // 2 + 1 - 2) // 2 + 1

    ids = prompt.input_ids.tolist()
    start = ids.index(tok.convert_tokens_to_ids(AUDIO_BOS))
    assert ids[start + 1 : start + 1 + n] == [model.config.audio_token_id] * n
    assert ids[start + 1 + n] == tok.convert_tokens_to_ids(AUDIO_EOS)
    assert ids.count(model.config.audio_token_id) == n

    embeds = model.model.get_audio_features(**prompt.features).last_hidden_state  # [n, H]
    assert embeds.shape == (n, model.config.text_config.hidden_size)

    # Same features and embeddings as the processor's call (padded to 300 s), up to float rounding.
    padded = fe(random_waveform(samples / 16000, seed=3), sampling_rate=16000, padding="max_length",
                return_attention_mask=True, return_tensors="pt")
    assert int(padded["attention_mask"].sum()) == frames
    assert (prompt.features["input_features"] - padded["input_features"][..., :frames]).abs().max() <= 1e-6
    ref = model.model.get_audio_features(padded["input_features"], padded["attention_mask"]).last_hidden_state
    assert (embeds - ref).abs().max() <= TOL


def test_bad_audio_inputs_are_refused(model, tok, fe):
    with pytest.raises(InputError, match="too short"):
        build_omni_prompt(tok, fe, QUESTION, random_waveform(0.01))  # 160 samples -> 1 frame -> 0 embeddings
    with pytest.raises(InputError, match="Hz"):
        build_omni_prompt(tok, fe, QUESTION, random_waveform(1.0), sampling_rate=44100)
    with pytest.raises(InputError, match="mono"):
        build_omni_prompt(tok, fe, QUESTION, random_waveform(1.0).reshape(2, -1))

    backend = OmniThinkerBackend(model)
    short = build_omni_prompt(tok, fe, QUESTION, random_waveform(0.5))
    long = build_omni_prompt(tok, fe, QUESTION, random_waveform(1.0))
    mismatched = Prompt(short.input_ids, long.features)  # 12 placeholders, features for 25
    with pytest.raises(InputError, match="placeholder"):
        backend.prefill(mismatched, mismatched.input_ids)
    with pytest.raises(InputError, match="no audio features"):
        backend.prefill(Prompt(short.input_ids), short.input_ids)


def tiny_qwen2_config() -> Qwen2Config:
    return Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                       num_attention_heads=4, num_key_value_heads=2)


def test_text_only_backend_refuses_audio(tok, fe):
    torch.manual_seed(0)
    backend = HFCausalBackend(Qwen2ForCausalLM(tiny_qwen2_config()).eval(), name="tiny-qwen2")
    assert backend.accepts_audio is False
    prompt = build_omni_prompt(tok, fe, QUESTION, random_waveform(0.5))
    with pytest.raises(InputError, match="text-only"):
        backend.prefill(prompt, prompt.input_ids)


def test_load_only_the_thinker_from_a_full_omni_checkpoint(model, tmp_path):
    # The full-model layout real checkpoints use: thinker_config, "thinker."-prefixed weights, plus
    # talker/token2wav weights (two stand-ins here). enable_audio_output=False: no talker built here.
    full = Qwen2_5OmniForConditionalGeneration(
        Qwen2_5OmniConfig(thinker_config=model.config.to_dict(), enable_audio_output=False)
    )
    full.thinker.load_state_dict(model.state_dict())
    full.save_pretrained(tmp_path / "omni")
    weights = tmp_path / "omni" / "model.safetensors"
    stored = load_file(weights)
    stored["talker.model.embed_tokens.weight"] = torch.zeros(4, 4)
    stored["token2wav.code2wav_dit_model.proj_out.weight"] = torch.zeros(4, 4)
    save_file(stored, weights, metadata={"format": "pt"})

    backend = load_omni_thinker(str(tmp_path / "omni"), torch.float32)
    assert type(backend.model) is Qwen2_5OmniThinkerForConditionalGeneration
    assert backend.accepts_audio and backend.vocab_size == model.config.text_config.vocab_size
    loaded = backend.model.state_dict()
    assert loaded.keys() == model.state_dict().keys()
    assert all(torch.equal(loaded[k], v) for k, v in model.state_dict().items())

    assert load_omni_thinker(full).model is full.thinker
    with pytest.raises(ModelError, match="not a Qwen2.5-Omni thinker"):
        OmniThinkerBackend(full)
    Qwen2ForCausalLM(tiny_qwen2_config()).save_pretrained(tmp_path / "qwen2")
    with pytest.raises(ModelError, match="not Qwen2.5-Omni"):
        load_omni_thinker(str(tmp_path / "qwen2"))
