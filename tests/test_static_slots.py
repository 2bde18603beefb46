"""The server's static KV cache of many sequences (specdec/backends/static_slots.py) computes what transformers'
DynamicCache does, row for row: sessions of different lengths in one forward, each at its own positions, with
blocks of different lengths (padded), crops, one session's token tree beside the others' rows, a session's slot freed
when its state goes and taken by the next, and the server on it = the server on the dynamic cache, token for token
(fp32, tiny Llama and Qwen2)."""
import gc

import pytest
import torch

from bench.cli import main
from bench.derive.fleet_summary import read_fleet
from specdec.backends.hf_causal import HFCausalBackend
from specdec.backends.prompt import Prompt
from specdec.backends.static_slots import SlotCausalBackend, server_cache
from specdec.core.tree import TokenTree
from specdec.errors import ModelError, SpecdecError
from specdec.models.loading import LoadSettings, load, load_model
from specdec.remote.background import BackgroundServer
from specdec.remote.server_config import ServeConfig
from tests.recording import record_split
from tests.test_static_cache import TOLERANCE
from tests.tiny import random_prompt, tiny_causal


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and bool((a - b).abs().max() <= TOLERANCE * a.abs().max())


def sessions(backend, prompts: list[torch.Tensor]):
    """Each prompt prefilled alone (its last logits), as the server's first verify of a session is."""
    return [backend.prefill(Prompt(p), p, keep=1) for p in prompts]


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_rows_at_their_own_positions_equal_their_own_dynamic_forwards(arch):
    model = tiny_causal(arch)
    rows_walk(HFCausalBackend(model), SlotCausalBackend(model, steps="static", slots=4, capacity=64))


def rows_walk(dynamic, slots) -> None:
    """Three sessions of different lengths through shared forwards, crops and a lone step: every row's logits on
    `slots` equal its logits on `dynamic` (tests/test_cuda.py walks it on a GPU, captured too)."""
    ids = random_prompt(5, 90)
    prompts = [ids[:5], ids[10:23], ids[30:39]]
    expected, got = sessions(dynamic, prompts), sessions(slots, prompts)
    assert all(close(e[1], g[1]) for e, g in zip(expected, got))
    plan = [  # per forward: each session's block (start, end in ids) or None (not in this forward)
        [(50, 55), (55, 56), (56, 61)],  # a k+1 verify beside a step beside another verify
        [(61, 63), None, (63, 64)],
        [None, (64, 68), (68, 70)],
    ]
    crops = {1: [(0, 6), (2, 10)]}  # after forward 1: session 0 back to 6 positions, session 2 to 10
    for step, blocks in enumerate(plan):
        chosen = [i for i, block in enumerate(blocks) if block is not None]
        feed = [ids[slice(*blocks[i])] for i in chosen]
        keeps = [t.numel() for t in feed]
        want = dynamic.forward_batch([expected[i][0] for i in chosen], feed, keeps)
        have = slots.forward_batch([got[i][0] for i in chosen], feed, keeps)
        assert all(close(w, h) for w, h in zip(want, have)), f"forward {step}"
        for i, length in crops.get(step, []):
            dynamic.crop(expected[i][0], length)
            slots.crop(got[i][0], length)
    assert [s.length for s, _ in got] == [s.length for s, _ in expected]
    one = slots.forward(got[1][0], ids[80:81])  # alone again, after the others moved on
    assert close(dynamic.forward(expected[1][0], ids[80:81]), one)


def test_a_dropped_state_frees_its_slot_and_a_full_cache_is_one_line():
    backend = SlotCausalBackend(tiny_causal("qwen2"), steps="static", slots=2, capacity=32)
    ids = random_prompt(2, 20)
    first, _ = backend.prefill(Prompt(ids[:4]), ids[:4], keep=1)
    second, _ = backend.prefill(Prompt(ids[4:8]), ids[4:8], keep=1)
    with pytest.raises(SpecdecError, match=r"holds 2 sessions, all open: close one, or start the server with a higher "
                                           r"--max-sessions$"):
        backend.prefill(Prompt(ids[:3]), ids[:3], keep=1)
    slot = first.slot
    del first
    gc.collect()
    third, logits = backend.prefill(Prompt(ids[8:12]), ids[8:12], keep=1)
    assert third.slot == slot and second.length == 4
    fresh = SlotCausalBackend(backend.model, steps="static", slots=1, capacity=32)
    assert close(fresh.prefill(Prompt(ids[8:12]), ids[8:12], keep=1)[1], logits)  # nothing of the first lingers
    with pytest.raises(SpecdecError, match=r"needs 33 positions; the static KV cache holds 32: open shorter sessions"):
        backend.forward(third, random_prompt(3, 29))


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_a_sessions_tree_leaves_the_other_sessions_rows_as_they_were(arch):
    """One session verifies a token tree and keeps a side branch while two others go on in shared forwards, before
    and after it: every row of every session equals its own on the dynamic cache, and the tree's nodes were written in
    its own slot only: the others hold more columns than the tree wrote, so a node written in their slots would be read
    (the rows' and nodes' values themselves: tests/test_torch_trees.py)."""
    model = tiny_causal(arch)
    dynamic, slots = HFCausalBackend(model), SlotCausalBackend(model, steps="static", slots=4, capacity=64)
    ids = random_prompt(6, 80)
    prompts = [ids[:20], ids[20:24], ids[25:47]]
    expected, got = sessions(dynamic, prompts), sessions(slots, prompts)
    tree = TokenTree.from_branches([[40, 41, 42], [40, 43], [44, 45, 46]], budget=8)
    path = [4, 5]  # 44 45: the branch written last is kept, its columns moved down
    for backend, states in ((dynamic, expected), (slots, got)):
        backend.forward_batch([states[0][0], states[2][0]], [ids[50:53], ids[53:54]], [3, 1])
        backend.forward_tree(states[1][0], ids[55:57], tree)  # columns 4 .. 13 of its slot
        backend.commit_path(states[1][0], tree, path)
    assert [s.length for s, _ in got] == [s.length for s, _ in expected] == [23, 4 + 2 + 2, 23]
    feed = [ids[60:62], ids[62:65], ids[65:66]]
    want = dynamic.forward_batch([s for s, _ in expected], feed, [2, 3, 1])
    have = slots.forward_batch([s for s, _ in got], feed, [2, 3, 1])
    assert all(close(w, h) for w, h in zip(want, have))
    with pytest.raises(ValueError, match="commit_path follows forward_tree"):
        slots.commit_path(got[1][0], tree, path)


def test_graphs_need_cuda():
    with pytest.raises(ModelError, match="need the model on a CUDA device: use --cuda-graphs off on the CPU"):
        SlotCausalBackend(tiny_causal("qwen2"), steps="graphs")


SETTINGS = ["--dtype", "float32", "--policy", "greedy", "--entropy-threshold", "0", "--k", "3", "--max-new-tokens", "12"]


@pytest.fixture(scope="module")
def recording(pair, prompts, tmp_path_factory):
    """A split run of the prompts against a server on the dynamic cache."""
    with BackgroundServer(load_model(pair["cloud"], "float32"), ServeConfig(max_batch=8)) as url:
        return record_split(pair["edge"], url, prompts, tmp_path_factory.mktemp("recording"), SETTINGS)


@pytest.mark.server
def test_a_server_on_the_static_cache_gives_the_dynamic_servers_verdicts_and_tokens(pair, prompts, recording, tmp_path):
    loaded = load(pair["cloud"], LoadSettings("float32", kv_cache="static", sessions=16))
    assert isinstance(loaded.backend, SlotCausalBackend)
    with BackgroundServer(loaded, ServeConfig(max_batch=8, max_sessions=16)) as url:
        assert main(["fleet", "--edge-replay", str(recording), "--cloud-url", url, "--prompts", prompts, "--clients",
                     "1,3", "--out", str(tmp_path / "fleet"), *SETTINGS]) == 0
    records, _, batches = read_fleet(tmp_path / "fleet")
    assert len(records) == 2 * (1 + 3) * 3 and all(r["status"] == "ok" for r in records)
    assert sum(r["replay_mismatches"] for r in records if r["mode"] == "spec") == 0  # every recorded verdict, batched
    assert all(r["tokens_match"] for r in records if r["mode"] == "cloud")  # cloud-only: the recorded tokens
    assert max(b["rows"] for b in batches) > 1  # sessions shared forwards
    assert {r["kv_cache"] for r in records} == {"static"}  # the cache the server's `ready` named


def test_a_servers_auto_cache_on_the_cpu_is_the_dynamic_cache(pair):
    """serve --kv-cache auto (the default): dynamic on the CPU, where the static cache is not faster (docs/gpu.md);
    static on CUDA (tests/test_cuda.py). Runtimes with a cache of their own name none."""
    loaded = load(pair["cloud"], LoadSettings("float32", kv_cache="auto", sessions=16))
    assert type(loaded.backend) is HFCausalBackend and server_cache(loaded.backend) == "dynamic"
    static = load(pair["cloud"], LoadSettings("float32", kv_cache="static", sessions=16))
    assert server_cache(static.backend) == "static"
    assert server_cache(object()) is None


@pytest.mark.server
def test_the_fleet_starts_its_server_on_the_static_cache(pair, prompts, recording, tmp_path, capsys):
    out = tmp_path / "own"
    assert main(["fleet", "--edge-replay", str(recording), "--cloud", pair["cloud"], "--kv-cache", "static", "--prompts",
                 prompts, "--clients", "2", "--out", str(out), *SETTINGS]) == 0
    records, _, _ = read_fleet(out)
    assert all(r["status"] == "ok" and r["kv_cache"] == "static" for r in records)
    assert sum(r["replay_mismatches"] for r in records if r["mode"] == "spec") == 0
    code = main(["fleet", "--edge-replay", str(recording), "--cloud", pair["cloud"], "--cloud-runtime", "torch-int8",
                 "--kv-cache", "static", "--prompts", prompts, "--out", str(tmp_path / "int8"), *SETTINGS])
    assert code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == ("error: --kv-cache static is the torch runtime's; "
                                                                "torch-int8 keeps its own cache: drop --kv-cache")
