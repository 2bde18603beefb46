"""A runtime per role: the settings, the torch-int8 runtime on a causal LM, and the missing llama.cpp
extra. (llama.cpp itself: tests/test_llamacpp.py.)"""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from specdec.core.config import DecodeConfig, EngineConfig, SpecConfig
from specdec.engine import Engine
from specdec.errors import ConfigError, ModelError
from specdec.models.loading import load, load_model

QUIET = dict(log=lambda m: None)
TEXTS = ["hello world", "what is one two", "yes no . ,", "say three", "write a function to sort a list"]
GREEDY = dict(entropy_threshold=0.0, policy="greedy")


def quantized_linears(model) -> list:
    return [m for m in model.modules() if isinstance(m, torch.ao.nn.quantized.dynamic.Linear)]


@pytest.mark.parametrize("settings, message", [
    (dict(edge_runtime="onnx"), "unknown edge_runtime 'onnx': use one of torch, torch-int8, torch-int8t, llamacpp"),
    (dict(edge="m.gguf"), "is a GGUF file, which llama.cpp runs: add --edge-runtime llamacpp"),
    (dict(cloud_url="127.0.0.1:1", cloud=None, cloud_runtime="torch-int8"), "drop --cloud-runtime"),
])
def test_runtime_settings_validate_themselves(settings, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        EngineConfig(**{**dict(mode="spec", edge="e", cloud="c"), **settings})


def test_a_role_this_mode_does_not_load_takes_any_runtime():
    """Edge-only never builds the cloud, so its runtime (and whether that runtime is installed) is moot."""
    config = EngineConfig(mode="edge", edge="e", cloud="c.gguf", cloud_runtime="llamacpp")
    assert config.roles == ("edge",)


@pytest.mark.parametrize("runtime, op", [("torch-int8", "int8"), (None, "int8c")])
def test_int8_runtime_quantizes_every_linear_of_a_causal_lm(pair, runtime, op):
    """`--edge-runtime torch-int8` is `NAME@int8`; `@int8c` scales per output channel. Both run in
    float32 whatever --dtype says, and stay close to the float model."""
    log = []
    name = pair["cloud"] if runtime else f"{pair['cloud']}@{op}"
    loaded = load_model(name, "bfloat16", log=log.append, **({"runtime": runtime} if runtime else {}))
    model = loaded.backend.model
    names = quantized_linears(model)
    # 2 layers x 7 projections + the output head, all int8.
    assert len(names) == 15 and not [m for m in model.modules() if type(m) is torch.nn.Linear]
    scheme = model.lm_head.weight().qscheme()
    assert scheme == (torch.per_channel_affine if op == "int8c" else torch.per_tensor_affine)
    assert any("runs in float32, not bfloat16" in line for line in log)
    assert loaded.backend.vocab_size == 64
    reference = load_model(pair["cloud"], "float32", **QUIET).backend.model
    ids = torch.arange(1, 20).view(1, -1)
    with torch.inference_mode():
        exact, quantized = reference(ids).logits, model(ids).logits
    assert (quantized - exact).abs().max() < 0.05 * exact.abs().max()
    assert (quantized.argmax(-1) == exact.argmax(-1)).float().mean() > 0.9


def test_layer_truncation_stays_whisper_only(pair):
    with pytest.raises(ModelError, match=r"@dec1 is implemented for Whisper only.*takes @int8 or @int8c"):
        load_model(pair["cloud"] + "@dec1", "float32", **QUIET)
    with pytest.raises(ModelError, match="repeats an op"):
        load_model(pair["cloud"] + "@int8+int8c", "float32", **QUIET)


def generate_all(engine: Engine) -> list:
    try:
        return [engine.generate(text) for text in TEXTS]
    finally:
        engine.close()


@pytest.mark.parametrize("verifier", ["cached", "stateless"])
@pytest.mark.parametrize("k", [1, 4])
def test_greedy_spec_with_an_int8_edge_equals_the_torch_cloud_alone(pair, verifier, k):
    """The verifier decides every token, so any drafter is lossless: an int8 edge too."""
    decode = DecodeConfig(max_new_tokens=16)
    common = dict(dtype="float32", decode=decode, log=lambda m: None)
    spec = Engine(mode="spec", edge=pair["edge"], cloud=pair["cloud"], edge_runtime="torch-int8",
                  spec=SpecConfig(k=k, verifier=verifier, **GREEDY), **common)
    cloud = Engine(mode="cloud", cloud=pair["cloud"], **common)
    drafted = generate_all(spec)
    assert quantized_linears(spec.model("edge").backend.model)
    assert [g.tokens for g in drafted] == [g.tokens for g in generate_all(cloud)]
    cycles = [c for g in drafted for c in g.cycles]
    kinds = {c.extra_kind for c in cycles}
    assert "correction" in kinds and ("bonus" in kinds or k == 1 and "correction" in kinds)


@pytest.mark.parametrize("k", [2, 4])
def test_greedy_spec_verified_in_int8t_is_that_runtimes_own_plain_decoding(pair, k):
    """torch-int8t's blocks compute its steps' logits bit for bit, so greedy speculation verified there emits
    the int8t cloud's own plain decoding token for token (torch-int8's per-block activation scale does not
    promise that: the main job's lossless points run on int8t). Every path ran: corrections and bonuses."""
    decode = DecodeConfig(max_new_tokens=16)
    common = dict(dtype="float32", decode=decode, log=lambda m: None)
    spec = Engine(mode="spec", edge=pair["edge"], cloud=pair["cloud"], edge_runtime="torch", cloud_runtime="torch-int8t",
                  spec=SpecConfig(k=k, **GREEDY), **common)
    cloud = Engine(mode="cloud", cloud=pair["cloud"], cloud_runtime="torch-int8t", **common)
    drafted = generate_all(spec)
    assert spec.model("cloud").runtime == "torch-int8t" and cloud.model("cloud").runtime == "torch-int8t"
    assert [g.tokens for g in drafted] == [g.tokens for g in generate_all(cloud)]
    kinds = {c.extra_kind for g in drafted for c in g.cycles}
    assert {"correction", "bonus"} <= kinds


def test_an_int8_cloud_runs_in_process(pair):
    engine = Engine(mode="cloud", cloud=pair["cloud"], cloud_runtime="torch-int8", dtype="float32",
                    decode=DecodeConfig(max_new_tokens=6), log=lambda m: None)
    assert len(engine.generate("hello world").tokens) == 6
    assert quantized_linears(engine.model("cloud").backend.model)


BLOCKED = "import sys; sys.modules['llama_cpp'] = None  # as if llama-cpp-python were not installed\n"


@pytest.mark.subprocess  # runs specbench in a child process
def test_missing_llamacpp_extra_is_one_line(pair, prompts, tmp_path):
    """Without llama-cpp-python, choosing llamacpp is one line naming the extra (checked before any
    model loads); a torch run in the same interpreter is unaffected."""
    code = BLOCKED + "from bench.cli import main; sys.exit(main(sys.argv[1:]))"
    run = ["run", "--mode", "spec", "--edge", pair["edge"], "--cloud", pair["cloud"], "--prompts", prompts,
           "--dtype", "float32", "--max-new-tokens", "3", "--limit", "1"]
    result = subprocess.run([sys.executable, "-c", code, *run, "--edge-runtime", "llamacpp", "--out", str(tmp_path / "a")],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [
        "error: --edge-runtime llamacpp needs llama-cpp-python, which is not installed: pip install 'specbench[llamacpp]'"]
    assert not (tmp_path / "a").exists()
    result = subprocess.run([sys.executable, "-c", code, *run, "--edge-runtime", "torch-int8", "--out", str(tmp_path / "b")],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "b" / "results.jsonl").exists()


@pytest.mark.subprocess  # runs specbench in a child process
def test_a_broken_llamacpp_install_is_one_line_too(pair, prompts, tmp_path):
    """Installed but not importable (a build whose shared library is missing): the same kind of line."""
    shadow = tmp_path / "shadow" / "llama_cpp"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('libllama.so: cannot open shared object file')\n")
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    code = f"import sys; sys.path.insert(0, {str(shadow.parent)!r})\nfrom bench.cli import main; sys.exit(main(sys.argv[1:]))"
    result = subprocess.run([sys.executable, "-c", code, "run", "--mode", "edge", "--edge", str(tmp_path / "m.gguf"),
                             "--edge-runtime", "llamacpp", "--prompts", prompts, "--out", str(tmp_path / "o")],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: runtime llamacpp needs llama-cpp-python, which cannot be "
                                                   "imported (libllama.so: cannot open shared object file)"), lines
    assert "pip install 'specbench[llamacpp]'" in lines[0]


def test_edge_only_never_builds_the_cloud_whatever_its_runtime(pair):
    """The cloud named here does not even exist: an edge-only run must not try to load it."""
    loads = []

    def loader(name, settings, log=print):
        loads.append((name, settings.runtime))
        return load(name, settings, log)

    engine = Engine(mode="edge", edge=pair["edge"], edge_runtime="torch-int8", cloud="/nowhere/cloud.gguf",
                    cloud_runtime="llamacpp", dtype="float32", decode=DecodeConfig(max_new_tokens=4), loader=loader,
                    log=lambda m: None)
    assert len(engine.generate("hello world").tokens) == 4
    assert loads == [(pair["edge"], "torch-int8")]
