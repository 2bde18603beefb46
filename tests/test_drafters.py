"""A drafter is a plug-in: one class that registers itself. A draft-free one ("repeat the last
token", written here as a user would) runs through the unchanged loop, stays lossless under greedy
and speculative sampling, and always escalates (it has no entropy to be sure with)."""
from __future__ import annotations

import pytest
import torch
from scipy.stats import chisquare

from specdec import ConfigError, DecodeConfig, Prompt, SpecConfig, SpecOptions, autoregressive_decode, speculative_decode
from specdec.backends.hf_causal import HFCausalBackend
from specdec.core.drafters import DRAFTERS, DraftContext, DraftFree, Proposal, drafter_options, register_drafter
from specdec.core.policies.sample import speculative_sample
from specdec.core.session import AcceptedSequence
from tests.tiny import random_prompt, tiny_causal

NEW_TOKENS = 24


class RepeatLast(DraftFree):
    """Proposes the last accepted token k times: no model, no distribution."""

    name = "repeat-last"

    def __init__(self, context: DraftContext) -> None:
        super().__init__()

    def propose(self, seq: AcceptedSequence, k: int) -> Proposal:
        return Proposal(seq.ids[-1:].repeat(k), None, seq.length, self.name)


class Nothing(DraftFree):
    """Never has a proposal: every cycle is the cloud's own next token."""

    name = "nothing"

    def __init__(self, context: DraftContext) -> None:
        super().__init__()

    def propose(self, seq: AcceptedSequence, k: int) -> Proposal:
        return Proposal(torch.empty(0, dtype=torch.long), None, seq.length, self.name)


@pytest.fixture(scope="module", autouse=True)
def registered():
    for cls in (RepeatLast, Nothing):
        register_drafter(cls.name)(cls)
    yield
    for cls in (RepeatLast, Nothing):
        DRAFTERS.pop(cls.name)


@pytest.fixture(scope="module")
def cloud():
    return HFCausalBackend(tiny_causal("llama", sharpness=8.0))


@pytest.mark.parametrize("drafter", ["repeat-last", "nothing"])
@pytest.mark.parametrize("verifier", ["cached", "stateless"])
def test_greedy_with_a_draft_free_drafter_is_the_clouds_greedy(cloud, drafter, verifier):
    # a threshold no entropy reaches
    spec = SpecConfig(k=4, entropy_threshold=8.0, policy="greedy", verifier=verifier, drafter=drafter)
    decode = DecodeConfig(max_new_tokens=NEW_TOKENS)
    kinds = {"accepted": 0, "correction": 0, "bonus": 0}
    for seed in range(8):
        prompt = Prompt(random_prompt(seed))
        expected = autoregressive_decode(cloud, prompt, decode).tokens
        generation = speculative_decode(None, cloud, prompt, spec, decode)
        assert generation.tokens == expected, seed
        assert all(c.escalated and c.entropies_nats == [] for c in generation.cycles)  # draft-free: always verified
        kinds["accepted"] += generation.counters.num_accepted_tokens
        kinds["correction"] += generation.counters.corrections
        kinds["bonus"] += generation.counters.bonus_tokens
    if drafter == "repeat-last":  # every path of a cycle ran: kept tokens, corrections and bonuses
        assert all(kinds.values()), kinds
    else:  # an empty proposal: the cloud's token is the bonus of a block of zero
        assert kinds == {"accepted": 0, "correction": 0, "bonus": kinds["bonus"]} and kinds["bonus"] > 0


def test_a_draft_free_drafter_beside_the_model_drafter_needs_no_edge_model(cloud):
    with pytest.raises(ConfigError, match="drafter 'model' runs an edge model"):
        speculative_decode(None, cloud, Prompt(random_prompt(0)), SpecConfig(policy="greedy"), DecodeConfig(max_new_tokens=4))
    with pytest.raises(ConfigError, match="unknown drafter 'nope': use one of"):
        speculative_decode(None, cloud, Prompt(random_prompt(0)), SpecConfig(policy="greedy", drafter="nope"),
                           DecodeConfig(max_new_tokens=4))


def test_a_combination_that_cannot_work_is_refused_in_one_line(cloud):
    """Drafting ahead with a drafter that has nothing to draft meanwhile, an option a drafter does not take,
    an option's bad value, and a drafter that does not weigh a two-runtime cloud's switches on one."""
    from specdec.core.cloud import LocalCloud
    from specdec.core.config import DeployConfig
    from specdec.core.two_runtime import TwoRuntimeCloud
    from specdec.engine import Engine

    prompt, decode = Prompt(random_prompt(0)), DecodeConfig(max_new_tokens=4)
    lookup = SpecConfig(policy="greedy", drafter="prompt-lookup")
    refusals = {
        "drafter 'prompt-lookup' cannot draft ahead \\(only model can\\): use --overlap auto or false":
            lambda: speculative_decode(None, cloud, prompt, lookup, decode, SpecOptions(overlap=True)),
        "--overlap true drafts ahead with the edge model; drafter 'hybrid' cannot \\(only model\\)":
            lambda: Engine(mode="spec", edge="e", cloud_url="127.0.0.1:1", spec=SpecConfig(drafter="hybrid"),
                           deploy=DeployConfig(overlap=True)),
        "drafter 'model' takes no option 'max_ngram': it takes head_vocab":
            lambda: SpecConfig(drafter="model", drafter_options="max_ngram=2"),
        "drafter 'ngram' takes no option 'max_gram': it takes max_ngram, min_count":
            lambda: SpecConfig(drafter="ngram", drafter_options="max_gram=2"),
        "drafter 'none-such' takes no option 'x': it takes none":  # a name SpecConfig would refuse first
            lambda: drafter_options("none-such", "x=1"),
        "drafter option max_ngram of 'hybrid' must be >= 2, got 1":
            lambda: SpecConfig(drafter="hybrid", drafter_options="max_ngram=1"),
        "--overlap true drafts the next block while a remote cloud verifies; this cloud runs in this process":
            lambda: Engine(mode="spec", edge="e", cloud="c", spec=SpecConfig(drafter="prompt-lookup"),
                           deploy=DeployConfig(overlap=True)),
        "drafter option 'max_ngram' is not NAME=VALUE": lambda: SpecConfig(drafter="prompt-lookup", drafter_options="max_ngram"),
        "drafter option min_count must be an integer, got 'two'":
            lambda: SpecConfig(drafter="ngram", drafter_options="min_count=two"),
        "drafter option 'max_ngram' is given twice":
            lambda: SpecConfig(drafter="auto", drafter_options="max_ngram=2,max_ngram=3"),
        "a cloud held in two runtimes needs a drafter that weighs switching between them \\(auto\\); 'prompt-lookup'":
            lambda: speculative_decode(None, TwoRuntimeCloud(LocalCloud(cloud), LocalCloud(cloud)), prompt, lookup, decode),
    }
    for message, attempt in refusals.items():
        with pytest.raises(ConfigError, match=message) as refused:
            attempt()
        assert "\n" not in str(refused.value)
    # "auto" drafts ahead only where a drafter can: a draft-free one runs sequentially, as asked
    assert speculative_decode(None, cloud, prompt, lookup, decode, SpecOptions(overlap="auto")).new_tokens == 4


def test_drafter_options_reach_the_drafter(cloud):
    """SpecConfig.drafter_options (--drafter-options) fill DraftContext.options: prompt lookup limited to
    1-grams proposes what followed the newest recurring token, not the newest recurring 2-gram."""
    from specdec.core.decode import build_drafter
    from specdec.core.processors import Constraints

    context = DraftContext(Prompt(random_prompt(0)), 64, Constraints(), 0.0, torch.Generator())
    assert build_drafter(SpecConfig(drafter="prompt-lookup", drafter_options="max_ngram=1"), context).max_ngram == 1
    assert build_drafter(SpecConfig(drafter="prompt-lookup"), context).max_ngram == 3
    ngram = build_drafter(SpecConfig(drafter="ngram", drafter_options="min_count=3, max_ngram=2"), context)
    assert ngram.min_count == 3 and ngram.table.max_ngram == 2
    prompt, decode = Prompt(torch.tensor([5, 7, 8, 1, 2, 8, 9, 9, 7, 8])), DecodeConfig(max_new_tokens=8)
    expected = autoregressive_decode(cloud, prompt, decode).tokens
    for options, first_block in (("", [1, 2, 8]), ("max_ngram=1", [9, 9, 7])):
        spec = SpecConfig(k=3, policy="greedy", drafter="prompt-lookup", drafter_options=options)
        generation = speculative_decode(None, cloud, prompt, spec, decode)
        assert generation.cycles[0].draft_tokens == first_block and generation.tokens == expected, options


def test_speculative_sampling_treats_a_draft_free_token_as_a_point_mass():
    """A proposal with no distribution: the token that leaves position 0 still follows the cloud's."""
    cloud_row = torch.tensor([0.05, 0.40, 0.10, 0.25, 0.15, 0.05])
    cloud_probs = cloud_row.expand(3, 6)
    generator = torch.Generator().manual_seed(3)
    counts, trials = torch.zeros(6), 20000
    for trial in range(trials):
        draft_tokens = torch.tensor([trial % 6, 2])  # any proposal, including unlikely tokens
        accepted, next_token = speculative_sample(draft_tokens, None, cloud_probs.log(), cloud_probs, True, generator)
        counts[int(draft_tokens[0] if accepted > 0 else next_token)] += 1
    assert chisquare(counts.numpy(), (cloud_row * trials).numpy()).pvalue > 0.001


def test_sampling_with_a_draft_free_drafter_runs_the_loop(cloud):
    """Temperature > 0 through the whole loop: the draft-free tokens reach the sample policy as point masses."""
    spec = SpecConfig(k=3, entropy_threshold=0, policy="sample", drafter="repeat-last")
    decode = DecodeConfig(max_new_tokens=NEW_TOKENS, temperature=0.8, seed=5)
    generation = speculative_decode(None, cloud, Prompt(random_prompt(1)), spec, decode)
    assert generation.new_tokens == NEW_TOKENS
    assert generation.counters.num_draft_tokens > 0 and generation.counters.cloud_calls == len(generation.cycles)


@pytest.mark.server
@pytest.mark.parametrize("drafter", ["repeat-last", "nothing", "prompt-lookup", "auto"])
def test_a_draft_free_drafter_verified_through_the_server_is_the_clouds_greedy(pair, drafter):
    """Split deployment: the edge proposes without a model, the server verifies; greedy is lossless
    and a draft-free block under speculative sampling crosses the wire with no distributions. An empty
    block (lookup found nothing, `auto` withheld its block) is a plain step of the server: the server
    once refused it ("a draft of 1..127 tokens expected, got 0"), failing every lookup prompt in split."""
    from specdec.models.loading import load_model
    from specdec.remote.background import BackgroundServer
    from specdec.remote.client import RemoteCloud

    cloud_model = load_model(pair["cloud"], "float32")
    decode = DecodeConfig(max_new_tokens=12)
    empty = 0
    with BackgroundServer(cloud_model) as url:
        for seed in range(3):
            prompt = Prompt(random_prompt(seed, length=6) % 60)  # ids the tiny pair's 64-row models hold
            remote = RemoteCloud(url)
            remote.connect()
            try:
                split = speculative_decode(None, remote, prompt, SpecConfig(k=3, policy="greedy", drafter=drafter), decode)
                sampled = speculative_decode(None, remote, prompt, SpecConfig(k=3, entropy_threshold=0, policy="sample",
                                                                              drafter=drafter),
                                             DecodeConfig(max_new_tokens=12, temperature=0.7))
            finally:
                remote.close()
            assert split.tokens == autoregressive_decode(cloud_model.backend, prompt, decode).tokens
            assert all(c.escalated and c.wire_up_bytes > 0 for c in split.cycles)
            assert sampled.new_tokens == 12 and all(c.escalated for c in sampled.cycles)
            empty += sum(not c.draft_tokens for c in split.cycles + sampled.cycles)
    assert (empty > 0) == (drafter != "repeat-last")
