"""Whisper backend on a tiny random model: plain and speculative greedy decoding reproduce
`WhisperForConditionalGeneration.generate` token for token; incremental decoding with rollback
equals a full recompute; the encoder runs once per sample per model; the verifier hears the audio;
prompts and bad inputs fail with clear errors."""
import copy

import pytest
import torch
from torch import nn

from specdec import Constraints, DecodeConfig, InputError, SpecConfig, StopRule, autoregressive_decode, speculative_decode
from specdec.backends.whisper import SuppressTokens, WhisperBackend, build_whisper_prompt, detect_language
from specdec.core.decode import SpecOptions
from specdec.core.session import AcceptedSequence
from specdec.core.verifier import make_verifier
from tests.tiny import noisy_copy
from tests.whisper_fixtures import (
    EN,
    EOT,
    NO_TIMESTAMPS,
    SOT,
    SUPPRESS,
    SUPPRESS_AT_BEGIN,
    TRANSCRIBE,
    TRANSLATE,
    ZH,
    feature_extractor,
    random_waveform,
    tiny_whisper,
)

MAX_NEW = 24


@pytest.fixture(scope="module")
def setup():
    cloud = tiny_whisper(seed=0, eot_bias=5.0)
    edge = noisy_copy(cloud, noise=0.1)
    fe = feature_extractor()
    prompts = [build_whisper_prompt(cloud.generation_config, fe, random_waveform(2.0 + 2 * s, seed=s), language="en")
               for s in range(4)]
    constraints = Constraints(processors=WhisperBackend(cloud).processors, stop=StopRule(eos_ids=frozenset({EOT})))
    expected = [generate(cloud, p) for p in prompts]
    return WhisperBackend(edge), WhisperBackend(cloud), cloud, prompts, constraints, expected


def generate(model, prompt):
    """HF greedy with the same prompt, suppression lists and no timestamps: the reference."""
    out = model.generate(prompt.features["input_features"], language="en", task="transcribe", return_timestamps=False,
                         max_new_tokens=MAX_NEW, return_dict_in_generate=True)
    sequence = out.sequences[0].tolist()
    assert sequence[: prompt.input_ids.numel()] == prompt.input_ids.tolist()
    return sequence[prompt.input_ids.numel():]


def test_autoregressive_equals_generate(setup):
    _, cloud, _, prompts, constraints, expected = setup
    stops = []
    for prompt, tokens in zip(prompts, expected):
        generation = autoregressive_decode(cloud, prompt, DecodeConfig(max_new_tokens=MAX_NEW), constraints)
        assert generation.tokens == tokens
        stops.append(generation.stopped_by)
    assert set(stops) == {"stop_token", "max_new_tokens"}  # both ends are exercised


@pytest.mark.parametrize("k", [1, 3, 5])
@pytest.mark.parametrize("verifier", ["cached", "stateless"])
def test_speculative_greedy_equals_generate(setup, k, verifier):
    edge, cloud, _, prompts, constraints, expected = setup
    spec = SpecConfig(k=k, entropy_threshold=0, policy="greedy", verifier=verifier)
    accepted = corrections = 0
    for prompt, tokens in zip(prompts, expected):
        generation = speculative_decode(edge, cloud, prompt, spec, DecodeConfig(max_new_tokens=MAX_NEW),
                                        SpecOptions(constraints))
        assert generation.tokens == tokens
        accepted += generation.counters.num_accepted_tokens
        corrections += generation.counters.corrections
    assert accepted > 0 and corrections > 0  # the edge agrees only partly


def test_incremental_with_rollback_equals_full_recompute(setup):
    _, backend, model, prompts, _, _ = setup
    prompt = prompts[0]
    ids, n = prompt.input_ids, prompt.input_ids.numel()
    with torch.inference_mode():
        state, _ = backend.prefill(prompt, ids[:-1])
        block = backend.forward(state, torch.cat([ids[-1:], torch.tensor([5, 9, 11])]))  # [4, V]
        backend.crop(state, n + 1)  # keep 5; 9 and 11 are rejected
        assert state.length == n + 1 and state.cache.get_seq_length() == n + 1
        assert state.cache.cross_attention_cache.get_seq_length() == 1500  # never cropped
        steps = torch.cat([backend.forward(state, torch.tensor([t])) for t in (20, 21, 22)])
        full = model(input_features=prompt.features["input_features"],
                     decoder_input_ids=torch.cat([ids, torch.tensor([5, 20, 21, 22])]).unsqueeze(0)).logits[0]
    torch.testing.assert_close(block[:2], full[n - 1 : n + 1], atol=1e-5, rtol=0)
    torch.testing.assert_close(steps, full[n + 1 :], atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="cannot crop"):
        backend.crop(state, state.length + 1)


class CountingEncoder(nn.Module):
    def __init__(self, encoder: nn.Module) -> None:
        super().__init__()
        self.inner, self.calls = encoder, 0

    def forward(self, *args, **kwargs):
        self.calls += 1
        return self.inner(*args, **kwargs)


def counted(backend: WhisperBackend) -> tuple[WhisperBackend, CountingEncoder]:
    model = copy.deepcopy(backend.model)
    model.model.encoder = CountingEncoder(model.model.encoder)
    return WhisperBackend(model), model.model.encoder


def test_encoder_runs_once_per_sample_per_model(setup):
    edge, cloud, _, prompts, constraints, _ = setup
    (edge, edge_encoder), (cloud, cloud_encoder) = counted(edge), counted(cloud)
    spec = SpecConfig(k=3, entropy_threshold=0, policy="greedy")
    for i, prompt in enumerate(prompts[:2], start=1):
        generation = speculative_decode(edge, cloud, prompt, spec, DecodeConfig(max_new_tokens=MAX_NEW),
                                        SpecOptions(constraints))
        assert generation.counters.cloud_calls > 2
        assert (edge_encoder.calls, cloud_encoder.calls) == (i, i)
    autoregressive_decode(cloud, prompts[0], DecodeConfig(max_new_tokens=MAX_NEW), constraints)
    assert cloud_encoder.calls == 3


@pytest.mark.parametrize("kind", ["cached", "stateless"])
def test_verifier_logits_follow_the_audio(setup, kind):
    _, cloud, model, prompts, _, expected = setup
    draft = torch.tensor([5, 9, 12])
    block_logits = []
    with torch.inference_mode():
        for prompt in prompts[:2]:
            seq = AcceptedSequence(prompt.input_ids, 8)
            seq.extend([20, 21])
            logits = make_verifier(kind, cloud, prompt).logits(seq, draft)  # [k+1, V]
            full = model(input_features=prompt.features["input_features"],
                         decoder_input_ids=torch.cat([seq.ids, draft]).unsqueeze(0)).logits[0]
            torch.testing.assert_close(logits, full[-draft.numel() - 1 :], atol=1e-5, rtol=0)
            block_logits.append(logits)
    assert (block_logits[0] - block_logits[1]).abs().max() > 1e-2
    assert len({tuple(tokens) for tokens in expected}) > 1  # and the verified tokens differ


def test_prompts_follow_generate():
    config, fe, wave = tiny_whisper().generation_config, feature_extractor(), random_waveform(1.0)

    def ids(**kw) -> list[int]:
        return build_whisper_prompt(config, fe, wave, **kw).input_ids.tolist()

    assert ids(language="en") == ids(language="English") == ids(language="<|en|>") == [SOT, EN, TRANSCRIBE, NO_TIMESTAMPS]
    assert ids(language="chinese", task="translate") == [SOT, ZH, TRANSLATE, NO_TIMESTAMPS]
    prompt = build_whisper_prompt(config, fe, torch.from_numpy(wave), language="zh")
    assert set(prompt.features) == {"input_features"} and prompt.features["input_features"].shape == (1, 80, 3000)
    english_only = copy.deepcopy(config)
    english_only.is_multilingual = False
    assert build_whisper_prompt(english_only, fe, wave).input_ids.tolist() == [SOT, NO_TIMESTAMPS]
    assert build_whisper_prompt(english_only, fe, wave, language="English").input_ids.tolist() == [SOT, NO_TIMESTAMPS]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(), "needs the language"),
        (dict(language="klingon"), "unknown language 'klingon'"),
        (dict(language="en", task="summarize"), "unknown Whisper task"),
        (dict(language="en", sampling_rate=8000), "needs 16000 Hz"),
        (dict(language="en", waveform=random_waveform(31.0)), "at most 30 s"),
        (dict(language="en", waveform=random_waveform(1.0).reshape(2, -1)), "mono waveform"),
        (dict(language="en", waveform=[]), "non-empty"),
    ],
)
def test_bad_prompt_inputs_are_clear_errors(kwargs, message):
    config, fe = tiny_whisper().generation_config, feature_extractor()
    kwargs = {"waveform": random_waveform(1.0), **kwargs}
    with pytest.raises(InputError, match=message):
        build_whisper_prompt(config, fe, **kwargs)


def test_english_only_model_refuses_other_languages():
    config = copy.deepcopy(tiny_whisper().generation_config)
    config.is_multilingual = False
    with pytest.raises(InputError, match="English-only"):
        build_whisper_prompt(config, feature_extractor(), random_waveform(1.0), language="zh")


def test_backend_input_errors(setup):
    _, cloud, _, prompts, _, _ = setup
    prompt = prompts[0]
    bad = copy.copy(prompt)
    bad.features = {}
    with pytest.raises(InputError, match="exactly input_features"):
        cloud.prefill(bad, prompt.input_ids)
    bad.features = {"input_features": prompt.features["input_features"][:, :, :100]}
    with pytest.raises(InputError, match=r"must be \[1, 80, 3000\]"):
        cloud.prefill(bad, prompt.input_ids)
    with pytest.raises(InputError, match="at most 64 tokens"):
        autoregressive_decode(cloud, prompt, DecodeConfig(max_new_tokens=80))


def test_detect_language_is_generates_rule(setup):
    _, cloud, model, prompts, _, _ = setup
    names = {EN: "en", ZH: "zh"}
    for prompt in prompts:
        features = prompt.features["input_features"]
        assert detect_language(cloud, features) == names[int(model.detect_language(input_features=features))]


def test_suppress_tokens_processor():
    processor = SuppressTokens.from_generation_config(tiny_whisper().generation_config, vocab_size=55)
    logits = torch.zeros(55)
    first, later = processor([], logits), processor([5], logits)
    assert torch.isinf(first[SUPPRESS + SUPPRESS_AT_BEGIN]).all() and torch.isinf(first).sum() == 6
    assert torch.isinf(later[SUPPRESS]).all() and torch.isinf(later).sum() == 4
    assert not torch.isinf(logits).any()  # not in place
