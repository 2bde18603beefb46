"""The static KV cache (specdec/backends/static_cache.py) computes what transformers' DynamicCache does: prompt
blocks, token steps, k+1-token blocks and crops give the same logits (fp32, tiny Llama and Qwen2), so greedy
speculation on it is the cloud's own decoding token for token; a crop is exact by setting a length."""
import pytest
import torch

from specdec.backends.devices import steps_of
from specdec.backends.hf_causal import HFCausalBackend
from specdec.backends.prompt import Prompt
from specdec.backends.static_cache import StaticCausalBackend
from specdec.backends.static_slots import causal_backend
from specdec.core.config import DecodeConfig, SpecConfig
from specdec.core.decode import autoregressive_decode, speculative_decode
from specdec.engine import Engine
from specdec.errors import ModelError, SpecdecError
from tests.tiny import noisy_copy, random_prompt, tiny_causal

TOLERANCE = 1e-5  # fp32: the two caches feed attention the same keys, summed in another order


def walk(backend, ids: torch.Tensor) -> list[torch.Tensor]:
    """Logits of a fixed walk: prompt block, steps, blocks, a crop into a rejected draft, a crop to an earlier
    position and a block past the first capacity (16 slots: the cache doubles, its slots copied over)."""
    state, first = backend.prefill(Prompt(ids[:7]), ids[:7], keep=7)
    out = [first]
    for a, b in ((7, 8), (8, 9), (9, 14)):  # steps, then a k+1 = 5 block
        out.append(backend.forward(state, ids[a:b]))
    backend.crop(state, 11)  # keep 2 of the block's 5
    out.append(backend.forward(state, ids[20:24]))
    backend.crop(state, 8)  # back past a whole cycle
    out.append(backend.forward(state, ids[30:31]))
    out.append(backend.forward(state, ids[31:45]))  # 23 positions: past 16 slots
    out.append(backend.forward(state, ids[45:52], keep=2))  # 30 positions, the last 2 rows' logits
    assert state.length == 30
    return out


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_static_steps_blocks_and_crops_equal_the_dynamic_cache(arch):
    model = tiny_causal(arch)
    ids = random_prompt(3, 60)
    dynamic = walk(HFCausalBackend(model), ids)
    static_backend = StaticCausalBackend(model, steps="static", capacity=16)
    static = walk(static_backend, ids)
    assert static_backend.kv.capacity == 32  # grew 16 -> 32, its slots copied over
    for d, s in zip(dynamic, static):
        assert d.shape == s.shape and d.dtype == s.dtype == torch.float32
        assert (d - s).abs().max() <= TOLERANCE * d.abs().max()


def test_a_crop_then_the_same_block_again_is_bitwise_the_first_time():
    backend = StaticCausalBackend(tiny_causal("qwen2"), steps="static")
    ids = random_prompt(4, 20)
    state, _ = backend.prefill(Prompt(ids[:6]), ids[:6], keep=1)
    first = backend.forward(state, ids[6:11])
    backend.crop(state, 6)
    backend.forward(state, ids[12:17])  # a draft that will be rejected, written over the same slots
    backend.crop(state, 6)
    assert torch.equal(backend.forward(state, ids[6:11]), first)


@pytest.mark.parametrize("verifier", ["cached", "stateless"])
def test_greedy_spec_on_static_caches_is_the_clouds_dynamic_decoding(verifier):
    cloud = tiny_causal("llama", sharpness=8.0)
    edge = noisy_copy(cloud, 0.3)
    decode = DecodeConfig(max_new_tokens=20)
    spec = SpecConfig(k=3, entropy_threshold=0.0, policy="greedy", verifier=verifier)
    for seed in range(3):
        prompt = Prompt(random_prompt(seed))
        plain = autoregressive_decode(HFCausalBackend(cloud), prompt, decode)
        static_cloud = StaticCausalBackend(cloud, steps="static", capacity=16)
        generation = speculative_decode(StaticCausalBackend(edge, steps="static"), static_cloud, prompt, spec, decode)
        assert generation.tokens == plain.tokens
        assert generation.counters.corrections and generation.counters.num_accepted_tokens  # both paths ran
        assert autoregressive_decode(static_cloud, prompt, decode).tokens == plain.tokens


def test_the_engine_takes_kv_cache_static_on_the_cpu(pair):
    engine = Engine(mode="spec", edge=pair["edge"], cloud=pair["cloud"], dtype="float32", kv_cache="static",
                    edge_device="cpu", cloud_device="cpu", spec=SpecConfig(k=3, entropy_threshold=0.0, policy="greedy"),
                    decode=DecodeConfig(max_new_tokens=12))
    cloud_only = Engine(mode="cloud", cloud=pair["cloud"], dtype="float32", decode=DecodeConfig(max_new_tokens=12))
    assert engine.generate("hello world").tokens == cloud_only.generate("hello world").tokens
    assert isinstance(engine.model("cloud").backend, StaticCausalBackend)
    assert engine.model("cloud").backend.steps == "static"
    assert type(cloud_only.model("cloud").backend) is HFCausalBackend  # auto on the CPU: the dynamic cache


def test_one_static_cache_holds_one_sequence():
    backend = StaticCausalBackend(tiny_causal("llama"), steps="static")
    ids = random_prompt(1, 12)
    first, _ = backend.prefill(Prompt(ids[:4]), ids[:4], keep=1)
    backend.prefill(Prompt(ids[:5]), ids[:5], keep=1)  # another sequence takes the cache over
    with pytest.raises(SpecdecError, match="one static KV cache, now another sequence's: .*--kv-cache dynamic"):
        backend.forward(first, ids[4:5])


def test_what_the_static_cache_does_not_run_is_refused_in_one_line():
    with pytest.raises(ModelError, match=r"^a static KV cache runs llama, qwen2, qwen3 models whose layers are all full "
                                         r"attention; this one is 'gemma3_text': use --kv-cache dynamic$"):
        causal_backend(tiny_causal("gemma3"), steps="static")
    with pytest.raises(ModelError, match="need the model on a CUDA device: use --cuda-graphs off on the CPU"):
        StaticCausalBackend(tiny_causal("llama"), steps="graphs")


def test_which_steps_each_setting_runs():
    assert steps_of("auto", "cpu") == "dynamic"
    assert steps_of("auto", "cuda") == "graphs" and steps_of("auto", "cuda:1", "off") == "dynamic"
    assert steps_of("auto", "cuda", static_capable=False) == "dynamic"  # a Whisper or Gemma3 keeps its own cache
    assert steps_of("static", "cuda") == "graphs" and steps_of("static", "cuda", "off") == "static"
    assert steps_of("static", "cpu") == "static" and steps_of("compiled", "cpu") == "compiled"


@pytest.mark.slow  # torch.compile's first compile takes 15-100 s on 2 cores
def test_the_compiled_static_forward_equals_the_dynamic_cache():
    model = tiny_causal("qwen2")
    ids = random_prompt(3, 60)
    dynamic = walk(HFCausalBackend(model), ids)
    compiled = walk(StaticCausalBackend(model, steps="compiled", capacity=16), ids)
    for d, c in zip(dynamic, compiled):
        assert (d - c).abs().max() <= TOLERANCE * d.abs().max()
