"""Counter invariants and the gate, over runs where some blocks escalate and some do not."""
import math

import pytest
import torch

from specdec import DecodeConfig, Prompt, SpecConfig, StopRule, Constraints, speculative_decode
from specdec.backends.hf_causal import HFCausalBackend
from specdec.gate import block_uncertainty, should_escalate
from tests.tiny import noisy_copy, random_prompt, tiny_causal


@pytest.fixture(scope="module")
def backends():
    cloud = tiny_causal("llama", sharpness=30.0)  # block entropies span ~0.9-1.8 nats
    return HFCausalBackend(noisy_copy(cloud, 0.3)), HFCausalBackend(cloud)


@pytest.mark.parametrize("policy,temperature", [("threshold", 0.0), ("greedy", 0.0), ("sample", 1.0), ("threshold", 0.9)])
@pytest.mark.parametrize("entropy_threshold", [0.0, 1.2, math.inf])
def test_counter_invariants(backends, policy, temperature, entropy_threshold):
    edge, cloud = backends
    spec = SpecConfig(k=4, entropy_threshold=entropy_threshold, policy=policy, accept_threshold=0.2)
    for seed in range(6):
        generation = speculative_decode(
            edge, cloud, Prompt(random_prompt(seed)), spec, DecodeConfig(max_new_tokens=19, temperature=temperature, seed=seed)
        )
        c = generation.counters
        assert len(generation.tokens) == 19  # budget respected exactly, k does not divide it
        assert c.num_accepted_tokens <= c.num_draft_tokens
        assert generation.new_tokens == c.num_accepted_tokens + c.unverified_tokens + c.corrections + c.bonus_tokens
        assert c.cycles == len(generation.cycles) and c.cloud_calls == c.num_drafts
        assert sum(c.accepted_per_position) == c.num_accepted_tokens
        assert all(a >= b for a, b in zip(c.accepted_per_position, c.accepted_per_position[1:]))
        if entropy_threshold == 0:
            assert c.unverified_tokens == 0 and c.cloud_calls == c.cycles
        if entropy_threshold == math.inf:
            assert c.cloud_calls == 0 and generation.cloud_s == 0.0 and c.acceptance_rate is None
        for cycle in generation.cycles:
            assert cycle.escalated == should_escalate(torch.tensor(cycle.entropies_nats), None, spec)


def test_gate_escalates_some_blocks_in_between(backends):
    edge, cloud = backends
    generation = speculative_decode(
        edge, cloud, Prompt(random_prompt(1)), SpecConfig(k=3, entropy_threshold=1.2), DecodeConfig(max_new_tokens=40)
    )
    escalated = [cycle.escalated for cycle in generation.cycles]
    assert any(escalated) and not all(escalated)
    assert all(max(cycle.entropies_nats) >= 1.2 for cycle in generation.cycles if cycle.escalated)


def test_cached_verifier_sends_unseen_tokens_lazily_and_features_once(backends):
    edge, cloud = backends
    generation = speculative_decode(
        edge, cloud, Prompt(random_prompt(1)), SpecConfig(k=3, entropy_threshold=1.2), DecodeConfig(max_new_tokens=40)
    )
    calls = [cycle for cycle in generation.cycles if cycle.escalated]
    # A call after unverified blocks carries those tokens up too.
    assert any(cycle.cloud_tokens_in > len(cycle.draft_tokens) + 1 for cycle in calls[1:])


def test_block_uncertainty_reductions():
    entropies = torch.tensor([0.5, 2.0, 1.0])
    assert float(block_uncertainty(entropies, "max")) == 2.0
    assert float(block_uncertainty(entropies, "mean")) == pytest.approx(3.5 / 3)
    assert float(block_uncertainty(entropies, "first")) == 0.5


def test_punctuation_trigger_forces_escalation():
    spec = SpecConfig(entropy_threshold=math.inf, punct_trigger=0.4)
    calm = torch.tensor([0.1, 0.1])
    assert should_escalate(calm, 0.5, spec)
    assert not should_escalate(calm, 0.3, spec)
    assert not should_escalate(calm, 0.5, SpecConfig(entropy_threshold=math.inf))


def test_stop_token_ends_generation_without_a_bonus(backends):
    edge, cloud = backends
    free = speculative_decode(edge, cloud, Prompt(random_prompt(4)), SpecConfig(k=4, entropy_threshold=0, policy="greedy"), DecodeConfig(max_new_tokens=30))
    stop_token = free.tokens[9]
    stop = Constraints(stop=StopRule(eos_ids=frozenset({stop_token})))
    stopped = speculative_decode(edge, cloud, Prompt(random_prompt(4)), SpecConfig(k=4, entropy_threshold=0, policy="greedy"), DecodeConfig(max_new_tokens=30), stop)
    first = free.tokens.index(stop_token)
    assert stopped.tokens == free.tokens[: first + 1]
    assert stopped.stopped_by == "stop_token"
    c = stopped.counters
    assert stopped.new_tokens == c.num_accepted_tokens + c.unverified_tokens + c.corrections + c.bonus_tokens


def test_first_cached_call_uploads_the_whole_prompt(backends):
    edge, cloud = backends
    prompt = Prompt(random_prompt(2))
    generation = speculative_decode(edge, cloud, prompt, SpecConfig(k=3, entropy_threshold=0, policy="greedy"), DecodeConfig(max_new_tokens=9))
    first, second = generation.cycles[0], generation.cycles[1]
    assert first.cloud_tokens_in == prompt.input_ids.numel() + len(first.draft_tokens)
    # Later calls: the correction/bonus token of the previous cycle plus the new draft.
    assert second.cloud_tokens_in == 1 + len(second.draft_tokens)
