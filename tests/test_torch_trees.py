"""Token trees verified in the torch backends (specdec/backends/hf_causal.py, static_cache.py, and the server's
shared static cache, static_slots.py): one forward with a 4-D mask, each node at its path's position seeing the cache
and its ancestors only. A node's row is the step after its path by the chain's rule there (fp32: within the chain's
1e-5; torch-int8t's row-wise attention: bit for bit), the kept path leaves the cache a chain's, and prompt lookup's
trees decode the cloud's own greedy tokens. A runtime whose attention builds its own mask (sliding windows, flash
kernels) says it verifies chains. The CUDA half (captured trees) is tests/test_cuda.py."""
from __future__ import annotations

import pytest
import torch

from specdec.backends.hf_causal import HFCausalBackend, tree_positions, tree_visible
from specdec.backends.prompt import Prompt
from specdec.backends.static_cache import StaticCausalBackend
from specdec.backends.static_slots import SlotCausalBackend
from specdec.core.tree import TokenTree
from specdec.errors import InputError
from tests.tiny import random_prompt, tiny_causal

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

TOLERANCE = 1e-5  # fp32, of the largest logit: the chain's (tests/test_incremental.py)
QUIET = dict(log=lambda message: None)
BRANCHES = [[11, 12, 13, 14], [11, 15], [16, 17, 18], [11, 12, 19]]  # nodes 11 12 13 14 15 16 17 18 19


def backends(arch: str):
    """(a backend of each torch cache over one tiny model, a twin to take the reference steps on: a static cache
    holds one sequence; the server's holds several, each session in a slot of its own)."""
    model = tiny_causal(arch)
    return [(HFCausalBackend(model), HFCausalBackend(model)),
            (StaticCausalBackend(model, steps="static", capacity=16), StaticCausalBackend(model, steps="static", capacity=16)),
            (SlotCausalBackend(model, steps="static", slots=4, capacity=64), SlotCausalBackend(model, steps="static", slots=4))]


def step_after(backend, ids: torch.Tensor, path: torch.Tensor) -> torch.Tensor:
    """The logits of the step that follows `ids` then `path` (a fresh state): what a node's row must equal."""
    state, logits = backend.prefill(Prompt(ids), ids, keep=1)
    for token in path.tolist():
        logits = backend.forward(state, torch.tensor([token]), keep=1)
    return logits[-1]


def close(got: torch.Tensor, want: torch.Tensor) -> bool:
    return bool((got - want).abs().max() <= TOLERANCE * want.abs().max()) and int(got.argmax()) == int(want.argmax())


def test_a_trees_positions_and_mask_are_its_paths():
    tree = TokenTree.from_branches([[5, 6], [7]], budget=3)  # nodes 5 6 7, parents -1 0 -1
    assert tree.ancestry.int().tolist() == [[1, 0, 0], [1, 1, 0], [0, 0, 1]]
    assert tree_positions(4, 2, tree).tolist() == [[4, 5, 6, 7, 6]]  # the root (the last unseen) at 5
    visible = tree_visible(4, 2, tree, 10).int()
    assert visible.tolist() == [[1, 1, 1, 1, 1, 0, 0, 0, 0, 0],  # unseen 1: the cache and itself
                                [1, 1, 1, 1, 1, 1, 0, 0, 0, 0],  # unseen 2
                                [1, 1, 1, 1, 1, 1, 1, 0, 0, 0],  # node 5: the unseen tokens and itself
                                [1, 1, 1, 1, 1, 1, 1, 1, 0, 0],  # node 6: its parent 5 and itself
                                [1, 1, 1, 1, 1, 1, 0, 0, 1, 0]]  # node 7: not 5 nor 6, a sibling branch


def test_the_static_caches_mask_made_on_the_device_is_the_trees(monkeypatch):
    """tree_forward makes a tree's slots and mask from its first position and its rows' own block: the same mask as
    tree_visible over the whole cache, wherever the cache's length is."""
    from specdec.backends import static_cache
    from specdec.backends.hf_util import cache_kwarg

    tree = TokenTree.from_branches(BRANCHES, budget=9)
    model = tiny_causal("qwen2")
    kv = static_cache.StaticKV(model.config, 32, torch.float32, torch.device("cpu"))
    seen = {}
    real = static_cache.static_forward
    monkeypatch.setattr(static_cache, "static_forward", lambda *args: seen.update(args=args) or real(*args))
    for past, unseen in ((0, 1), (7, 1), (12, 3), (32 - 12, 3)):
        rows = unseen + tree.size
        static_cache.tree_forward(model, cache_kwarg(model.forward), kv, torch.zeros(1, rows, dtype=torch.long),
                                  tree_positions(past, unseen, tree), tree_visible(0, unseen, tree, rows))
        slots, mask = seen["args"][-2:]
        assert slots.tolist() == list(range(past, past + rows))
        assert torch.equal(mask[0, 0] == 0, tree_visible(past, unseen, tree, 32)), (past, unseen)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_every_nodes_row_is_the_step_after_its_path_on_both_caches(arch):
    ids = random_prompt(7, 20)
    tree = TokenTree.from_branches(BRANCHES, budget=9)
    for backend, twin in backends(arch):
        assert backend.accepts_trees
        for cached in (12, 19):  # 8 tokens unseen (past the static cache's first 16 slots), then 1
            state, _ = backend.prefill(Prompt(ids[:cached]), ids[:cached])
            logits = backend.forward_tree(state, ids[cached:], tree)
            assert logits.shape[0] == 1 + tree.size and state.length == ids.numel()
            assert close(logits[0], step_after(twin, ids[:-1], ids[-1:]))
            for node in range(tree.size):
                assert close(logits[1 + node], step_after(twin, ids, tree.tokens[tree.path(node)])), (type(backend), node)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_a_committed_path_leaves_the_cache_a_chain_would(arch):
    """Any path (the last node or not, a side branch, the empty one): the next block's logits are a chain's, and a
    crop after it rolls back as ever."""
    ids = random_prompt(3, 15)
    tree = TokenTree.from_branches([[21, 22, 23], [21, 24], [25, 26]], budget=7)
    after = torch.tensor([30, 31, 32])
    for backend, twin in backends(arch):
        for path in ([0, 1, 2], [0, 3], [4, 5], [4], []):
            state, _ = backend.prefill(Prompt(ids[:14]), ids[:14])
            backend.forward_tree(state, ids[14:], tree)
            backend.commit_path(state, tree, path)
            assert state.length == 15 + len(path)
            got = backend.forward(state, after)
            chain, _ = twin.prefill(Prompt(ids), ids)
            if path:
                twin.forward(chain, tree.tokens[path])
            assert all(close(g, w) for g, w in zip(got, twin.forward(chain, after))), (type(backend), path)
            backend.crop(state, 15)
            twin.crop(chain, 15)
            assert all(close(g, w) for g, w in zip(backend.forward(state, after), twin.forward(chain, after)))


def test_under_torch_int8t_a_nodes_row_is_its_step_bit_for_bit(pair):
    """Row-wise attention reads each query's keys off the tree's mask, in slot order: a node's are its path's, in
    position order, as its step's. With per-token int8 Linears the row is then the step's bits, the path committed
    too."""
    from specdec.models.loading import load_model

    backend = load_model(f"{pair['cloud']}@int8t", "float32", **QUIET).backend
    assert backend.accepts_trees and backend.model.config._attn_implementation == "specbench_rowwise"
    ids = torch.randint(0, 60, (14,), generator=torch.Generator().manual_seed(2))
    tree = TokenTree.from_branches([[40, 41, 42], [40, 43], [44, 45]], budget=6)
    with torch.inference_mode():
        state, _ = backend.prefill(Prompt(ids[:10]), ids[:10])
        logits = backend.forward_tree(state, ids[10:], tree)
        for node in range(tree.size):
            assert torch.equal(logits[1 + node], step_after(backend, ids, tree.tokens[tree.path(node)])), node
        backend.commit_path(state, tree, [0, 3])  # 40 43
        chain, _ = backend.prefill(Prompt(ids), ids)
        backend.forward(chain, tree.tokens[[0, 3]])
        assert torch.equal(backend.forward(state, torch.tensor([7, 8])), backend.forward(chain, torch.tensor([7, 8])))


def test_attention_with_masks_of_its_own_verifies_chains():
    model = tiny_causal("gemma3")  # sliding windows
    assert not HFCausalBackend(model).accepts_trees
    flash = tiny_causal("qwen2")
    flash.config._attn_implementation = "flash_attention_2"  # reads no custom mask
    assert not HFCausalBackend(flash).accepts_trees
    with pytest.raises(NotImplementedError, match="accepts_trees is False"):
        HFCausalBackend(flash).forward_tree(None, torch.tensor([1]), TokenTree.chain(torch.tensor([2])))
    backend = HFCausalBackend(tiny_causal("qwen2"))
    state, _ = backend.prefill(Prompt(torch.tensor([1, 2])), torch.tensor([1, 2]))
    with pytest.raises(InputError, match="at least one token"):
        backend.forward_tree(state, torch.tensor([], dtype=torch.long), TokenTree.chain(torch.tensor([2])))
    with pytest.raises(ValueError, match="follows forward_tree"):
        backend.commit_path(state, TokenTree.chain(torch.tensor([2])), [0])


@pytest.mark.parametrize("kv_cache", ["dynamic", "static"])
def test_prompt_lookup_trees_on_a_torch_cloud_are_its_own_greedy_decoding(kv_cache):
    """Lossless: trees, chains and plain decoding give the same tokens, and trees verify no more often."""
    from specdec.core.config import DecodeConfig, SpecConfig
    from specdec.core.decode import autoregressive_decode, speculative_decode

    model = tiny_causal("qwen2")
    backend = HFCausalBackend(model) if kv_cache == "dynamic" else StaticCausalBackend(model, steps="static")
    verifies = {}
    for branches in (1, 4):
        verifies[branches] = 0
        spec = SpecConfig(k=4, entropy_threshold=0, policy="greedy", drafter="prompt-lookup",
                          drafter_options=f"branches={branches}")
        for seed in range(4):
            base = random_prompt(seed, 12)
            ids = torch.cat([base, base[2:8], base[4:10], base[:3]])  # recurring spans: several matches
            decode = DecodeConfig(max_new_tokens=24)
            plain = autoregressive_decode(backend, Prompt(ids), decode).tokens
            generation = speculative_decode(None, backend, Prompt(ids), spec, decode)
            assert generation.tokens == plain, (branches, seed)
            verifies[branches] += sum(c.escalated for c in generation.cycles)
    assert verifies[4] <= verifies[1], verifies
