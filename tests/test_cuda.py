"""The engine on a CUDA GPU: the tiny fp32 pair placed there gives cloud-only's tokens, token for token, through
every cache the GPU runs (transformers' dynamic cache eagerly, the static cache eagerly, the static cache's steps
replayed as captured CUDA graphs), in process and through a server on the GPU, one session or several batched, on
the server's dynamic cache or its static cache of many sequences (captured or eager).
Marked `cuda`: skipped where torch sees no GPU (tests/conftest.py); bench/gpu/check.sh runs this file on one."""
import json
import threading

import pytest
import torch

from bench.measure.run import run
from specdec.backends.devices import check_device, check_served_device, gpu_peaks
from specdec.backends.hf_causal import HFCausalBackend
from specdec.backends.prompt import Prompt
from specdec.backends.static_cache import StaticCausalBackend
from specdec.backends.static_slots import SlotCausalBackend, server_cache
from specdec.core.config import DecodeConfig, EngineConfig, SpecConfig
from specdec.core.tree import TokenTree
from specdec.engine import Engine
from specdec.errors import ConfigError
from specdec.machine import fingerprint
from specdec.models.loading import LoadSettings, load
from specdec.remote.background import BackgroundServer
from tests.test_static_cache import TOLERANCE, walk
from tests.test_static_slots import rows_walk
from tests.test_torch_trees import BRANCHES, close, step_after
from tests.tiny import random_prompt, tiny_causal

pytestmark = pytest.mark.cuda

TEXTS = ["hello world", "what is one two", "yes no . ,", "say three"]
GREEDY = SpecConfig(k=3, entropy_threshold=0.0, policy="greedy")
DECODE = DecodeConfig(max_new_tokens=14)
# kv_cache x cuda_graphs -> what runs: auto/on = graphs, static/off = the static cache eagerly, dynamic = transformers'
CACHES = [("auto", "on"), ("static", "off"), ("dynamic", "on")]


def generate_all(engine: Engine) -> list[list[int]]:
    try:
        return [engine.generate(text).tokens for text in TEXTS]
    finally:
        engine.close()


@pytest.fixture(scope="module")
def cloud_only(pair):
    return generate_all(Engine(mode="cloud", cloud=pair["cloud"], dtype="float32", cloud_device="cuda",
                               kv_cache="dynamic", decode=DECODE, log=lambda m: None))


@pytest.mark.parametrize("kv_cache, cuda_graphs", CACHES)
@pytest.mark.parametrize("verifier", ["cached", "stateless"])
def test_greedy_spec_on_the_gpu_is_cloud_only_token_for_token(pair, cloud_only, kv_cache, cuda_graphs, verifier):
    spec = SpecConfig(k=3, entropy_threshold=0.0, policy="greedy", verifier=verifier)
    for edge_device in ("cpu", "cuda"):
        engine = Engine(mode="spec", edge=pair["edge"], cloud=pair["cloud"], dtype="float32", edge_device=edge_device,
                        cloud_device="cuda", kv_cache=kv_cache, cuda_graphs=cuda_graphs, spec=spec, decode=DECODE,
                        log=lambda m: None)
        assert generate_all(engine) == cloud_only
        assert engine.model("cloud").backend.device.type == "cuda"
    plain = Engine(mode="cloud", cloud=pair["cloud"], dtype="float32", cloud_device="cuda", kv_cache=kv_cache,
                   cuda_graphs=cuda_graphs, decode=DECODE, log=lambda m: None)
    assert generate_all(plain) == cloud_only


@pytest.mark.parametrize("steps", ["static", "graphs"])
def test_static_and_captured_steps_equal_the_dynamic_cache_on_the_gpu(steps):
    model = tiny_causal("qwen2").to("cuda")
    ids = random_prompt(3, 60)
    dynamic = walk(HFCausalBackend(model), ids)
    backend = StaticCausalBackend(model, steps=steps, capacity=16)
    for d, s in zip(dynamic, walk(backend, ids)):
        assert s.device.type == "cuda" and (d - s).abs().max() <= TOLERANCE * d.abs().max()
    if steps == "graphs":
        assert backend.fast.graphs  # short blocks were replayed from captured graphs


@pytest.mark.parametrize("steps", ["dynamic", "static", "graphs", "server slots"])
def test_a_trees_rows_are_its_paths_steps_and_its_kept_path_a_chains_on_the_gpu(steps):
    """Each node's row equals the step after its path (the dynamic cache's steps on the GPU, fp32), under graphs from
    a captured tree, on the server's static cache in the session's slot; the committed path then gives a chain's next
    block."""
    model = tiny_causal("llama").to("cuda")
    if steps == "server slots":
        backend = SlotCausalBackend(model, steps="static", slots=4, capacity=64)
    else:
        backend = HFCausalBackend(model) if steps == "dynamic" else StaticCausalBackend(model, steps=steps, capacity=32)
    twin = HFCausalBackend(model)
    ids = random_prompt(7, 20)
    tree = TokenTree.from_branches(BRANCHES, budget=9)
    for cached in (12, 19):
        state, _ = backend.prefill(Prompt(ids[:cached]), ids[:cached])
        logits = backend.forward_tree(state, ids[cached:], tree)
        assert logits.device.type == "cuda" and logits.shape[0] == 1 + tree.size
        for node in range(tree.size):
            assert close(logits[1 + node], step_after(twin, ids, tree.tokens[tree.path(node)])), node
        backend.commit_path(state, tree, [0, 1, 2])  # 11 12 13
        chain, _ = twin.prefill(Prompt(ids), ids)
        twin.forward(chain, tree.tokens[[0, 1, 2]])
        after = torch.tensor([30, 31])
        assert all(close(g, w) for g, w in zip(backend.forward(state, after), twin.forward(chain, after)))
    if steps == "graphs":
        assert backend.trees.graphs  # the trees' rows were replayed from a captured graph


@pytest.mark.parametrize("kv_cache, cuda_graphs", CACHES)
def test_prompt_lookup_trees_on_the_gpu_are_cloud_only_token_for_token(pair, cloud_only, kv_cache, cuda_graphs):
    spec = SpecConfig(k=4, entropy_threshold=0.0, policy="greedy", drafter="prompt-lookup", drafter_options="branches=4")
    engine = Engine(mode="spec", edge=pair["edge"], cloud=pair["cloud"], dtype="float32", cloud_device="cuda",
                    kv_cache=kv_cache, cuda_graphs=cuda_graphs, spec=spec, decode=DECODE, log=lambda m: None)
    assert generate_all(engine) == cloud_only


def test_a_replayed_step_is_its_own_copy():
    backend = StaticCausalBackend(tiny_causal("llama").to("cuda"), steps="graphs")
    ids = random_prompt(5, 12)
    state, _ = backend.prefill(Prompt(ids[:4]), ids[:4], keep=1)
    first = backend.forward(state, ids[4:5])
    kept = first.clone()
    backend.forward(state, ids[5:6])  # the same graph again: its output buffer is rewritten
    assert torch.equal(first, kept)


@pytest.mark.parametrize("steps", ["static", "graphs"])
def test_the_servers_static_cache_gives_each_row_its_own_forward_on_the_gpu(steps):
    model = tiny_causal("llama").to("cuda")
    slots = SlotCausalBackend(model, steps=steps, slots=4, capacity=64)
    rows_walk(HFCausalBackend(model), slots)
    if steps == "graphs":
        assert slots.fast.graphs  # the shared forwards were replayed from captured graphs


def test_a_servers_auto_cache_on_the_gpu_is_the_captured_static_cache(pair):
    """serve --kv-cache auto (the default) on CUDA: the static cache of many sequences, its forwards captured."""
    loaded = load(pair["cloud"], LoadSettings("float32", device="cuda", kv_cache="auto", sessions=4))
    assert isinstance(loaded.backend, SlotCausalBackend) and loaded.backend.steps == "graphs"
    assert server_cache(loaded.backend) == "static"


# The server's caches: transformers' dynamic cache, and its static cache of many sequences, captured and eager.
SERVER_CACHES = [{}, {"kv_cache": "static", "cuda_graphs": "on", "sessions": 16},
                 {"kv_cache": "static", "cuda_graphs": "off", "sessions": 16}]


@pytest.mark.server  # a loopback server: the quick loop leaves it out
@pytest.mark.parametrize("cache", SERVER_CACHES, ids=["dynamic", "static-graphs", "static-eager"])
def test_through_a_server_on_the_gpu_one_session_and_several_batched(pair, cloud_only, cache):
    with BackgroundServer(load(pair["cloud"], LoadSettings("float32", device="cuda", **cache))) as url:
        common = dict(edge=pair["edge"], dtype="float32", spec=GREEDY, decode=DECODE, log=lambda m: None)
        engine = Engine(mode="spec", cloud_url=url, **common)
        assert generate_all(engine) == cloud_only
        engine.load()
        assert engine.cloud_device_used == "cuda:0"
        engine.close()
        found: dict[int, list[int]] = {}

        def one(index: int) -> None:
            session = Engine(mode="spec", cloud_url=url, **common)
            try:
                found[index] = session.generate(TEXTS[index]).tokens
            finally:
                session.close()

        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(TEXTS))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert [found[i] for i in range(len(TEXTS))] == cloud_only


def test_a_cuda_run_records_gpu_memory_and_the_gpu(pair, prompts, tmp_path):
    out = tmp_path / "run"  # `specbench run --cloud-device cuda` (tests/test_devices.py holds the flags to the CLI)
    engine = Engine(mode="cloud", cloud=pair["cloud"], dtype="float32", cloud_device="cuda",
                    decode=DecodeConfig(max_new_tokens=6), log=lambda m: None)
    run(engine, prompts, out, progress=False)
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert all(r["cloud_device"] == "cuda" and r["peak_gpu_allocated_bytes"] > 0 for r in rows)
    assert all(r["peak_gpu_reserved_bytes"] >= r["peak_gpu_allocated_bytes"] for r in rows)
    assert gpu_peaks() is not None
    assert fingerprint()["gpu"] == torch.cuda.get_device_name(0)


def test_devices_this_gpu_machine_lacks_and_cpu_only_runtimes_are_one_line():
    missing = f"cuda:{torch.cuda.device_count()}"
    with pytest.raises(ConfigError, match=rf"^--cloud-device {missing}: this machine has \d+ CUDA devices?"):
        EngineConfig(mode="cloud", cloud="m", cloud_device=missing)
    with pytest.raises(ConfigError, match="^--edge-runtime llamacpp runs on the CPU only: use --edge-device cpu"):
        EngineConfig(mode="edge", edge="m.gguf", edge_runtime="llamacpp", edge_device="cuda")
    with pytest.raises(ConfigError, match="^runtime torch-int8 runs on the CPU only: use --device cpu"):
        check_served_device("cuda", "torch-int8")
    assert check_device("cuda:0") == "cuda:0"
