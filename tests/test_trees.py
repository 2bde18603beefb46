"""Token trees (specdec/core/tree.py): the tree's shape and greedy walk, and verification in one block where a runtime
accepts trees (the kernels): each node's row is the step that follows its path bit for bit, and the accepted path's
cache is a chain's."""
from __future__ import annotations

import pytest
import torch

from specdec.backends.prompt import Prompt
from specdec.core.tree import TokenTree, greedy_path
from specdec.errors import InputError
from tests.tiny import random_prompt, tiny_causal

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def test_branches_merge_into_a_trie_within_the_budget():
    tree = TokenTree.from_branches([[5, 6, 7], [5, 9], [8, 1, 2]], budget=6)
    assert tree.tokens.tolist() == [5, 6, 7, 9, 8, 1] and tree.parents == (-1, 0, 1, 0, -1, 4)
    assert tree.depths == (1, 2, 3, 2, 1, 2) and tree.depth == 3 and not tree.is_chain
    assert tree.leaf_paths() == [[0, 1, 2], [0, 3], [4, 5]] and tree.children(-1) == [0, 4]
    assert tree.prefixes([3]) == [[3], [3, 5], [3, 5, 6], [3, 5, 6, 7], [3, 5, 9], [3, 8], [3, 8, 1]]
    assert TokenTree.from_branches([[5, 6, 7], [5, 6, 7]], budget=9).is_chain  # a repeat adds nothing
    assert TokenTree.from_branches([[5, 6, 7], [4]], budget=2).tokens.tolist() == [5, 6]  # the first branch first
    assert TokenTree.from_branches([], budget=4).size == 0


def test_a_malformed_tree_is_refused_in_one_line():
    for tokens, parents in (([1, 2], (-1,)), ([1, 2], (-1, 1)), ([1, 2], (0, -1)), ([1, 1], (-1, -1))):
        with pytest.raises(InputError) as error:
            TokenTree(torch.tensor(tokens), parents)
        assert "\n" not in str(error.value)


def test_the_greedy_walk_keeps_the_clouds_own_tokens_and_ends_with_its_next():
    tree = TokenTree.from_branches([[5, 6, 7], [5, 9], [8]], budget=5)  # nodes 5 6 7 9 8
    vocab = 10

    def rows(argmax: list[int]) -> torch.Tensor:  # row 0 the root's, 1 + i node i's
        return torch.nn.functional.one_hot(torch.tensor(argmax), vocab).float()

    # the cloud says 5, then 9 (the second branch), then 4 after it: 9 is a leaf, 4 the bonus
    path, token = greedy_path(tree, rows([5, 9, 0, 0, 4, 0]))
    assert (path, token) == ([0, 3], 4) and tree.ends_at(path)
    # 5, then 3: no child of node 0 holds 3, so 3 corrects
    path, token = greedy_path(tree, rows([5, 3, 0, 0, 0, 0]))
    assert (path, token) == ([0], 3) and not tree.ends_at(path)
    assert greedy_path(tree, rows([2, 0, 0, 0, 0, 0])) == ([], 2)  # no root child: a plain step's token


@pytest.fixture(scope="module")
def backends():
    from specdec.backends.packed import PackedBackend

    return {(arch, weights): PackedBackend.from_model(tiny_causal(arch), weights)
            for arch in ("llama", "qwen2") for weights in ("int8", "int4")}


def steps_along(backend, ids: torch.Tensor, tokens: list[int]) -> torch.Tensor:
    """The logits a chain of steps gives after `ids` then each of `tokens` (a fresh state): [1 + len, V]."""
    state, logits = backend.prefill(Prompt(ids), ids, keep=1)
    rows = [logits]
    for token in tokens:
        rows.append(backend.forward(state, torch.tensor([token]), keep=1))
    return torch.cat(rows)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("weights", ["int8", "int4"])
def test_every_nodes_row_is_the_step_after_its_path_bit_for_bit(backends, arch, weights):
    backend = backends[arch, weights]
    ids = random_prompt(7, 20)
    tree = TokenTree.from_branches([[11, 12, 13, 14], [11, 15], [16, 17, 18], [11, 12, 19]], budget=9)
    for cached in (12, 19):  # r = 8 tokens unseen, then r = 1 (the last accepted alone)
        state, _ = backend.prefill(Prompt(ids[:cached]), ids[:cached])
        logits = backend.forward_tree(state, ids[cached:], tree)
        assert logits.shape[0] == 1 + tree.size and state.length == ids.numel()
        for node in range(tree.size):
            path_tokens = tree.tokens[tree.path(node)].tolist()
            steps = steps_along(backend, ids, path_tokens)
            assert torch.equal(logits[1 + node], steps[-1]), node
        assert torch.equal(logits[0], steps_along(backend, ids, [])[0])


@pytest.mark.parametrize("weights", ["int8", "int4"])
def test_a_committed_path_leaves_the_cache_a_chain_would(backends, weights):
    """Any path, the last written or not, and the empty one: the cache then holds what feeding the path as a block
    would, and the next blocks give the chain's logits; a crop after it rolls back as ever."""
    backend = backends["qwen2", weights]
    ids = random_prompt(3, 15)
    tree = TokenTree.from_branches([[21, 22, 23], [21, 24], [25, 26]], budget=7)
    for path in ([0, 1, 2], [0, 3], [4, 5], [4], []):
        state, _ = backend.prefill(Prompt(ids[:14]), ids[:14])
        backend.forward_tree(state, ids[14:], tree)
        backend.commit_path(state, tree, path)
        chain, _ = backend.prefill(Prompt(ids), ids)
        tokens = tree.tokens[path]
        if path:
            backend.forward(chain, tokens)
        assert state.length == chain.length == 15 + len(path)
        assert torch.equal(state.kv[:, :, : state.length], chain.kv[:, :, : chain.length]), path
        after = torch.tensor([30, 31, 32])
        assert torch.equal(backend.forward(state, after), backend.forward(chain, after)), path
        backend.crop(state, 15)
        backend.crop(chain, 15)
        assert torch.equal(backend.forward(state, after), backend.forward(chain, after)), path


def test_a_runtime_without_trees_says_so():
    from specdec.backends.base import Backend

    assert not Backend.accepts_trees
    with pytest.raises(NotImplementedError, match="accepts_trees is False"):
        Backend().forward_tree(None, torch.tensor([1]), TokenTree.chain(torch.tensor([2])))


# --- in the engine ------------------------------------------------------------------------------
def test_prompt_lookups_branches_hold_its_chain_first():
    from specdec.core.drafters.prompt_lookup import continuations, lookup

    ids = torch.tensor([1, 2, 3, 9, 1, 2, 4, 5, 7, 2, 6, 1, 2])
    branches = continuations(ids, 3, branches=4)
    assert branches[0] == lookup(ids, 3).tolist() == [4, 5, 7]  # "1 2": its newest earlier occurrence first
    assert branches == [[4, 5, 7], [3, 9, 1], [6, 1, 2]]  # then the older "1 2", then "2" alone (its newest first)
    assert continuations(ids, 3, branches=1) == [[4, 5, 7]] and continuations(ids[:3], 2, branches=3) == []


def spec(branches: int, **fields):
    from specdec.core.config import SpecConfig

    return SpecConfig(**{"k": 4, "entropy_threshold": 0, "policy": "greedy", "drafter": "prompt-lookup",
                         "drafter_options": f"branches={branches}", **fields})


@pytest.mark.parametrize("weights", ["int8", "int4"])
def test_a_trees_verdict_keeps_the_clouds_own_tokens_from_any_branch(backends, weights):
    """The cloud's own greedy continuation as the tree's second branch: the verdict keeps it whole, the cache
    then holds it, and the next chain's verdict is the plain decoding's."""
    from specdec.core.cloud import LocalCloud
    from specdec.core.config import DecodeConfig
    from specdec.core.decode import autoregressive_decode
    from specdec.core.session import AcceptedSequence
    from specdec.core.verdict import Verdict

    backend = backends["llama", weights]
    ids = random_prompt(5, 16)
    own = autoregressive_decode(backend, Prompt(ids), DecodeConfig(max_new_tokens=7)).tokens
    wrong = [(t + 1) % backend.vocab_size for t in own]
    tree = TokenTree.from_branches([own[:1] + wrong[1:4], own[:3], wrong[:2]], budget=8)
    session = LocalCloud(backend).open(Prompt(ids), spec(3), DecodeConfig(max_new_tokens=7), constraints(),
                                       backend.vocab_size, torch.Generator())
    seq = AcceptedSequence(ids, 7)
    verdict = session.verify_tree(seq, tree)
    assert isinstance(verdict, Verdict) and verdict.accepted == 3 and verdict.next_token == own[3]
    assert tree.tokens[list(verdict.path)].tolist() == own[:3] and tree.ends_at(verdict.path)
    seq.extend(own[:4])
    session.rollback(ids.numel() + 3, seq)
    chain = session.verify(seq, torch.tensor(own[4:6]), None)
    assert (chain.accepted, chain.next_token) == (2, own[6])


def constraints():
    from specdec.core.processors import Constraints

    return Constraints()


@pytest.mark.parametrize("weights", ["int8", "int4"])
def test_prompt_lookup_trees_are_the_clouds_own_greedy_decoding(backends, weights):
    """Lossless: the text of trees equals chains' and plain decoding's, token for token, and trees verify fewer
    times for it (they hold the chain, so they keep at least its tokens a verify)."""
    from specdec.core.config import DecodeConfig
    from specdec.core.decode import autoregressive_decode, speculative_decode

    backend = backends["qwen2", weights]
    calls = {}
    for branches in (1, 4):
        calls[branches] = 0
        for seed in range(4):
            base = random_prompt(seed, 12)
            ids = torch.cat([base, base[2:8], base[4:10], base[:3]])  # recurring spans: several matches
            decode = DecodeConfig(max_new_tokens=24)
            plain = autoregressive_decode(backend, Prompt(ids), decode).tokens
            generation = speculative_decode(None, backend, Prompt(ids), spec(branches), decode)
            assert generation.tokens == plain, (branches, seed)
            calls[branches] += sum(c.escalated for c in generation.cycles)
            if branches > 1:
                assert all(c.accepted <= len(c.draft_tokens) for c in generation.cycles)
    assert calls[4] <= calls[1], calls


def test_a_tree_to_a_cloud_that_verifies_chains_or_under_another_policy_is_refused(backends):
    from specdec.core.config import DecodeConfig
    from specdec.core.decode import speculative_decode
    from specdec.errors import ConfigError

    class ChainsOnly:  # a cloud whose runtime verifies chains
        def __init__(self, backend):
            self.backend = backend

        def __getattr__(self, name):
            return getattr(self.backend, name)

        accepts_trees = False

    backend = backends["llama", "int8"]
    ids = random_prompt(1, 12)
    for cloud, settings, decode, word in (
            (ChainsOnly(backend), spec(2), DecodeConfig(), "branches=1"),
            (backend, spec(2, policy="threshold"), DecodeConfig(), "--policy greedy"),
            (backend, spec(2, policy="sample"), DecodeConfig(temperature=1.0), "--policy greedy"),
            (backend, spec(2, verifier="stateless"), DecodeConfig(), "--verifier cached")):
        with pytest.raises(ConfigError) as error:
            speculative_decode(None, cloud, Prompt(ids), settings, decode)
        assert word in str(error.value) and "\n" not in str(error.value)


# --- in a sweep ----------------------------------------------------------------------------------
def test_drafter_options_are_an_axis_paired_with_their_drafter_by_rows(tmp_path):
    from bench.measure.sweep.sweep_config import SweepConfig

    config = tmp_path / "sweep.toml"
    config.write_text('edge = "e"\ncloud = "c"\nmode = ["spec"]\npolicy = ["greedy"]\nk = [4]\n'
                      '[[rows]]\ndrafter = ["prompt-lookup"]\ndrafter_options = ["", "branches=4", "branches=4,tree_nodes=6"]\n')
    points = SweepConfig.from_toml(config).points()
    assert [(p.drafter, p.drafter_options) for p in points] == [
        ("model", ""), ("prompt-lookup", ""), ("prompt-lookup", "branches=4"), ("prompt-lookup", "branches=4,tree_nodes=6")]
    assert len({p.key() for p in points}) == 4


@pytest.mark.subprocess
def test_a_sweep_over_tree_shapes_decodes_alike_verified_in_the_kernels(pair, prompts, tmp_path):
    """Chains and trees of prompt lookup, interleaved in one sweep on the kernels runtime: every text the cloud's
    own (greedy), and the rows say which shape each point ran."""
    import pandas as pd

    from bench.cli import main
    from bench.core.records import ResultsFile

    config = tmp_path / "sweep.toml"
    config.write_text(f'edge = "{pair["edge"]}"\ncloud = "{pair["cloud"]}"\nmode = ["cloud", "spec"]\n'
                      'cloud_runtime = ["kernels-int8"]\nedge_runtime = ["kernels-int8"]\npolicy = ["greedy"]\n'
                      'entropy_threshold = [0.0]\nk = [3]\ndrafter = ["prompt-lookup"]\n'
                      'drafter_options = ["", "branches=3"]\ndtype = ["float32"]\nmax_new_tokens = 12\n'
                      f'prompts = ["{prompts}"]\n')
    out = tmp_path / "trees"
    assert main(["sweep", "--config", str(config), "--out", str(out)]) == 0
    rows = ResultsFile(out / "results.jsonl").read()
    assert all(r["status"] == "ok" for r in rows), [r.get("error") for r in rows]
    spec = {(r["drafter_options"], r["id"]): r["tokens"] for r in rows if r["mode"] == "spec"}
    cloud = {r["id"]: r["tokens"] for r in rows if r["mode"] == "cloud"}
    assert {options for options, _ in spec} == {"", "branches=3"}
    for (options, prompt), tokens in spec.items():
        assert tokens == cloud[prompt], (options, prompt)
    summary = pd.read_csv(out / "summary.csv", keep_default_na=False)
    assert set(summary.loc[summary["mode"] == "spec", "drafter_options"]) == {"", "branches=3"}


def test_the_shipped_tree_sweep_times_each_shape_beside_the_fastest_plain_decoding():
    from bench.measure.sweep.sweep_config import CONFIGS_DIR, SweepConfig

    points = SweepConfig.from_toml(CONFIGS_DIR / "trees.toml").points()
    assert [(p.mode, p.cloud_runtime, p.drafter_options) for p in points] == [
        ("cloud", "kernels-int4", None), ("cloud", "llamacpp", None), ("spec", "kernels-int4", ""),
        ("spec", "kernels-int4", "branches=4,tree_nodes=6"), ("spec", "kernels-int4", "branches=4")]


def test_the_ngram_caches_tree_grows_best_first_by_path_frequency():
    from specdec.core.drafters.ngram import NgramTable

    table = NgramTable(max_ngram=1)
    # after 1: 2 three times, 3 once; after 2: 4 twice, 5 once; after 3: 6; after 4: 7
    table.add([1, 2, 4, 7, 1, 2, 4, 1, 2, 5, 1, 3, 6])
    assert table.candidates([1], 1, 3) == [(2, 0.75), (3, 0.25)]
    tree = table.tree([1], depth=3, nodes=5, min_count=1)
    # scores: 2 .75, 2-4 .5, then four at .25 in the order they were found: 3, 2-5, 2-4-7, 2-4-1
    assert tree.tokens.tolist() == [2, 4, 3, 5, 7] and tree.parents == (-1, 0, -1, 0, 1)
    assert table.tree([1], depth=3, nodes=2, min_count=1).tokens.tolist() == [2, 4]  # the budget, best first
    assert table.tree([1], depth=1, nodes=5, min_count=1).tokens.tolist() == [2, 3]  # k deep at most
    assert table.tree([1], depth=3, nodes=5, min_count=2).tokens.tolist() == [2, 4]  # seen twice: 2, then 4
    assert table.tree([9], depth=3, nodes=5, min_count=1).size == 0


@pytest.mark.parametrize("weights", ["int8", "int4"])
def test_ngram_trees_are_the_clouds_own_greedy_decoding(backends, weights):
    from specdec.core.config import DecodeConfig, SpecConfig
    from specdec.core.decode import SpecOptions, autoregressive_decode, speculative_decode
    from specdec.core.history import History

    backend = backends["llama", weights]
    history = History()  # the counts carry across the generations, as in one engine
    trees = 0
    for seed in range(4):
        base = random_prompt(seed, 10)
        ids = torch.cat([base, base[1:7], base[3:9]])
        decode = DecodeConfig(max_new_tokens=20)
        plain = autoregressive_decode(backend, Prompt(ids), decode).tokens
        settings = SpecConfig(k=4, entropy_threshold=0, policy="greedy", drafter="ngram", drafter_options="tree_nodes=6")
        generation = speculative_decode(None, backend, Prompt(ids), settings, decode, SpecOptions(history=history))
        assert generation.tokens == plain, seed
        trees += sum(len(c.draft_tokens) > c.accepted + 1 for c in generation.cycles)
    assert trees  # some blocks were trees with a branch left unkept


def test_the_report_tells_tree_shapes_apart():
    """The Spec-Bench table's method and the fronts' labels name a drafter's own settings where they vary."""
    import pandas as pd

    from bench.derive.spec_bench import method_name
    from bench.read.report.pareto import point_labels

    point = {"mode": "spec", "drafter": "prompt-lookup", "edge_runtime": "-", "cloud_runtime": "kernels-int4",
             "deployment": "inproc", "entropy_threshold": 0.0, "k": 4, "policy": "greedy"}
    assert method_name({**point, "drafter_options": ""}) == "prompt-lookup k=4 greedy · → kernels-int4"
    assert method_name({**point, "drafter_options": "branches=4"}) == "prompt-lookup[branches=4] k=4 greedy · → kernels-int4"
    rows = [{**point, "dtype": "float32", "accept_threshold": 0.1, "verifier": "cached", "drafter_options": options,
             "kv_cache": "auto", "link": "-", "overlap": "-"} for options in ("", "branches=4", "branches=4,tree_nodes=6")]
    labels = point_labels(pd.DataFrame(rows)).tolist()
    assert len(set(labels)) == 3 and "branches=4,tree_nodes=6" in labels[2] and "default options" in labels[0]
