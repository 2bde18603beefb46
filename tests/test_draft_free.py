"""Draft-free drafters: prompt lookup finds the longest recurring suffix and proposes what followed
its newest occurrence; the n-gram cache proposes the most frequent continuations it has counted
across generations; the hybrid uses lookup when it matches and the edge model otherwise. Each keeps
greedy decoding the cloud's own, token for token, and says which drafter made each block."""
from __future__ import annotations

import time
from dataclasses import replace

import pytest
import torch

from specdec import DecodeConfig, Prompt, SpecConfig, autoregressive_decode, speculative_decode
from specdec.backends.hf_causal import HFCausalBackend
from specdec.core import cloud as cloud_module
from specdec.core.decode import SpecOptions
from specdec.core.drafters.ngram import NgramTable
from specdec.core.drafters.prompt_lookup import lookup
from specdec.core.history import History
from specdec.core.payoff import block_steps
from specdec.core.processors import Constraints
from specdec.core.running import RunningMean
from specdec.core.two_runtime import Router
from specdec.core.verdict import Route
from specdec.errors import ConfigError
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


@pytest.mark.parametrize("drafter", ["prompt-lookup", "ngram", "suffix", "hybrid"])
@pytest.mark.parametrize("verifier", ["cached", "stateless"])
def test_greedy_with_each_drafter_is_the_clouds_greedy(pair, drafter, verifier):
    edge, cloud = pair
    spec = SpecConfig(k=4, entropy_threshold=0, policy="greedy", verifier=verifier, drafter=drafter)
    decode = DecodeConfig(max_new_tokens=24)
    history, made_by, kept = History(), set(), 0
    for seed in range(6):
        prompt = looping_prompt(seed)
        generation = speculative_decode(edge if drafter == "hybrid" else None, cloud, prompt, spec, decode,
                                        SpecOptions(history=history))
        assert generation.tokens == autoregressive_decode(cloud, prompt, decode).tokens, seed
        made_by |= {c.drafter for c in generation.cycles}
        kept += generation.counters.num_accepted_tokens
    assert kept > 0  # draft tokens were accepted, not only the cloud's own
    expected = {"prompt-lookup": {"prompt-lookup"}, "ngram": {"ngram"}, "suffix": {"suffix"},
                "hybrid": {"prompt-lookup", "model"}}[drafter]
    # the hybrid's model drafts until its costs are measured, then only while its blocks pay (else plain steps)
    assert expected <= made_by <= expected | ({"plain"} if drafter == "hybrid" else set())
    if drafter == "ngram":
        assert history.drafters["ngram"].next  # the counts carry across generations
    if drafter == "suffix":
        assert len(history.drafters["suffix"].outputs.parts) == 6  # each generation's output joined the global corpus


def lookup_drafter(history: History, options: str = "by_cost=1"):
    from specdec.core.drafters import make_drafter
    from specdec.core.drafters.interface import DraftContext

    return make_drafter("prompt-lookup", DraftContext(Prompt(T([0])), 96, Constraints(), 0.0, torch.Generator(),
                                                       history=history), options)


def test_lookups_kept_counts_are_per_match_length_and_position():
    from specdec.core.drafters.prompt_lookup import KeptCounts

    counts = KeptCounts()
    assert counts.scores(3, 2) == [0.5, 0.25]  # nothing counted: an even chance a token
    counts.add(3, 4, 4)  # all four kept
    counts.add(3, 4, 1)  # the first kept, the second not: the third and fourth never reached
    assert counts.reached[3] == [2, 2, 1, 1] and counts.kept[3] == [2, 1, 1, 1]
    assert counts.scores(3, 3) == pytest.approx([3 / 4, 3 / 4 * 2 / 4, 3 / 4 * 2 / 4 * 2 / 3])
    assert counts.scores(1, 1) == [0.5]  # another match length: its own counts


def test_lookup_by_cost_sends_what_the_curve_pays_for_and_learns_from_continuations_not_sent():
    """Priced by the machine's curve: steep, the even-chance continuation is withheld (a plain step); flat, sent whole.
    The plain steps decide the withheld tokens, the counts learn that they were kept, and the chain then pays."""
    from specdec.core.session import AcceptedSequence

    flat = lookup_drafter(History(block_steps_prior={rows: 1.0 for rows in range(2, 10)}))
    seq = AcceptedSequence(T([7, 1, 2, 3, 4, 9, 7, 1]), 8)  # (7, 1) recurs: 2 3 4 9 follow
    assert flat.propose(seq, 4).tokens.tolist() == [2, 3, 4, 9]
    history = History(block_steps_prior={2: 1.6, 3: 2.2, 4: 2.8, 5: 3.4})  # a row 0.6 of a step
    for request in range(20):  # a drafter a request, the counts the engine's
        steep = lookup_drafter(history)
        seq = AcceptedSequence(T([7, 1, 2, 3, 4, 9, 7, 1]), 8)
        proposal = steep.propose(seq, 4)
        if request == 0:  # even chances: 1.5 tokens for 1.6 steps, 1.75 for 2.2, ...: no length beats a step
            assert len(proposal) == 0 and proposal.drafter == PLAIN and steep.found == [(8, [2, 3, 4, 9], 2)]
        seq.extend([2, 3, 4, 9])  # the plain steps' text: the continuation, whole
        steep.propose(seq, 4)  # reads the decided tokens off
    assert history.drafters["prompt-lookup:kept"].kept[2][:4] == [20, 20, 20, 20]
    seq = AcceptedSequence(T([7, 1, 2, 3, 4, 9, 7, 1]), 8)
    assert lookup_drafter(history).propose(seq, 4).tokens.tolist() == [2, 3, 4, 9]  # 21/22 a token: 4.57 for 3.4 steps


def test_lookup_by_cost_is_the_clouds_greedy_and_refuses_trees_in_one_line(pair):
    edge, cloud = pair
    spec = SpecConfig(k=4, entropy_threshold=0, policy="greedy", drafter="prompt-lookup", drafter_options="by_cost=1")
    decode = DecodeConfig(max_new_tokens=24)
    history, lengths = History(block_steps_prior={2: 1.2, 3: 1.4, 4: 1.6, 5: 1.8}), set()
    for seed in range(6):
        prompt = looping_prompt(seed)
        generation = speculative_decode(None, cloud, prompt, spec, decode, SpecOptions(history=history))
        assert generation.tokens == autoregressive_decode(cloud, prompt, decode).tokens, seed
        lengths |= {len(c.draft_tokens) for c in generation.cycles}
    assert len(lengths) > 1 and history.drafters["prompt-lookup:kept"].reached  # sized, and learning
    with pytest.raises(ConfigError, match="by_cost sizes a chain; with branches > 1 it proposes trees") as refused:
        lookup_drafter(History(), "by_cost=1,branches=4")
    assert "\n" not in str(refused.value)


def hybrid_costs(draft_s: float, tau: float, edge_s_per_token: float = 0.0, weight: int = 1):
    """The cloud verified in int8 (a step 60 ms, a 5-token block 65 ms), a model proposal of 4 tokens
    costing draft_s, model blocks carrying tau tokens per verify."""
    history = History()
    for _ in range(weight):
        history.verify.observe(Route.STEP, 1, 0.060)
        history.verify.observe(Route.BLOCK, 5, 0.065)
    history.edge.proposal = RunningMean(draft_s * weight, weight)
    history.edge.catch_up = RunningMean(edge_s_per_token * 1000 * weight, 1000 * weight)
    history.tau = RunningMean(tau * weight, weight)
    return history


def test_the_hybrids_model_drafts_only_while_its_blocks_pay_for_drafting_and_catching_up(pair):
    """Lookup's match goes first; without one the model drafts only where (drafting + verify) / tau beats
    a plain step, and where the rest of the answer pays for feeding the edge what it has not seen."""
    from specdec.core.drafters.hybrid import Hybrid
    from specdec.core.drafters.interface import DraftContext
    from specdec.core.session import AcceptedSequence

    edge, _ = pair

    def proposal(costs, ids):
        context = DraftContext(Prompt(T(ids[:4])), 96, Constraints(), 0.0, torch.Generator(), edge, history=costs)
        return Hybrid(context).propose(AcceptedSequence(T(ids), 128), 4).drafter

    fresh = list(range(40))  # no token recurs: lookup has nothing
    assert proposal(hybrid_costs(0.080, 2.4), [5, 6, 7, 5, 6]) == "prompt-lookup"  # (5, 6) recurs
    assert proposal(hybrid_costs(0.080, 2.4), fresh) == "plain"  # (80 + 65) / 2.4 = 60 ms a token: no gain
    assert proposal(hybrid_costs(0.080, 2.4), [5, 6, 7, 8, 5]) == "prompt-lookup"  # ... so lookup's one-token match
    assert proposal(hybrid_costs(0.080, 3.0), [5, 6, 7, 8, 5]) == "model"  # too weak where the model pays
    assert proposal(hybrid_costs(0.080, 3.0), fresh) == "model"  # 48 ms a token, 12 saved x 128 > 40 x 0
    assert proposal(hybrid_costs(0.080, 3.0, 0.003), list(range(900))) == "plain"  # 900 x 3 ms > 128 x 12 ms
    assert proposal(hybrid_costs(0.080, 3.0, 0.003), fresh) == "model"  # 40 x 3 ms < 1.5 s
    assert proposal(History(), fresh) == "model"  # nothing measured: draft, and learn


@pytest.mark.parametrize("verifier", ["cached", "stateless"])
def test_a_hybrid_whose_model_does_not_pay_takes_plain_steps_and_stays_lossless(pair, verifier):
    """The model measured as too dear: the hybrid sends what lookup alone would (its blocks where a suffix
    recurs, plain steps elsewhere), and the output is still the cloud's greedy."""
    edge, cloud = pair
    history = hybrid_costs(1.0, 2.0, weight=1000)  # weighty: the tiny pair's own timings barely move them
    spec, decode = SpecConfig(k=4, entropy_threshold=0, policy="greedy", verifier=verifier), DecodeConfig(max_new_tokens=24)
    made_by = set()
    for seed in range(4):
        prompt = looping_prompt(seed)
        generation = speculative_decode(edge, cloud, prompt, replace(spec, drafter="hybrid"), decode,
                                        SpecOptions(history=history))
        assert generation.tokens == autoregressive_decode(cloud, prompt, decode).tokens, seed
        made_by |= {c.drafter for c in generation.cycles}
        lookup_alone = speculative_decode(None, cloud, prompt, replace(spec, drafter="prompt-lookup"), decode)
        assert [c.draft_tokens for c in generation.cycles] == [c.draft_tokens for c in lookup_alone.cycles], seed
    assert made_by == {"prompt-lookup", "plain"}


@pytest.mark.parametrize("verifier", ["cached", "stateless"])
def test_the_hybrid_over_the_suffix_drafter_is_the_clouds_greedy_and_its_corpus_takes_every_output(pair, verifier):
    """`suffix=1`: the suffix drafter's chain of 2+ tokens goes first, the model otherwise; every text is the cloud's
    greedy; each generation's output joins the global corpus whoever drafted it, and the scores' calibration learns
    from the suffix drafter's own blocks only (the model's verdicts would teach it nothing about its scores)."""
    edge, cloud = pair
    spec = SpecConfig(k=4, entropy_threshold=0, policy="greedy", verifier=verifier, drafter="hybrid",
                      drafter_options="suffix=1")
    decode = DecodeConfig(max_new_tokens=24)
    history, made_by, suffix_kept = History(), set(), 0
    for seed in range(6):
        prompt = looping_prompt(seed)
        generation = speculative_decode(edge, cloud, prompt, spec, decode, SpecOptions(history=history))
        assert generation.tokens == autoregressive_decode(cloud, prompt, decode).tokens, seed
        made_by |= {c.drafter for c in generation.cycles}
        suffix_kept += sum(c.accepted for c in generation.cycles if c.drafter == "suffix")
    assert {"suffix", "model"} <= made_by <= {"suffix", "model", "plain"}
    record = history.drafters["suffix"]
    assert len(record.outputs.parts) == 6 and record.kept_per_score.total == suffix_kept


def test_the_hybrids_suffix_half_goes_first_with_two_tokens_and_alone_where_the_model_does_not_pay(pair):
    from specdec.core.drafters.hybrid import Hybrid
    from specdec.core.drafters.interface import DraftContext
    from specdec.core.session import AcceptedSequence

    edge, _ = pair

    def proposal(costs, ids):
        context = DraftContext(Prompt(T(ids[:4])), 96, Constraints(), 0.0, torch.Generator(), edge, history=costs,
                               options={"suffix": 1})
        made = Hybrid(context).propose(AcceptedSequence(T(ids), 128), 4)
        return made.drafter, made.tokens.tolist()

    fresh = list(range(40))
    assert proposal(hybrid_costs(0.080, 2.4), [5, 6, 7, 5, 6]) == ("suffix", [7, 5])  # (5, 6) recurs: its chain
    assert proposal(hybrid_costs(0.080, 3.0), [5, 6, 7, 8, 5])[0] == "model"  # one token: too weak where the model pays
    assert proposal(hybrid_costs(0.080, 2.4), [5, 6, 7, 8, 5]) == ("suffix", [6])  # one token, the model too dear
    assert proposal(hybrid_costs(0.080, 2.4), fresh) == ("plain", [])
    assert proposal(History(), fresh)[0] == "model"  # nothing measured: draft, and learn


def test_a_head_vocabulary_on_an_edge_that_computes_its_whole_head_is_one_line(pair):
    edge, cloud = pair
    spec = SpecConfig(k=3, entropy_threshold=0, policy="greedy", drafter="model", drafter_options="head_vocab=32")
    with pytest.raises(ConfigError, match=r"^HFCausalBackend \(.*\) computes its whole output head: a drafter's head_vocab "
                                          r"needs an edge runtime that computes part of it \(kernels-int8, kernels-int4\), "
                                          r"or drop head_vocab$"):
        speculative_decode(edge, cloud, looping_prompt(0), spec, DecodeConfig(max_new_tokens=4))


def test_an_edge_without_a_model_for_a_draft_free_drafter_is_not_loaded(pair):
    """edge None: nothing runs on the edge but lookup; prefill and edge compute are the lookup's alone."""
    _, cloud = pair
    generation = speculative_decode(None, cloud, looping_prompt(0), SpecConfig(k=3, policy="greedy", drafter="prompt-lookup"),
                                    DecodeConfig(max_new_tokens=8))
    assert generation.prefill_s == 0.0 and generation.new_tokens == 8


def test_a_draft_free_spec_run_never_loads_the_edge_model(pair, tmp_path):
    """As an edge-only run never loads the cloud: prompt lookup verified here loads the cloud model alone."""
    from specdec.engine import Engine
    from tests.tiny import save_tiny_pair

    paths = save_tiny_pair(tmp_path)
    loaded = []

    def loader(name, settings, log=print):
        from specdec.models.loading import load
        loaded.append(name)
        return load(name, settings, log)

    spec = SpecConfig(k=3, policy="greedy", drafter="prompt-lookup")
    engine = Engine(mode="spec", edge=paths["edge"], cloud=paths["cloud"], dtype="float32", spec=spec,
                    decode=DecodeConfig(max_new_tokens=8), loader=loader, log=lambda m: None)
    generation = engine.generate("hello world , hello world ,")
    cloud_only = Engine(mode="cloud", cloud=paths["cloud"], dtype="float32", decode=DecodeConfig(max_new_tokens=8),
                        log=lambda m: None).generate("hello world , hello world ,")
    assert loaded == [paths["cloud"]] and generation.tokens == cloud_only.tokens
    assert {c.drafter for c in generation.cycles} == {"prompt-lookup"}


def test_auto_sends_a_block_only_while_its_tokens_per_verify_pay_for_its_cost():
    history = History()
    auto = auto_drafter(history)

    def ratio(tokens_fed: int) -> float:  # t_block(n + 1) / t_plain(1) as auto's rule reads it
        return block_steps(auto.evidence(tokens_fed - 1))

    assert ratio(5) == 1.0 and history.tau_prior() == 2.0  # nothing measured: send, and learn
    for seconds in (0.10, 0.12):
        history.verify.observe(Route.STEP, 1, seconds)
    history.verify.observe(Route.BLOCK, 5, 0.33)
    assert ratio(5) == pytest.approx(3.0)  # a 5-token forward costs 3 plain steps: tau must beat 3
    assert ratio(3) == 1.0  # an unmeasured size is sent, to measure it
    history.verify.observe(Route.STEP, 5, 9.0)  # a plain step that fed 5 tokens (a catch-up) is no block
    assert ratio(5) == pytest.approx(3.0)


def test_a_block_pays_only_where_its_tokens_per_verify_beat_its_cost_in_plain_steps():
    """The pure rule: (t_block + d) / (τ̂ · t_plain) < 1, and what that saves over the tokens left pays for a feed."""
    from specdec.core.payoff import BlockEvidence, block_pays, steps_per_token

    lookup_block = BlockEvidence(tau_hat=3.0, block_s=0.33, step_s=0.11)  # a block costs 3 plain steps
    assert not block_pays(lookup_block)  # 3 steps for 3 tokens: no gain
    assert block_pays(replace(lookup_block, tau_hat=3.1))
    assert block_pays(BlockEvidence(2.0, None, 0.1, prior_steps=1.9))  # unmeasured: the calibrated cost decides
    assert not block_pays(BlockEvidence(2.0, 0.2, None, prior_steps=2.5))
    model_block = BlockEvidence(3.0, 0.065, 0.060, draft_s=0.080)  # (65 + 80) / 3 = 48 ms a token against 60
    assert steps_per_token(model_block) == pytest.approx(0.145 / 0.180) and block_pays(model_block)
    assert not block_pays(replace(model_block, tau_hat=2.4))  # 60.4 ms a token
    assert block_pays(replace(model_block, feed_s=1.4, tokens_left=128))  # 11.7 ms x 128 = 1.49 s saved > 1.4 s
    assert not block_pays(replace(model_block, feed_s=1.6, tokens_left=128))


def auto_drafter(history, two_runtimes: bool = False, prompt_ids=(1, 2, 3, 1, 2)):
    from specdec.core.drafters.auto import Auto
    from specdec.core.drafters.interface import DraftContext

    prompt = Prompt(T(list(prompt_ids)))
    router = Router(history) if two_runtimes else None
    return Auto(DraftContext(prompt, 96, None, 0.0, torch.Generator(), history=history, router=router))


def test_a_withheld_block_teaches_auto_its_tokens_per_verify_once_the_plain_steps_decide_them():
    """Blocks made to look too dear are withheld; the plain steps that follow decide the withheld tokens,
    and auto reads off what a greedy verify would have kept (matched prefix + the cloud's token)."""
    from specdec.core.session import AcceptedSequence
    from specdec.core.verdict import Verdict

    history = History()
    history.verify.observe(Route.STEP, 1, 0.01)
    history.verify.observe(Route.BLOCK, 3, 1.0)  # a 2-token block costs 100 plain steps
    auto = auto_drafter(history)
    seq = AcceptedSequence(T([1, 2, 3, 1, 2]), 8)
    proposal = auto.propose(seq, 2)  # lookup: (1, 2) recurs, proposes 3, 1
    assert proposal.drafter == PLAIN and len(proposal) == 0 and auto.withheld == [(5, [3, 1])]
    for token, tau_after in ((3, None), (1, 3)):  # the steps decide 3 (pending), then 1: both matched -> tau 3
        seq.extend([token])
        verdict = Verdict(0, token, 1, False)
        verdict.sent_at, verdict.read_at = 0.0, 0.01
        before = auto.tau_hat
        auto.rollback(seq, proposal, verdict)
        if tau_after is None:
            assert auto.tau_hat == before and auto.withheld == [(5, [3, 1])]
        else:
            assert auto.tau_hat == pytest.approx(0.5 * tau_after + 0.5 * before) and history.tau == RunningMean(3.0, 1)
    seq2 = AcceptedSequence(T([4, 5, 4]), 4)
    auto.withheld = [(3, [5, 9])]
    seq2.extend([5, 7])  # 5 matched, 7 is not 9: a verify would have kept 1 and corrected
    auto.read_withheld(seq2)
    assert history.tau == RunningMean(5.0, 2) and auto.withheld == []


PLAIN, STAY = Route.STEP.value, Route.STAY.value  # how the trace names a plain step in A, and one in B


def test_with_two_runtimes_auto_switches_only_when_the_rest_of_the_answer_pays_for_the_catch_up():
    from specdec.core.session import AcceptedSequence

    history = History()
    history.verify.observe(Route.STEP, 1, 0.036)  # plain step in the plain runtime (A)
    history.verify.observe(Route.BLOCK, 5, 0.040)  # a 4-token block in the blocks' runtime (B)
    history.verify.observe(Route.BLOCK, 2, 0.038)  # a one-token block there
    history.blocks_runtime.catch_up = RunningMean(10.0, 1000)  # 10 ms a token to catch B up
    history.plain_runtime.catch_up = RunningMean(0.6, 30)  # 20 ms for A
    history.tau = RunningMean(3.0, 1)  # tau 3: a block costs 13 ms a token against 36: 23 ms saved a token
    long_input = AcceptedSequence(torch.arange(1000) % 50, 128)  # B 999 behind: ~10 s against 128 * 23 ms
    auto = auto_drafter(history, two_runtimes=True)
    router = auto.router
    router.plain_seen = 1000  # A prefilled the prompt (a request's first cycle)
    assert not router.stay_in_blocks(long_input, 4, auto.tau_hat)
    assert auto_drafter(history).propose(long_input, 4).drafter == "prompt-lookup"  # one runtime: no feed
    short_input = AcceptedSequence(torch.arange(40) % 20, 128)  # 39 behind: 0.4 s against 2.9 s saved
    auto = auto_drafter(history, two_runtimes=True)
    router = auto.router
    router.plain_seen = 40
    assert router.stay_in_blocks(short_input, 4, auto.tau_hat)
    # in B: nothing to propose -> a stay; B leaves on its record, not on one cycle: none yet, so it stays
    router.in_blocks, router.blocks_seen, router.plain_seen = True, 40, 1  # in B; A saw the prompt's first token only
    assert router.stay_in_blocks(short_input, 0, auto.tau_hat)
    # B's record: 38 ms a token against 36 in A: 2 ms x 128 < catching A up 39 tokens
    history.blocks_runtime.decoding = RunningMean(3.8, 100)
    assert router.stay_in_blocks(short_input, 0, auto.tau_hat)
    nothing = AcceptedSequence(torch.arange(40), 128)  # no token recurs: lookup has nothing
    proposal = auto.propose(nothing, 4)
    assert proposal.route is Route.STAY and proposal.drafter == STAY and len(proposal) == 0
    router.plain_seen = 39  # A is current: the same 2 ms a token pays for going back
    assert not router.stay_in_blocks(nothing, 0, auto.tau_hat) and auto.propose(nothing, 4).drafter == PLAIN
    router.in_blocks, router.blocks_seen = False, 1  # back in A, B behind by a token: its record (38 ms) bars the way back
    assert not router.stay_in_blocks(short_input, 4, auto.tau_hat)  # though this block alone (40 / 3 = 13 ms a token) would go


def test_with_two_runtimes_a_request_starts_in_plain_steps_and_weighs_the_first_switch_by_the_prefill():
    """A lookup match in the chat template made a request's first cycle a block: each runtime then fed
    the whole prompt (a 740-token RAG question: 11 s in int8, then 18 s in llama.cpp). The first cycle
    is a plain step whatever lookup finds; its feed measures the prompt's cost per token, which stands
    for the other runtime's until that one is measured, and a block not measured yet costs a step."""
    from specdec.core.session import AcceptedSequence

    template = AcceptedSequence(torch.tensor([7, 8, 9, 1, 2, 3, 4, 7, 8]), 128)  # "7 8" recurs: lookup proposes "9 1 2 3"
    history = History()
    auto = auto_drafter(history, two_runtimes=True)
    assert auto.lookup.propose(template, 4).tokens.numel() > 0
    assert auto.propose(template, 4).drafter == PLAIN  # nothing measured, nothing fed: the plain runtime first
    history.verify.observe(Route.STEP, 740, 18.4)
    history.plain_runtime.catch_up = RunningMean(18.4, 740)  # that first feed: 25 ms a prompt token
    history.verify.observe(Route.STEP, 1, 0.037)
    assert auto.router.catch_up_s_per_token(True) == pytest.approx(18.4 / 740)  # B's own not measured: A's stands in
    history.tau = RunningMean(3.0, 1)
    rag = AcceptedSequence(torch.arange(741) % 60, 128)
    auto = auto_drafter(history, two_runtimes=True)
    auto.router.plain_seen = 741
    assert not auto.router.stay_in_blocks(rag, 4, auto.tau_hat)  # 128 x 25 ms saved at best < 740 x 25 ms to feed B
    short = AcceptedSequence(torch.arange(30) % 10, 128)
    auto.router.plain_seen = 30
    assert auto.router.stay_in_blocks(short, 4, auto.tau_hat)  # 128 x 25 ms > 29 x 25 ms
    history.blocks_runtime.catch_up = RunningMean(30.0, 1000)  # once B's own feeds are measured, they decide
    assert auto.router.catch_up_s_per_token(True) == pytest.approx(0.03)


def spec_bench_history() -> History:
    """The 1.5B on 2026-11-25, 2 threads: llama.cpp (A) prefills 10.6 ms a prompt token and decodes 37 ms
    a token; the int8 runtime (B) is not measured yet."""
    history = History()
    history.verify.observe(Route.STEP, 1, 0.037)
    history.plain_runtime.decoding = RunningMean(3.7, 100)
    history.plain_runtime.catch_up = RunningMean(9.7, 918)
    return history


def test_with_two_runtimes_the_prompt_is_prefilled_where_prefill_and_answer_cost_least():
    """A's llama.cpp prefills a 900-token article 4 s slower than int8 (B), and B decodes lookup's blocks
    and stays at 43 ms a token: such a request starts in B; a 60-token question stays in A. While B is
    unmeasured, one request whose prefill in A costs more than its decoding there starts in B to measure it."""
    from specdec.core.session import AcceptedSequence

    history = spec_bench_history()
    article, question = AcceptedSequence(torch.arange(900), 128), AcceptedSequence(torch.arange(60), 128)
    assert auto_drafter(history, two_runtimes=True).propose(question, 4).drafter == PLAIN  # 0.6 s < 128 x 37 ms
    first_look = auto_drafter(history, two_runtimes=True).propose(article, 4)  # 9.5 s > 4.7 s: B is worth a look
    assert first_look.route is Route.STAY and len(first_look) == 0
    history.blocks_runtime.catch_up = RunningMean(5.6, 918)  # what that look measured
    history.blocks_prefilled = RunningMean(4.3, 100)
    assert auto_drafter(history, two_runtimes=True).propose(article, 4).drafter == STAY  # 5.5 + 5.5 s < 9.5 + 4.7 s
    assert auto_drafter(history, two_runtimes=True).propose(question, 4).drafter == PLAIN  # 0.4 + 5.5 s > 0.6 + 4.7 s
    looping = AcceptedSequence(torch.arange(900) % 300, 128)  # lookup finds a block: B verifies it with the prefill
    assert auto_drafter(history, two_runtimes=True).propose(looping, 4).drafter == "prompt-lookup"
    history.blocks_runtime.catch_up = RunningMean(9.7, 918)  # a B that prefills no faster than A: A
    assert auto_drafter(history, two_runtimes=True).propose(article, 4).drafter == PLAIN


def test_with_two_runtimes_the_answers_seen_so_far_say_how_much_decoding_a_switch_must_pay_for():
    """A 600-token question whose answers run ~20 tokens of a 128-token budget (RAG's do), B decoding at
    61 ms a token. Weighed against 128 tokens int8's prefill does not pay (3.7 + 7.8 s > 6.3 + 4.7 s);
    against the ~20 its earlier answers ran, it does (3.7 + 1.2 s < 6.3 + 0.7 s). Once in B, one slow
    stay (197 ms) must not send the request back to A's second prefill: 0.16 s x 19 tokens < 6.3 s,
    where the whole budget said 0.16 s x 127 > 6.3 s. The engine closes each request with its answer."""
    from specdec.core.session import AcceptedSequence

    history = spec_bench_history()
    history.blocks_runtime.catch_up = RunningMean(5.6, 918)
    history.blocks_prefilled = RunningMean(6.1, 100)
    rag = AcceptedSequence(torch.arange(600), 128)
    assert history.tokens_left(rag) == 128 and auto_drafter(history, two_runtimes=True).propose(rag, 4).drafter == PLAIN
    in_b = auto_drafter(history, two_runtimes=True)
    in_b.router.in_blocks, in_b.router.blocks_seen = True, 601
    history.blocks_runtime.decoding = RunningMean(0.197, 1)  # B's record so far: one slow stay
    rag.extend([7])
    assert not in_b.router.stay_in_blocks(rag, 0, in_b.tau_hat)  # no answer known yet: the budget's 127 tokens
    for answer in (18, 22):
        history.close_request(answer)
    auto = auto_drafter(history, two_runtimes=True)
    assert history.answers == RunningMean(40, 2) and history.tokens_left(AcceptedSequence(torch.arange(600), 128)) == 20
    assert history.tokens_left(AcceptedSequence(torch.arange(600), 12)) == 12 and history.tokens_left(rag) == 19
    assert auto.propose(AcceptedSequence(torch.arange(600), 128), 4).drafter == STAY
    assert in_b.router.stay_in_blocks(rag, 0, in_b.tau_hat)
    rag.extend(list(range(30)))
    assert history.tokens_left(rag) == 1  # past the mean answer: no switch pays any more


def test_a_prefill_or_a_catch_up_is_a_rate_per_token_not_a_blocks_cost():
    """The forward that fed a prompt with a block is kept as seconds per token fed, never as the cost of
    a block of its size: the nearest measured block size would otherwise be a 900-token feed."""
    from specdec.core.session import AcceptedSequence
    from specdec.core.verdict import Verdict

    history = History()
    auto = auto_drafter(history, two_runtimes=True, prompt_ids=range(900))
    seq = AcceptedSequence(torch.arange(900), 128)
    proposal = auto.propose(seq, 4)
    verdict = Verdict(0, 7, 900, False)
    verdict.sent_at, verdict.read_at = 0.0, 9.0
    seq.extend([7])
    auto.rollback(seq, proposal, verdict)
    assert (history.plain_runtime.catch_up == RunningMean(9.0, 900) and history.verify.nearest(Route.STEP, 1) is None
            and history.verify.nearest(Route.BLOCK, 5) is None)


@pytest.mark.parametrize("verifier", ["cached", "stateless"])
def test_a_request_prefilled_in_the_blocks_runtime_stays_lossless(pair, verifier):
    """B's prefill measured as far cheaper than A's: every request starts in B (its prompt fed with a stay
    or a lookup block) and the output is still the cloud's greedy."""
    from specdec.core.cloud import LocalCloud
    from specdec.core.two_runtime import TwoRuntimeCloud

    _, cloud = pair
    history = History()
    history.verify.observe(Route.STEP, 1, 0.01)
    history.plain_runtime.catch_up = RunningMean(1e6, 1000)  # weighty: the tiny pair's own feeds barely move them
    history.blocks_runtime.catch_up = RunningMean(1e-6, 1000)
    history.plain_runtime.decoding = RunningMean(10.0, 1000)
    history.blocks_runtime.decoding = RunningMean(10.0, 1000)
    history.blocks_prefilled = RunningMean(10.0, 1000)
    spec = SpecConfig(k=4, entropy_threshold=0, policy="greedy", verifier=verifier, drafter="auto")
    decode = DecodeConfig(max_new_tokens=24)
    verifying = TwoRuntimeCloud(LocalCloud(cloud), LocalCloud(cloud))
    firsts = set()
    for seed in range(4):
        prompt = looping_prompt(seed)
        generation = speculative_decode(None, verifying, prompt, spec, decode, SpecOptions(history=history))
        assert generation.tokens == autoregressive_decode(cloud, prompt, decode).tokens, seed
        firsts.add(generation.cycles[0].drafter)
    assert firsts and firsts <= {STAY, "prompt-lookup"}


class SlowForwards:
    """A backend whose forwards take `seconds` longer: a runtime slower than the block it was chosen for."""

    def __init__(self, backend, seconds: float) -> None:
        self.backend, self.seconds = backend, seconds

    def __getattr__(self, name):
        return getattr(self.backend, name)

    def prefill(self, *args, **kwargs):  # a stateless verifier's every call
        time.sleep(self.seconds)
        return self.backend.prefill(*args, **kwargs)

    def forward(self, state, token_ids, keep=None):
        time.sleep(self.seconds)
        return self.backend.forward(state, token_ids, keep)


@pytest.mark.parametrize("verifier", ["cached", "stateless"])
@pytest.mark.parametrize("two_runtimes", [False, True])
def test_auto_switching_between_blocks_and_plain_steps_mid_request_stays_lossless(pair, verifier, two_runtimes):
    """Blocks made to cost 1.5 plain steps: auto sends while lookup's tokens per verify beat that and
    withholds otherwise, both kinds of cycle in one request; the output is still the cloud's greedy. With
    the cloud held in two runtimes (here the same model twice, its blocks' copy 60 ms slower a forward, so
    that B's record sends a request back to A), each catches up on what the other decided."""
    from specdec.core.cloud import LocalCloud
    from specdec.core.two_runtime import TwoRuntimeCloud

    _, cloud = pair
    history = History()
    for _ in range(1000):  # weighty: the tiny pair's own timings (a few ms, block ~ step) barely move them
        history.verify.observe(Route.STEP, 1, 0.01)
        for n in range(2, 7):
            history.verify.observe(Route.BLOCK, n, 0.015)
    spec = SpecConfig(k=4, entropy_threshold=0, policy="greedy", verifier=verifier, drafter="auto")
    decode = DecodeConfig(max_new_tokens=40)
    verifying = TwoRuntimeCloud(LocalCloud(cloud), LocalCloud(SlowForwards(cloud, 0.06))) if two_runtimes else cloud
    kinds, switched = set(), False
    for seed in range(6):
        prompt = looping_prompt(seed)
        generation = speculative_decode(None, verifying, prompt, spec, decode, SpecOptions(history=history))
        assert generation.tokens == autoregressive_decode(cloud, prompt, decode).tokens, seed
        drafted = [c.drafter for c in generation.cycles]
        kinds |= set(drafted)
        if "prompt-lookup" in drafted and PLAIN in drafted[drafted.index("prompt-lookup") + 1:]:
            switched = True
    assert {"prompt-lookup", PLAIN} <= kinds <= {"prompt-lookup", PLAIN, STAY} and switched


def two_runtime_session(cloud, prompt):
    from specdec.core.cloud import LocalCloud
    from specdec.core.two_runtime import TwoRuntimeCloud

    spec, decode = SpecConfig(k=2, policy="greedy"), DecodeConfig(max_new_tokens=8)
    return TwoRuntimeCloud(LocalCloud(cloud), LocalCloud(cloud)).open(prompt, spec, decode, Constraints(), 96, torch.Generator())


def verify_in_turn(session, seq, turns) -> list:
    """Verify each (route, draft) in turn on a two-runtime session, accepting what each verdict says ->
    [(went to the plain runtime, verdict)]."""
    done = []
    for route, draft in turns:
        base = seq.length
        verdict = session.verify(seq, T(draft, dtype=torch.long), None, route)
        done.append((session.last is session.plain, verdict))
        seq.extend(draft[: verdict.accepted] + [verdict.next_token])
        session.rollback(base + verdict.accepted, seq)
    return done


def test_a_two_runtime_session_sends_plain_steps_to_one_and_blocks_to_the_other(pair):
    """Each runtime's cache catches up on the tokens the other decided, in one feed at its next call."""
    from specdec.core.session import AcceptedSequence

    _, cloud = pair
    prompt = looping_prompt(0)
    session = two_runtime_session(cloud, prompt)
    seq = AcceptedSequence(prompt.input_ids, 8)
    expected = autoregressive_decode(cloud, prompt, DecodeConfig(max_new_tokens=8)).tokens
    drafts = ([], [], [expected[2], expected[3]], [], [expected[5], 0])
    verdicts = verify_in_turn(session, seq, [(Route.BLOCK if d else Route.STEP, d) for d in drafts])
    fed = [(to_plain, verdict.tokens_in) for to_plain, verdict in verdicts]
    assert seq.generated == expected[: seq.length - seq.prompt_len]
    # plain: the prompt (13), then its token t0 (1); blocks: the prompt, t0, t1 + 2 drafted (17), keeps both
    # and adds t4; plain: t1..t4, which the blocks decided (4); blocks: t4 and the step's t5 + 2 drafted (4)
    assert fed == [(True, 13), (True, 1), (False, 13 + 2 + 2), (True, 4), (False, 2 + 2)]


def test_each_route_goes_to_its_runtime_and_a_stay_is_a_plain_step_in_the_blocks_runtime(pair):
    """The route, not the block's length, picks the runtime: a plain step (STEP) in the plain runtime, a
    block (BLOCK) and a plain step that stays (STAY) in the blocks' runtime. A proposal without a route,
    or a step that carries a draft, is refused."""
    from specdec.core.session import AcceptedSequence
    from specdec.errors import SpecdecError

    _, cloud = pair
    prompt = looping_prompt(0)
    session = two_runtime_session(cloud, prompt)
    seq = AcceptedSequence(prompt.input_ids, 8)
    expected = autoregressive_decode(cloud, prompt, DecodeConfig(max_new_tokens=8)).tokens
    turns = ((Route.STEP, []), (Route.BLOCK, [expected[1]]), (Route.STAY, []), (Route.STAY, []), (Route.STEP, []))
    verdicts = verify_in_turn(session, seq, turns)
    fed = [(route, not to_plain, verdict.tokens_in, verdict.accepted)
           for (route, _), (to_plain, verdict) in zip(turns, verdicts)]
    assert seq.generated == expected[: seq.length - seq.prompt_len]
    # plain: the prompt (13); blocks: the prompt, t0 + 1 drafted (15), keeps it and adds t2; stay: t2 alone
    # (1, no draft, no guess); stay: t3 (1); plain: t0..t4, its own step's token and what the blocks decided (5)
    assert fed == [(Route.STEP, False, 13, 0), (Route.BLOCK, True, 13 + 1 + 1, 1), (Route.STAY, True, 1, 0),
                   (Route.STAY, True, 1, 0), (Route.STEP, False, 5, 0)]
    with pytest.raises(SpecdecError, match="verifies a routed proposal"):
        session.verify(seq, T([], dtype=torch.long), None)
    with pytest.raises(SpecdecError, match="a stay step carries no draft, got 1 tokens"):
        session.verify(seq, T([expected[0]], dtype=torch.long), None, Route.STAY)


def test_a_cloud_held_in_two_runtimes_loads_both_and_decodes_in_each(tmp_path):
    """--cloud-runtime PLAIN+BLOCKS: the cloud model loaded in both runtimes (and no edge model), plain
    steps in the first, blocks in the second; only spec mode in process takes it."""
    from specdec import ConfigError
    from specdec.engine import Engine
    from tests.tiny import save_tiny_pair

    paths = save_tiny_pair(tmp_path)
    loaded = []

    def loader(name, settings, log=print):
        from specdec.models.loading import load
        loaded.append(settings.runtime)
        return load(name, settings, log)

    spec = SpecConfig(k=3, policy="greedy", drafter="auto")
    engine = Engine(mode="spec", edge=paths["edge"], cloud=paths["cloud"], dtype="float32", spec=spec,
                    cloud_runtime="torch+torch-int8", decode=DecodeConfig(max_new_tokens=12), loader=loader,
                    log=lambda m: None)
    # plain steps made to look dear: lookup's blocks go to int8 while they match
    engine.history().verify.observe(Route.STEP, 1, 1.0)
    generation = engine.generate("hello world , hello world , hello world ,")
    assert sorted(loaded) == ["torch", "torch-int8"] and generation.new_tokens == 12
    assert {c.drafter for c in generation.cycles} <= {"prompt-lookup", PLAIN} and generation.cycles[0].drafter == PLAIN
    with pytest.raises(ConfigError, match="holds the cloud in two runtimes, plain steps in llamacpp and spec "
                                          "blocks in torch-int8: only a spec run that loads the cloud here"):
        Engine(mode="cloud", cloud="c", cloud_runtime="llamacpp+torch-int8")
    with pytest.raises(ConfigError, match="with --cloud-url the server's model runs as that server was started"):
        Engine(mode="spec", edge="e", cloud_url="127.0.0.1:1", cloud_runtime="llamacpp+torch-int8")


def test_only_a_drafter_that_weighs_the_switches_runs_on_a_two_runtime_cloud(tmp_path):
    """Prompt lookup on llamacpp+torch-int8 would feed the whole prompt to each runtime: refused in a run,
    left out of a sweep's grid (whose plain decodings run in each runtime)."""
    from bench.measure.sweep.sweep_config import SweepConfig
    from specdec import ConfigError
    from specdec.engine import Engine

    with pytest.raises(ConfigError, match="needs a drafter that weighs switching between the two runtimes \\(auto\\); "
                                          "'prompt-lookup' would feed the whole prompt to each"):
        Engine(mode="spec", cloud="c", cloud_runtime="torch+torch-int8", spec=SpecConfig(drafter="prompt-lookup"))
    sweep = SweepConfig(edge="e", cloud="c", mode=("cloud", "spec"), drafter=("prompt-lookup", "auto"),
                        cloud_runtime=("torch+torch-int8",), prompts=("code",), dtype=("float32",))
    assert sorted((p.mode, p.cloud_runtime, p.drafter) for p in sweep.points()) == [
        ("cloud", "torch", None), ("cloud", "torch-int8", None), ("spec", "torch+torch-int8", "auto")]


def test_a_sweeps_grid_leaves_out_drafting_ahead_with_a_drafter_that_cannot():
    """--overlap true with prompt lookup is refused in a run (tests/test_drafters.py); a grid that crosses
    overlap with drafters keeps only the split points that can run."""
    from bench.measure.sweep.sweep_config import SweepConfig

    sweep = SweepConfig.from_mapping({"edge": "e", "cloud": "c", "mode": ("spec",), "deployment": ("split",),
                                      "split_cores": "shared", "overlap": (True, False), "drafter": ("model", "prompt-lookup")})
    assert sorted((p.deployment, p.drafter, str(p.overlap)) for p in sweep.points() if p.deployment == "split") == [
        ("split", "model", "False"), ("split", "model", "True"), ("split", "prompt-lookup", "False")]


def test_an_unmeasured_block_size_costs_what_the_nearest_measured_one_did():
    from specdec.core.history import VerifyCosts

    curve = VerifyCosts()
    assert curve.nearest(Route.BLOCK, 2) is None
    curve.observe(Route.BLOCK, 5, 0.04)
    curve.observe(Route.BLOCK, 3, 0.03)
    curve.observe(Route.BLOCK, 200, 2.0)  # a catch-up feed
    curve.observe(Route.STEP, 1, 0.01)
    assert (curve.nearest(Route.BLOCK, 2) == 0.03 and curve.nearest(Route.BLOCK, 4) == 0.03
            and curve.nearest(Route.BLOCK, 5) == 0.04)
    assert curve.nearest(Route.STEP, 2) == 0.01


def test_a_greedy_verify_reads_the_logits_alone_as_plain_greedy_decoding_does(pair, monkeypatch):
    """No softmax over the vocabulary per verify: `auto`'s plain steps cost what plain decoding's do.
    The threshold policy still gets its distribution."""
    _, cloud = pair
    prompt, decode = looping_prompt(0), DecodeConfig(max_new_tokens=16)
    expected = autoregressive_decode(cloud, prompt, decode).tokens
    calls = []
    real = cloud_module.distribution
    monkeypatch.setattr(cloud_module, "distribution", lambda *a: calls.append(1) or real(*a))
    for drafter in ("prompt-lookup", "auto"):
        generation = speculative_decode(None, cloud, prompt, SpecConfig(k=4, entropy_threshold=0, policy="greedy",
                                                                        drafter=drafter), decode)
        assert generation.tokens == expected, drafter
    assert calls == []
    speculative_decode(None, cloud, prompt, SpecConfig(k=4, entropy_threshold=0, policy="threshold", drafter="prompt-lookup"),
                       decode)
    assert calls


def test_auto_starts_from_the_calibrated_block_cost_until_it_has_measured_its_own():
    """Engine.assume_block_costs (the sweep: its calibration's curve for the cloud's runtime) seeds the ratio;
    a measured block and step replace it."""
    from specdec.core.session import AcceptedSequence

    def ratio(drafter, tokens_fed: int) -> float:  # t_block / t_plain as auto's rule reads it
        return block_steps(drafter.evidence(tokens_fed - 1))

    auto = auto_drafter(History())
    assert ratio(auto, 3) == 1.0  # no prior: a block is assumed to cost a step
    prior = {3: 2.5, 5: 3.4}
    seeded = auto_drafter(History(prior))
    assert ratio(seeded, 3) == 2.5 and ratio(seeded, 4) == 1.0
    seq = AcceptedSequence(T([1, 2, 3, 1, 2]), 16)
    assert len(seeded.propose(seq, 2)) == 0  # lookup proposes (3, 1), but tau 2 does not pay a 2.5-step block
    assert len(auto.propose(seq, 2)) == 2  # without the prior it is sent, to be measured
    seeded.history.verify.observe(Route.STEP, 1, 0.1)
    seeded.history.verify.observe(Route.BLOCK, 3, 0.15)
    assert ratio(seeded, 3) == pytest.approx(1.5)  # measured beats modelled


def test_an_engine_hands_its_assumed_block_costs_to_auto(tmp_path):
    """Greedy stays the cloud's own either way; a prohibitive assumed cost leaves every cycle a plain step."""
    from specdec.engine import Engine
    from tests.tiny import save_tiny_pair

    paths = save_tiny_pair(tmp_path)
    common = dict(mode="spec", edge=paths["edge"], cloud=paths["cloud"], dtype="float32", log=lambda m: None,
                  spec=SpecConfig(k=3, policy="greedy", drafter="auto"), decode=DecodeConfig(max_new_tokens=12))
    text = "hello world , hello world , hello world ,"
    free, priced = Engine(**common), Engine(**common)
    priced.assume_block_costs({n: 50.0 for n in range(1, 10)})
    priced.forget_history()  # an untimed warm-up's forgetting keeps what was assumed
    sent, held = free.generate(text), priced.generate(text)
    assert sent.tokens == held.tokens
    assert any(c.draft_tokens for c in sent.cycles) and not any(c.draft_tokens for c in held.cycles)


def test_a_head_vocabulary_on_an_edge_that_computes_its_whole_head_is_refused_when_the_engine_loads(tmp_path):
    """Refused once the edge is loaded, before a prompt is read: not at the first generation of a sweep."""
    from specdec.engine import Engine
    from tests.tiny import save_tiny_pair

    paths = save_tiny_pair(tmp_path)
    for drafter in ("model", "hybrid"):
        engine = Engine(mode="spec", edge=paths["edge"], cloud=paths["cloud"], dtype="float32",
                        spec=SpecConfig(k=3, drafter=drafter, drafter_options="head_vocab=32"))
        with pytest.raises(ConfigError, match=r"computes its whole output head: a drafter's head_vocab needs an edge "
                                              r"runtime that computes part of it"):
            engine.load()
    Engine(mode="spec", edge=paths["edge"], cloud=paths["cloud"], dtype="float32",
           spec=SpecConfig(k=3, drafter="model")).load()  # the whole head: loads
