"""Greedy speculative decoding is lossless: token for token the cloud's own greedy output."""
import pytest
import torch

from specdec import DecodeConfig, Prompt, SpecConfig, autoregressive_decode, speculative_decode
from specdec.backends.hf_causal import HFCausalBackend
from tests.tiny import noisy_copy, random_prompt, tiny_causal

N_PROMPTS, NEW_TOKENS = 20, 24


@pytest.fixture(scope="module")
def pair():
    cloud = tiny_causal("llama")
    edge = noisy_copy(cloud, noise=0.2)  # agrees only partly
    return edge, cloud


@pytest.fixture(scope="module")
def cloud_greedy(pair):
    _, cloud = pair
    outputs = []
    for seed in range(N_PROMPTS):
        ids = random_prompt(seed)
        hf = cloud.generate(
            ids.unsqueeze(0), attention_mask=torch.ones(1, ids.numel(), dtype=torch.long), do_sample=False,
            max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, pad_token_id=-1,
        )[0, ids.numel() :].tolist()
        outputs.append(hf)
    return outputs


def test_cloud_mode_equals_hf_generate(pair, cloud_greedy):
    _, cloud = pair
    for seed in range(N_PROMPTS):
        generation = autoregressive_decode(HFCausalBackend(cloud), Prompt(random_prompt(seed)),
                                           DecodeConfig(max_new_tokens=NEW_TOKENS))
        assert generation.tokens == cloud_greedy[seed]


def test_edge_mode_equals_edge_generate(pair):
    edge, _ = pair
    for seed in range(5):
        ids = random_prompt(seed)
        expected = edge.generate(
            ids.unsqueeze(0), attention_mask=torch.ones(1, ids.numel(), dtype=torch.long), do_sample=False,
            max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, pad_token_id=-1,
        )[0, ids.numel() :].tolist()
        generation = autoregressive_decode(HFCausalBackend(edge), Prompt(ids), DecodeConfig(max_new_tokens=NEW_TOKENS),
                                           role="edge")
        assert generation.tokens == expected
        assert generation.cloud_s == 0.0


@pytest.mark.parametrize("verifier", ["cached", "stateless"])
@pytest.mark.parametrize("k", [1, 3, 8])
def test_greedy_policy_reproduces_cloud_greedy(pair, cloud_greedy, k, verifier):
    edge, cloud = pair
    spec = SpecConfig(k=k, entropy_threshold=0, policy="greedy", verifier=verifier)
    totals = {"accepted": 0, "corrections": 0, "bonus": 0}
    for seed in range(N_PROMPTS):
        generation = speculative_decode(
            HFCausalBackend(edge), HFCausalBackend(cloud), Prompt(random_prompt(seed)), spec,
            DecodeConfig(max_new_tokens=NEW_TOKENS),
        )
        assert generation.tokens == cloud_greedy[seed], f"prompt {seed}"
        totals["accepted"] += generation.counters.num_accepted_tokens
        totals["corrections"] += generation.counters.corrections
        totals["bonus"] += generation.counters.bonus_tokens
    # The pair must exercise every path, or the equality above proves little.
    assert totals["accepted"] > 0 and totals["corrections"] > 0
    if k < NEW_TOKENS:
        assert totals["bonus"] > 0


def test_threshold_policy_at_tau_above_one_half_is_lossless_for_peaked_clouds(pair, cloud_greedy):
    """p_cloud(d) >= 0.5 implies d is the argmax, and corrections are the argmax: greedy output."""
    edge, cloud = pair
    spec = SpecConfig(k=4, entropy_threshold=0, policy="threshold", accept_threshold=0.5)
    for seed in range(N_PROMPTS):
        generation = speculative_decode(
            HFCausalBackend(edge), HFCausalBackend(cloud), Prompt(random_prompt(seed)), spec,
            DecodeConfig(max_new_tokens=NEW_TOKENS),
        )
        # Where the cloud's argmax has p < 0.5 a correction is still its argmax, so output = greedy.
        assert generation.tokens == cloud_greedy[seed]


def test_vocabularies_of_different_size_are_compared_over_shared_ids(pair, cloud_greedy):
    """A cloud head with extra (never-best) rows, as Qwen's 152,064 vs 151,936."""
    edge, cloud = pair
    import copy

    wide = copy.deepcopy(cloud)
    head = wide.get_output_embeddings()
    extra = torch.full((32, head.weight.shape[1]), 0.0)
    head.weight = torch.nn.Parameter(torch.cat([head.weight.detach(), extra]))
    head.out_features = head.weight.shape[0]
    backend = HFCausalBackend(wide)
    assert backend.vocab_size == HFCausalBackend(edge).vocab_size + 32
    for seed in range(5):
        generation = speculative_decode(
            HFCausalBackend(edge), backend, Prompt(random_prompt(seed)), SpecConfig(k=3, entropy_threshold=0, policy="greedy"),
            DecodeConfig(max_new_tokens=NEW_TOKENS),
        )
        assert generation.tokens == cloud_greedy[seed]
