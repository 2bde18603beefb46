"""The suffix drafter (specdec/core/drafters/suffix.py): the longest suffix's occurrences in two corpora kept apart
(this request's prompt and output; earlier outputs, bounded), their continuations scored by frequency into a
best-first tree or chain, sized by the match and, if asked, by the verifier's cost curve; every text the cloud's own
greedy decoding."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from specdec.backends.prompt import Prompt
from specdec.core.drafters.suffix import Candidates, Outputs, SuffixSettings, candidates, continuations, longest_match
from specdec.core.payoff import best_prefix, steps_at
from tests.tiny import random_prompt, tiny_causal

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

# after [1, 2]: 4 7 1 (ends at 1), 4 1 2 (at 5), 5 1 3 (at 8); the corpus ends in [1, 2] itself
CORPUS = np.array([1, 2, 4, 7, 1, 2, 4, 1, 2, 5, 1, 3, 6, 9, 1, 2])


def test_the_longest_suffix_is_found_with_every_occurrence_that_has_a_next_token():
    match, ends = longest_match(CORPUS, CORPUS, 24)
    assert match == 2 and ends.tolist() == [1, 5, 8]  # the pattern's own end (15) has nothing after it
    assert longest_match(CORPUS, CORPUS, 1)[0] == 1  # max_depth bounds the match
    assert longest_match(CORPUS, np.array([8]), 24)[0] == 0
    assert longest_match(np.array([3, 4, -1, 5]), np.array([4]), 24)[0] == 0  # nothing crosses a separator


def test_continuations_are_scored_by_their_share_of_the_occurrences():
    found = {path: score for path, score, _ in continuations(CORPUS, np.array([1, 5, 8]), 3, 0.1)}
    assert found[(4,)] == pytest.approx(2 / 3) and found[(5,)] == pytest.approx(1 / 3)
    assert found[(4, 1, 2)] == pytest.approx(1 / 3) and len(found) == 8
    assert {path for path, _, _ in continuations(CORPUS, np.array([1, 5, 8]), 3, 0.5)} == {(4,)}  # min score
    # a continuation stops at a separator
    assert [path for path, _, _ in continuations(np.array([1, 2, -1, 7]), np.array([0]), 3, 0.1)] == [(2,)]


def test_the_tree_is_best_first_with_parents_before_children_and_the_chain_its_best_path():
    tree_settings = SuffixSettings(tree_nodes=5, spec_factor=0)
    tree = candidates(CORPUS, CORPUS, tree_settings, 3).tree()
    # 4 (2/3) first; then the 1/3s by depth, the newest first: 5 (at 8), then 5-1 (at 8), 4-1 (at 5), 4-7 (at 1)
    assert tree.tokens.tolist() == [4, 5, 1, 1, 7] and tree.parents == (-1, -1, 1, 0, 0)
    chain = candidates(CORPUS, CORPUS, SuffixSettings(spec_factor=0), 3)
    assert chain.paths == ((4,), (4, 1), (4, 1, 2)) and chain.tree().is_chain  # at a tie, the newest continuation
    assert candidates(CORPUS, CORPUS, SuffixSettings(spec_factor=0), 2).paths == ((4,), (4, 1))  # k deep at most
    # the match's length sizes it: a 2-token match, spec_factor 1, proposes 2 tokens at most
    assert len(candidates(CORPUS, CORPUS, SuffixSettings(tree_nodes=8), 4).paths) == 2
    assert candidates(CORPUS, np.array([8]), tree_settings, 3) == Candidates()


def test_the_global_corpus_keeps_the_newest_outputs_within_its_budget_and_leaves_the_session_out():
    outputs = Outputs(budget=10)
    first, second, third = (outputs.new_key() for _ in range(3))
    outputs.put(first, np.array([1, 2, 3, 4]))
    outputs.put(second, np.array([5, 6, 7]))
    assert outputs.corpus(third).tolist() == [1, 2, 3, 4, -1, 5, 6, 7]
    assert outputs.corpus(first).tolist() == [5, 6, 7]  # a session's own output is its own corpus, not the global's
    outputs.put(third, np.array([8, 9, 10, 11]))  # 11 tokens: the oldest output goes
    assert list(outputs.parts) == [second, third]
    outputs.put(third, np.arange(20))  # the growing output is kept whole, even past the budget
    assert list(outputs.parts) == [third]


def test_a_block_is_sized_by_the_cost_curve():
    curve = {5: 1.3, 9: 2.0}
    assert [steps_at(curve, rows) for rows in (1, 3, 5, 7, 9)] == pytest.approx([1.0, 1.15, 1.3, 1.65, 2.0])
    assert steps_at(curve, 11) == pytest.approx(2.25)  # past the largest: the line from a step through it
    assert steps_at({}, 6) == 1.0  # nothing measured: flat
    assert best_prefix([1.0, 1.0, 0.5, 0.2, 0.1], 1.0, lambda rows: steps_at(curve, rows)) == 3
    assert best_prefix([0.3, 0.1], 1.0, lambda rows: steps_at({2: 1.5, 3: 2.0}, rows)) == 0  # a plain step pays more
    assert best_prefix([0.3, 0.1], 1.0, lambda rows: 1.0) == 2  # flat: send them all
    assert best_prefix([0.9, 0.9], 0.2, lambda rows: steps_at({2: 1.3}, rows)) == 0  # scores found overconfident


@pytest.fixture(scope="module")
def kernels():
    from specdec.backends.packed import PackedBackend

    return {weights: PackedBackend.from_model(tiny_causal("qwen2"), weights) for weights in ("int8", "int4")}


def repeating(seed: int) -> Prompt:
    base = random_prompt(seed, 10)
    return Prompt(torch.cat([base, base[1:7], base[3:9]]))


@pytest.mark.parametrize("weights", ["int8", "int4"])
@pytest.mark.parametrize("options", ["", "tree_nodes=6,spec_factor=0", "tree_nodes=6,spec_factor=0,by_cost=1",
                                     "global_tokens=0"])
def test_suffix_chains_and_trees_are_the_clouds_own_greedy_decoding(kernels, weights, options):
    from specdec.core.config import DecodeConfig, SpecConfig
    from specdec.core.decode import SpecOptions, autoregressive_decode, speculative_decode
    from specdec.core.history import History

    backend = kernels[weights]
    history = History()  # the global corpus carries across the generations, as in one engine
    settings = SpecConfig(k=4, entropy_threshold=0, policy="greedy", drafter="suffix", drafter_options=options)
    kept = trees = 0
    for seed in range(4):
        decode = DecodeConfig(max_new_tokens=20)
        plain = autoregressive_decode(backend, repeating(seed), decode).tokens
        generation = speculative_decode(None, backend, repeating(seed), settings, decode, SpecOptions(history=history))
        assert generation.tokens == plain, seed
        kept += generation.counters.num_accepted_tokens
        trees += sum(len(c.draft_tokens) > settings.k for c in generation.cycles)
    assert kept > 0
    if "by_cost" not in options:  # sized by cost, the shapes follow measured times; its text is the cloud's all the same
        assert (trees > 0) == ("tree_nodes" in options)  # only a tree holds more nodes than k (it is still k deep)
    assert bool(history.drafters["suffix"].outputs.parts) == ("global_tokens=0" not in options)


def test_the_global_corpus_proposes_what_earlier_outputs_continued():
    """A prompt that never says what follows is drafted from an earlier request's output."""
    from specdec.core.drafters import DraftContext, make_drafter
    from specdec.core.history import History
    from specdec.core.processors import Constraints
    from specdec.core.session import AcceptedSequence

    history = History()

    def drafter(options: str = ""):
        return make_drafter("suffix", DraftContext(Prompt(torch.tensor([0])), 32, Constraints(), 0.0,
                                                   torch.Generator(), history=history), options)

    first = drafter()
    seq = AcceptedSequence(torch.tensor([3, 1]), 8)
    first.propose(seq, 4)
    seq.extend([5, 6, 7, 8])
    first.rollback(seq, first.propose(seq, 4), None)  # the output [5, 6, 7, 8] joins the global corpus
    later = AcceptedSequence(torch.tensor([9, 4, 5, 6]), 8)  # ends in 5 6, which the prompt never continues
    assert drafter().propose(later, 4).tokens.tolist() == [7, 8]  # the match (2 tokens) bounds it
    assert drafter("global_tokens=0").propose(later, 4).tokens.tolist() == []


def test_a_block_that_does_not_pay_is_a_plain_step_and_still_teaches_the_calibration(kernels):
    """Blocks the machine's curve prices far above a step are withheld: every cycle a plain step, the text the
    cloud's own, and the withheld nodes scored against the tokens the steps decided."""
    from specdec.core.config import DecodeConfig, SpecConfig
    from specdec.core.decode import SpecOptions, autoregressive_decode, speculative_decode
    from specdec.core.history import History

    history = History(block_steps_prior={rows: 10.0 for rows in range(2, 10)})
    settings = SpecConfig(k=4, entropy_threshold=0, policy="greedy", drafter="suffix",
                          drafter_options="tree_nodes=6,by_cost=1")
    decode = DecodeConfig(max_new_tokens=16)
    generation = speculative_decode(None, kernels["int8"], repeating(1), settings, decode, SpecOptions(history=history))
    assert generation.tokens == autoregressive_decode(kernels["int8"], repeating(1), decode).tokens
    assert all(not c.draft_tokens for c in generation.cycles)
    assert {c.drafter for c in generation.cycles} <= {"plain", "suffix"} and "plain" in {c.drafter for c in generation.cycles}
    assert history.drafters["suffix"].kept_per_score.count > 0  # the withheld nodes were scored


def test_the_suffix_drafters_options_are_checked_in_one_line():
    from specdec.core.drafters import drafter_options
    from specdec.errors import ConfigError

    assert drafter_options("suffix", "tree_nodes=8,by_cost=1")["tree_nodes"] == 8
    for text, word in (("by_cost=-1", ">= 0"), ("branches=2", "takes no option"), ("max_depth=0", ">= 1")):
        with pytest.raises(ConfigError) as error:
            drafter_options("suffix", text)
        assert word in str(error.value) and "\n" not in str(error.value)


def test_the_shipped_suffix_sweep_sets_the_suffix_drafter_beside_prompt_lookup_and_the_fastest_plain_decoding():
    from bench.measure.sweep.sweep_config import CONFIGS_DIR, SweepConfig

    points = SweepConfig.from_toml(CONFIGS_DIR / "suffix.toml").points()
    assert [(p.mode, p.cloud_runtime, p.drafter, p.drafter_options) for p in points] == [
        ("cloud", "kernels-int4", None, None), ("cloud", "llamacpp", None, None),
        ("spec", "kernels-int4", "prompt-lookup", ""), ("spec", "kernels-int4", "suffix", ""),
        ("spec", "kernels-int4", "suffix", "tree_nodes=8"), ("spec", "kernels-int4", "suffix", "tree_nodes=8,by_cost=1")]
