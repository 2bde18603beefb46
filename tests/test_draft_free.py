"""Draft-free drafters: prompt lookup finds the longest recurring suffix and proposes what followed
its newest occurrence; the n-gram cache proposes the most frequent continuations it has counted
across generations; the hybrid uses lookup when it matches and the edge model otherwise. Each keeps
greedy decoding the cloud's own, token for token, and says which drafter made each block."""
from __future__ import annotations

import pytest
import torch

from specdec import DecodeConfig, Prompt, SpecConfig, autoregressive_decode, speculative_decode
from specdec.backends.hf_causal import HFCausalBackend
from specdec.core.drafters.ngram import NgramTable
from specdec.core.drafters.prompt_lookup import lookup
from tests.tiny import noisy_copy, tiny_causal

T = torch.tensor


def test_lookup_takes_the_longest_suffix_first():
    # the 2-gram (7, 8) recurs at 1 and proposes what followed it; the 1-gram 8 also recurs at 5
    ids = T([5, 7, 8, 1, 2, 8, 9, 9, 7, 8])
    assert lookup(ids, 3).tolist() == [1, 2, 8]
    assert lookup(ids, 3, max_ngram=1).tolist() == [9, 9, 7]  # 1-gram only: the newest 8 (at 5) wins


def test_lookup_prefers_the_newest_match_and_stops_at_the_end_of_the_sequence():
    ids = T([3, 4, 10, 3, 4, 11, 12, 3, 4])
    assert lookup(ids, 2).tolist() == [11, 12]  # (3, 4) at 0 and 3: the newest one
    assert lookup(T([6, 1, 2, 6]), 5).tolist() == [1, 2, 6]  # fewer than k tokens follow it


def test_no_recurring_suffix_means_no_draft():
    assert lookup(T([1, 2, 3, 4]), 4).numel() == 0
    assert lookup(T([9]), 4).numel() == 0
    assert lookup(T([1, 2, 1, 3]), 4, min_ngram=2).numel() == 0  # only a 1-gram recurs


def test_the_ngram_table_counts_continuations_and_prefers_the_longest_context():
    table = NgramTable(max_ngram=2)
    table.add([1, 2, 3, 1, 2, 4, 1, 2, 3])
    assert table.continuation([1, 2], min_count=1) == 3  # (1, 2) -> 3 twice, 4 once
    assert table.continuation([5, 2], min_count=1) == 3  # (5, 2) unseen: falls back to (2,)
    assert table.continuation([7], min_count=1) is None
    assert table.continuation([1, 2], min_count=3) is None  # no continuation counted 3 times


@pytest.fixture(scope="module")
def pair():
    cloud = tiny_causal("llama", sharpness=8.0)
    return HFCausalBackend(noisy_copy(cloud, noise=0.2)), HFCausalBackend(cloud)


def looping_prompt(seed: int) -> Prompt:
    """Prompts that repeat themselves, as a text to summarize or edit does: lookup finds matches."""
    generator = torch.Generator().manual_seed(seed)
    phrase = torch.randint(0, 96, (5,), generator=generator)
    return Prompt(torch.cat([phrase, torch.randint(0, 96, (3,), generator=generator), phrase]))


@pytest.mark.parametrize("drafter", ["prompt-lookup", "ngram", "hybrid"])
@pytest.mark.parametrize("verifier", ["cached", "stateless"])
def test_greedy_with_each_drafter_is_the_clouds_greedy(pair, drafter, verifier):
    edge, cloud = pair
    spec = SpecConfig(k=4, entropy_threshold=0, policy="greedy", verifier=verifier)
    decode = DecodeConfig(max_new_tokens=24)
    memory, made_by, kept = {}, set(), 0
    for seed in range(6):
        prompt = looping_prompt(seed)
        generation = speculative_decode(edge if drafter == "hybrid" else None, cloud, prompt, spec, decode,
                                        drafter=drafter, drafter_memory=memory)
        assert generation.tokens == autoregressive_decode(cloud, prompt, decode).tokens, seed
        made_by |= {c.drafter for c in generation.cycles}
        kept += generation.counters.num_accepted_tokens
    assert kept > 0  # draft tokens were accepted, not only the cloud's own
    expected = {"prompt-lookup": {"prompt-lookup"}, "ngram": {"ngram"}, "hybrid": {"prompt-lookup", "model"}}[drafter]
    assert made_by == expected
    if drafter == "ngram":
        assert memory["ngram"].next  # the counts carry across generations


def test_an_edge_without_a_model_for_a_draft_free_drafter_is_not_loaded(pair):
    """edge None: nothing runs on the edge but lookup; prefill and edge compute are the lookup's alone."""
    _, cloud = pair
    generation = speculative_decode(None, cloud, looping_prompt(0), SpecConfig(k=3, policy="greedy"),
                                    DecodeConfig(max_new_tokens=8), drafter="prompt-lookup")
    assert generation.prefill_s == 0.0 and generation.new_tokens == 8


def test_a_draft_free_spec_run_never_loads_the_edge_model(pair, tmp_path):
    """As an edge-only run never loads the cloud: prompt lookup verified here loads the cloud model alone."""
    from specdec.engine import Engine
    from tests.tiny import save_tiny_pair

    paths = save_tiny_pair(tmp_path)
    loaded = []

    def loader(name, dtype, log=print):
        from specdec.models.loading import load_model
        loaded.append(name)
        return load_model(name, dtype, log=log)

    spec = SpecConfig(k=3, policy="greedy", drafter="prompt-lookup")
    engine = Engine(mode="spec", edge=paths["edge"], cloud=paths["cloud"], dtype="float32", spec=spec,
                    decode=DecodeConfig(max_new_tokens=8), loader=loader, log=lambda m: None)
    generation = engine.generate("hello world , hello world ,")
    cloud_only = Engine(mode="cloud", cloud=paths["cloud"], dtype="float32", decode=DecodeConfig(max_new_tokens=8),
                        log=lambda m: None).generate("hello world , hello world ,")
    assert loaded == [paths["cloud"]] and generation.tokens == cloud_only.tokens
    assert {c.drafter for c in generation.cycles} == {"prompt-lookup"}


def test_auto_sends_a_block_only_while_its_tokens_per_verify_pay_for_its_cost():
    from specdec.core.drafters.auto import CostCurve

    curve = CostCurve()
    assert curve.ratio(5) == 1.0 and curve.prior_tau() == 2.0  # nothing measured: send, and learn
    for seconds in (0.10, 0.12):
        curve.observe(1, seconds)
    curve.observe(5, 0.33)
    assert curve.ratio(5) == pytest.approx(3.0)  # a 5-token forward costs 3 plain steps: tau must beat 3
    assert curve.ratio(3) == 1.0  # an unmeasured size is sent, to measure it


@pytest.mark.parametrize("verifier", ["cached", "stateless"])
def test_auto_switching_between_blocks_and_plain_steps_mid_request_stays_lossless(pair, verifier):
    """With blocks made to look expensive, auto withholds most of them (plain steps) and sends every
    PROBE-th: both kinds of cycle in one request, and the output is still the cloud's greedy."""
    from specdec.core.drafters.auto import PLAIN, CostCurve

    _, cloud = pair
    curve = CostCurve()
    curve.observe(1, 0.01)
    for n in range(2, 7):
        curve.observe(n, 1.0)  # 100 plain steps a block: no acceptance pays for it
    memory = {"auto": curve}
    spec = SpecConfig(k=4, entropy_threshold=0, policy="greedy", verifier=verifier)
    decode = DecodeConfig(max_new_tokens=40)
    kinds, switched = set(), False
    for seed in range(4):
        prompt = looping_prompt(seed)
        generation = speculative_decode(None, cloud, prompt, spec, decode, drafter="auto", drafter_memory=memory)
        assert generation.tokens == autoregressive_decode(cloud, prompt, decode).tokens, seed
        drafted = [c.drafter for c in generation.cycles]
        kinds |= set(drafted)
        if "prompt-lookup" in drafted and PLAIN in drafted[drafted.index("prompt-lookup") + 1:]:
            switched = True
    assert kinds == {"prompt-lookup", PLAIN} and switched
