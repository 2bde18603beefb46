"""The cloud verifier hears the audio (a verifier once got the placeholder tokens without the
features): its block logits depend on the audio and equal a full forward of the thinker with that
audio, for both verifiers; speculative greedy decoding with audio reproduces the cloud's own
greedy output."""
import pytest
import torch

from specdec import DecodeConfig, SpecConfig, autoregressive_decode, speculative_decode
from specdec.backends.omni_thinker import OmniThinkerBackend, build_omni_prompt, default_feature_extractor
from specdec.core.session import AcceptedSequence
from specdec.core.verifier import make_verifier
from tests.omni_fixtures import random_waveform, tiny_omni_tokenizer, tiny_thinker
from tests.tiny import noisy_copy


@pytest.fixture(scope="module")
def setup():
    tokenizer = tiny_omni_tokenizer()
    cloud = tiny_thinker(seed=0, tokenizer=tokenizer)
    edge = noisy_copy(cloud, noise=0.2)
    fe = default_feature_extractor()
    prompts = [build_omni_prompt(tokenizer, fe, "what is said in the audio clip", random_waveform(1.0, seed=s)) for s in (1, 2)]
    return OmniThinkerBackend(edge), OmniThinkerBackend(cloud), cloud, prompts


def full_forward(model, prompt, ids):
    out = model(
        input_ids=ids.unsqueeze(0), attention_mask=torch.ones(1, ids.numel(), dtype=torch.long), **prompt.features
    )
    return out.logits[0].float()


@pytest.mark.parametrize("kind", ["cached", "stateless"])
def test_verifier_logits_follow_the_audio(setup, kind):
    _, cloud_backend, cloud, prompts = setup
    draft = torch.tensor([5, 9, 12])
    block_logits = []
    with torch.inference_mode():
        for prompt in prompts:
            seq = AcceptedSequence(prompt.input_ids, 8)
            seq.extend([20, 21])  # two accepted tokens the cloud has not seen yet
            verifier = make_verifier(kind, cloud_backend, prompt)
            logits = verifier.logits(seq, draft)  # [k+1, V]
            full = full_forward(cloud, prompt, torch.cat([seq.ids, draft]))
            torch.testing.assert_close(logits, full[-draft.numel() - 1 :], atol=1e-5, rtol=0)
            assert verifier.last_sent_features
            block_logits.append(logits)
    assert (block_logits[0] - block_logits[1]).abs().max() > 1e-3


def test_cached_verifier_sends_the_audio_once(setup):
    edge, cloud, _, prompts = setup
    generation = speculative_decode(edge, cloud, prompts[0], SpecConfig(k=3, entropy_threshold=0, policy="greedy"),
                                    DecodeConfig(max_new_tokens=12))
    sent = [cycle.sent_features for cycle in generation.cycles if cycle.escalated]
    assert sent[0] and not any(sent[1:])


@pytest.mark.parametrize("kind", ["cached", "stateless"])
def test_spec_with_audio_reproduces_cloud_greedy(setup, kind):
    edge, cloud, _, prompts = setup
    for prompt in prompts:
        expected = autoregressive_decode(cloud, prompt, DecodeConfig(max_new_tokens=16)).tokens
        generation = speculative_decode(
            edge, cloud, prompt, SpecConfig(k=3, entropy_threshold=0, policy="greedy", verifier=kind),
            DecodeConfig(max_new_tokens=16),
        )
        assert generation.tokens == expected
