"""llama.cpp's extra buffer types (specdec/backends/llamacpp_probe.py): a tiny GGUF quantized by llama.cpp's own
quantizer decodes in blocks as in steps under `auto` on any CPU (on an AMX machine whose build crashes, because the
probe turned them off), and its records say which path ran; a probe child that dies of SIGSEGV leaves them off and is
kept; verdicts are reused per machine class, build and weight type, a damaged cache is rewritten; a bad setting is one
line. This session's machine had no AMX: there the probe passes and Q4_0 runs in the CPU repack kernels."""
from __future__ import annotations

import ctypes
import json
import logging
import sys
import types

import pytest
import torch

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (pip install 'specbench[llamacpp]')")

import llama_cpp
from transformers import LlamaConfig, LlamaForCausalLM

from bench.core.point import Point
from bench.measure.run import run
from specdec.backends import llamacpp_probe
from specdec.backends.llamacpp import LlamaCppBackend
from specdec.backends.llamacpp_probe import CACHE_FILE, Verdict, build_id, decide
from specdec.backends.prompt import Prompt
from specdec.core.config import DecodeConfig, EngineConfig
from specdec.engine import Engine
from specdec.errors import ConfigError
from specdec.machine import fingerprint
from tests.omni_fixtures import tiny_omni_tokenizer
from tests.tiny_gguf import write_llama_gguf

pytestmark = pytest.mark.server  # llama.cpp and child processes: see CONTRIBUTING.md

SEGV = [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"]
KILLED = [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"]
PASS = [sys.executable, "-c", "pass"]
RAN = [sys.executable, "-c", "import sys; sys.exit('the probe ran again')"]  # a verdict "probe failed (... ran again)"
# Blocks against steps, relative to the largest |logit|: equal here (measured 0, with and without the repack
# kernels); elsewhere a step and a block may run in different kernels (AMX tiles take blocks) that sum in
# another order.
BLOCK_VS_STEPS = 1e-3


@pytest.fixture(scope="module")
def ggufs(tmp_path_factory) -> dict[str, str]:
    """The tiny model as F32 and quantized by llama.cpp to Q8_0 and Q4_0, each in a folder with the HF tokenizer.
    Every matrix is 256 wide and its rows a multiple of 32: the sizes ggml's AMX buffer type takes
    (ggml-cpu/amx/amx.cpp: `op->ne[0] % (TILE_N * 2)`, `src0->ne[0] % TILE_K` or 256 for K-quants)."""
    root = tmp_path_factory.mktemp("extra-buffers")
    tokenizer = tiny_omni_tokenizer()
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=256, intermediate_size=512, num_hidden_layers=1, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=256, bos_token_id=None,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=None)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(8.0)  # peaked distributions, as tests/tiny.py
    paths = {}
    for kind in ("F32", "Q8_0", "Q4_0"):
        (root / kind).mkdir()
        tokenizer.save_pretrained(root / kind)
        paths[kind] = str(root / kind / "model.gguf")
    write_llama_gguf(model, paths["F32"], tokenizer.eos_token_id)
    for kind in ("Q8_0", "Q4_0"):
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{kind}")
        params.allow_requantize = True
        assert llama_cpp.llama_model_quantize(paths["F32"].encode(), paths[kind].encode(), ctypes.byref(params)) == 0
    return paths


def steps_and_blocks(backend: LlamaCppBackend, n: int = 20) -> tuple[torch.Tensor, torch.Tensor]:
    """The logits [n-1, V] of tokens 1..n-1 fed one at a time, and fed in blocks of 2..5."""
    ids = torch.randint(0, backend.vocab_size, (n,), generator=torch.Generator().manual_seed(0))
    stepped, _ = backend.prefill(Prompt(ids[:1]), ids[:1])
    steps = torch.cat([backend.forward(stepped, ids[i:i + 1]) for i in range(1, n)])
    blocked, _ = backend.prefill(Prompt(ids[:1]), ids[:1])
    rows, at, size = [], 1, 2
    while at < n:
        rows.append(backend.forward(blocked, ids[at:at + size]))
        at, size = at + size, 2 + size % 4
    return steps, torch.cat(rows)


@pytest.mark.parametrize("kind", ["Q8_0", "Q4_0"])
def test_a_quantized_gguf_decodes_in_blocks_as_in_steps_under_auto(ggufs, kind, tmp_path):
    cache = tmp_path / CACHE_FILE
    backend = LlamaCppBackend(ggufs[kind], extra_buffers="auto", probe_cache=cache)
    # Here (no AMX) the probe passes; on an AMX machine with the GCC 12 build it dies of SIGSEGV: off.
    assert backend.extra_buffers == (backend.extra_buffers_reason == "probe passed")
    assert backend.extra_buffers_reason == "probe passed" or backend.extra_buffers_reason.startswith("probe died of ")
    [(key, entry)] = json.loads(cache.read_text()).items()
    assert entry["works"] is backend.extra_buffers and key.endswith(f" | MOSTLY_{kind}")
    steps, blocks = steps_and_blocks(backend)
    assert torch.isfinite(blocks).all()
    assert (blocks - steps).abs().max() <= BLOCK_VS_STEPS * steps.abs().max()


def test_every_record_says_which_path_ran(ggufs, prompts, tmp_path, monkeypatch):
    """A run's records (and a point before the load, as asked) carry the path; off by setting reaches the
    backend through the engine's loader; a run without llama.cpp records None."""
    monkeypatch.setenv("SPECBENCH_HOME", str(tmp_path / "home"))  # load_model keeps verdicts there
    decode = DecodeConfig(max_new_tokens=4)
    auto = Engine(mode="cloud", cloud=ggufs["Q4_0"], cloud_runtime="llamacpp", decode=decode, log=lambda m: None)
    assert Point.of(auto, prompts).llamacpp_extra_buffers == "auto"  # before the load: as asked
    rows = run(auto, prompts, tmp_path / "auto", progress=False)
    backend = auto.model("cloud").backend
    used = "on" if backend.extra_buffers else "off"
    assert rows and all(row["llamacpp_extra_buffers"] == used for row in rows)
    assert [*json.loads((tmp_path / "home" / CACHE_FILE).read_text()).values()][0]["reason"] == backend.extra_buffers_reason
    off = Engine(mode="cloud", cloud=ggufs["Q4_0"], cloud_runtime="llamacpp", llamacpp_extra_buffers="off",
                 decode=decode, log=lambda m: None)
    rows = run(off, prompts, tmp_path / "off", progress=False)
    assert off.model("cloud").backend.extra_buffers_reason == "off by setting"
    assert all(row["llamacpp_extra_buffers"] == "off" for row in rows)
    torch_only = Engine(mode="cloud", cloud="any-torch-model", llamacpp_extra_buffers="off")
    assert Point.of(torch_only, prompts).llamacpp_extra_buffers is None


def test_a_probe_that_dies_of_sigsegv_leaves_extra_buffers_off_and_is_kept(ggufs, tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(llamacpp_probe, "_announced", set())  # our module's once-a-process memory, fresh
    cache = tmp_path / CACHE_FILE
    with caplog.at_level(logging.WARNING, logger=llamacpp_probe.__name__):
        backend = LlamaCppBackend(ggufs["Q8_0"], probe_cache=cache, probe_argv=SEGV)
        again = LlamaCppBackend(ggufs["Q8_0"], probe_cache=cache, probe_argv=RAN)  # kept: no child runs
    assert not backend.extra_buffers and backend.extra_buffers_reason == "probe died of SIGSEGV"
    assert not again.extra_buffers and again.extra_buffers_reason == "probe died of SIGSEGV"
    [entry] = json.loads(cache.read_text()).values()
    assert entry["works"] is False and entry["reason"] == "probe died of SIGSEGV"
    [line] = [r.getMessage() for r in caplog.records]  # said once
    assert "without its extra buffer types" in line and "probe died of SIGSEGV" in line
    steps, blocks = steps_and_blocks(again)  # and it runs, without them
    assert (blocks - steps).abs().max() <= BLOCK_VS_STEPS * steps.abs().max()


def test_verdicts_are_kept_per_machine_build_and_weight_type(ggufs, tmp_path):
    cache = tmp_path / CACHE_FILE
    assert decide("auto", ggufs["Q8_0"], "build A", cache, PASS) == Verdict(True, "probe passed")
    assert decide("auto", ggufs["Q8_0"], "build A", cache, RAN) == Verdict(True, "probe passed")  # reused
    assert decide("auto", ggufs["Q8_0"], "build B", cache, SEGV) == Verdict(False, "probe died of SIGSEGV")
    assert decide("auto", ggufs["Q4_0"], "build A", cache, SEGV) == Verdict(False, "probe died of SIGSEGV")
    assert decide("auto", ggufs["Q8_0"], "build B", cache, RAN) == Verdict(False, "probe died of SIGSEGV")
    machine = fingerprint()["machine_class"]
    assert sorted(json.loads(cache.read_text())) == [f"{machine} | build A | MOSTLY_Q4_0", f"{machine} | build A | MOSTLY_Q8_0",
                                                     f"{machine} | build B | MOSTLY_Q8_0"]


def test_a_rebuilt_llama_cpp_is_another_build(tmp_path):
    package = tmp_path / "llama_cpp"
    (package / "lib").mkdir(parents=True)
    (package / "lib" / "libggml-cpu.so").write_bytes(b"gcc 12")
    module = types.SimpleNamespace(__file__=str(package / "__init__.py"), __version__="0.3.36")
    before = build_id(module)
    (package / "lib" / "libggml-cpu.so").write_bytes(b"gcc 13.2")
    assert before.startswith("llama-cpp-python 0.3.36 libggml-cpu.so:6:") and build_id(module) != before
    assert build_id(llama_cpp).startswith(f"llama-cpp-python {llama_cpp.__version__} ")


@pytest.mark.parametrize("damage", ["{not json", "[1, 2]", '{"k": {"works": "yes"}}', ""])
def test_a_damaged_cache_is_ignored_and_rewritten(ggufs, tmp_path, damage):
    cache = tmp_path / CACHE_FILE
    cache.write_text(damage)
    assert decide("auto", ggufs["Q8_0"], "build A", cache, PASS) == Verdict(True, "probe passed")
    [entry] = json.loads(cache.read_text()).values()
    assert entry["works"] is True and entry["reason"] == "probe passed"


@pytest.mark.parametrize("child, timeout_s, reason", [
    (KILLED, 60, "probe died of SIGKILL"),  # the OOM killer or a user: nothing about the kernels
    ([sys.executable, "-c", "import sys; sys.exit('no llama')"], 60, "probe failed (exit 1: no llama)"),
    ([sys.executable, "-c", "import time; time.sleep(60)"], 0.5, "probe timed out after 0.5 s"),
])
def test_a_probe_without_a_verdict_leaves_them_off_and_keeps_nothing(ggufs, tmp_path, child, timeout_s, reason):
    cache = tmp_path / CACHE_FILE
    assert decide("auto", ggufs["Q8_0"], "build A", cache, child, timeout_s) == Verdict(False, reason)
    assert not cache.exists()


def test_on_and_off_by_setting_run_no_probe(ggufs, tmp_path):
    cache = tmp_path / CACHE_FILE
    on = LlamaCppBackend(ggufs["Q8_0"], extra_buffers="on", probe_cache=cache, probe_argv=RAN)
    off = LlamaCppBackend(ggufs["Q8_0"], extra_buffers="off", probe_cache=cache, probe_argv=RAN)
    assert (on.extra_buffers, on.extra_buffers_reason) == (True, "on by setting")
    assert (off.extra_buffers, off.extra_buffers_reason) == (False, "off by setting")
    assert not cache.exists()


def test_a_bad_setting_is_one_line(ggufs, tmp_path):
    expected = "unknown llamacpp_extra_buffers 'maybe': use one of auto, on, off"
    with pytest.raises(ConfigError) as config:
        EngineConfig(mode="cloud", cloud=ggufs["Q8_0"], cloud_runtime="llamacpp", llamacpp_extra_buffers="maybe")
    with pytest.raises(ConfigError) as backend:
        LlamaCppBackend(ggufs["Q8_0"], extra_buffers="maybe", probe_cache=tmp_path / CACHE_FILE)
    assert str(config.value) == str(backend.value) == expected
