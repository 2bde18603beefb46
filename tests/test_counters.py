"""Counter invariants and the gate, over runs where some blocks escalate and some do not."""
import math

import pytest
import torch

from specdec import Constraints, DecodeConfig, Prompt, SpecConfig, SpecOptions, StopRule, speculative_decode
from specdec.backends.base import Backend
from specdec.backends.hf_causal import HFCausalBackend
from specdec.core.escalation import block_uncertainty, should_escalate
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
    free = speculative_decode(edge, cloud, Prompt(random_prompt(4)), SpecConfig(k=4, entropy_threshold=0, policy="greedy"),
                              DecodeConfig(max_new_tokens=30))
    stop_token = free.tokens[9]
    stop = Constraints(stop=StopRule(eos_ids=frozenset({stop_token})))
    stopped = speculative_decode(edge, cloud, Prompt(random_prompt(4)), SpecConfig(k=4, entropy_threshold=0, policy="greedy"),
                                 DecodeConfig(max_new_tokens=30), SpecOptions(stop))
    first = free.tokens.index(stop_token)
    assert stopped.tokens == free.tokens[: first + 1]
    assert stopped.stopped_by == "stop_token"
    c = stopped.counters
    assert stopped.new_tokens == c.num_accepted_tokens + c.unverified_tokens + c.corrections + c.bonus_tokens


def test_first_cached_call_uploads_the_whole_prompt(backends):
    edge, cloud = backends
    prompt = Prompt(random_prompt(2))
    generation = speculative_decode(edge, cloud, prompt, SpecConfig(k=3, entropy_threshold=0, policy="greedy"),
                                    DecodeConfig(max_new_tokens=9))
    first, second = generation.cycles[0], generation.cycles[1]
    assert first.cloud_tokens_in == prompt.input_ids.numel() + len(first.draft_tokens)
    # Later calls: the correction/bonus token of the previous cycle plus the new draft.
    assert second.cloud_tokens_in == 1 + len(second.draft_tokens)


class CountingBackend(Backend):
    """Wraps a backend and records the size of every block it is asked to run."""

    def __init__(self, inner):
        self.inner, self.calls = inner, []
        self.name, self.vocab_size, self.accepts_audio = inner.name, inner.vocab_size, inner.accepts_audio

    def prefill(self, prompt, token_ids, keep=0, use_cache=True):
        self.calls.append(("prefill", token_ids.numel(), keep))
        return self.inner.prefill(prompt, token_ids, keep, use_cache)

    def forward(self, state, token_ids, keep=None):
        self.calls.append(("forward", token_ids.numel(), keep))
        return self.inner.forward(state, token_ids, keep)

    def crop(self, state, length):
        self.inner.crop(state, length)


def test_no_forward_is_spent_on_a_separate_prefill(backends):
    """The prompt rides with the first step: one edge forward per draft token and one cloud forward
    per escalation, as in HF's generate (an extra prefill forward costs a whole step on a CPU)."""
    edge, cloud = CountingBackend(backends[0]), CountingBackend(backends[1])
    prompt = Prompt(random_prompt(4))
    generation = speculative_decode(edge, cloud, prompt, SpecConfig(k=3, entropy_threshold=0, policy="greedy"),
                                    DecodeConfig(max_new_tokens=12))
    P = prompt.input_ids.numel()
    assert len(edge.calls) == generation.counters.num_draft_tokens
    assert len(cloud.calls) == generation.counters.cloud_calls > 1
    first_draft = len(generation.cycles[0].draft_tokens)
    assert edge.calls[0] == ("prefill", P, 1)  # whole prompt, only the last position's logits
    assert cloud.calls[0] == ("prefill", P + first_draft, first_draft + 1)
    assert all(kind == "forward" for kind, _, _ in edge.calls[1:] + cloud.calls[1:])


def test_autoregressive_decode_runs_one_forward_per_token(backends):
    from specdec import autoregressive_decode

    cloud = CountingBackend(backends[1])
    prompt = Prompt(random_prompt(5))
    generation = autoregressive_decode(cloud, prompt, DecodeConfig(max_new_tokens=7))
    assert cloud.calls == [("prefill", prompt.input_ids.numel(), 1)] + [("forward", 1, 1)] * (len(generation.tokens) - 1)


def test_last_block_leaves_room_for_the_bonus():
    from specdec.core.decode import block_size

    assert [block_size(4, r) for r in (9, 6, 5, 4, 3, 2, 1)] == [4, 4, 4, 3, 2, 1, 1]


def test_budget_is_filled_by_the_bonus_when_the_last_block_is_accepted(backends):
    """A cloud used as its own edge accepts everything: the final token must be the bonus."""
    cloud = backends[1]
    generation = speculative_decode(cloud, cloud, Prompt(random_prompt(6)), SpecConfig(k=4, entropy_threshold=0, policy="greedy"),
                                    DecodeConfig(max_new_tokens=8))
    assert [len(c.draft_tokens) for c in generation.cycles] == [4, 2]
    assert [c.extra_kind for c in generation.cycles] == ["bonus", "bonus"]
    assert generation.new_tokens == 8 and generation.counters.num_draft_tokens == 6
