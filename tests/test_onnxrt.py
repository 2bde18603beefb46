"""ONNX Runtime backend on a tiny random Qwen2 model converted by onnxruntime-genai's builder: the
conversion is made once, reused, hashed in its marker, rebuilt when its output is damaged and refused
when its source is; blocks, one-token steps and crops give the logits of one full forward: bit for bit
with pad_steps (a step runs as two rows, the kernels of every block), within rounding without it (one-row
MatMulNBits takes another kernel), with the same argmax."""
import json
import shutil

import pytest
import torch

pytest.importorskip("onnxruntime_genai")

from specdec.backends.base import Backend
from specdec.backends.onnxrt import OnnxRuntimeBackend
from specdec.backends.prompt import Prompt
from specdec.errors import ModelError
from specdec.models import integrity
from specdec.models.artifact import MARKER
from specdec.models.convert_onnx import KEEP_INPUT, ensure_onnx, load_onnx, onnx_dir
from tests.tiny import VOCAB, tiny_causal

TOLERANCE = 1e-4  # unpadded one-row steps vs blocks on this tiny model: ~1e-6 (0.3 on the real 0.5B/1.5B)
QUIET = dict(log=lambda message: None)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A tiny Qwen2 model saved as a HF folder with a tokenizer (the builder copies it), converted once."""
    from tests.omni_fixtures import tiny_omni_tokenizer

    path = tmp_path_factory.mktemp("onnx") / "tiny-qwen2"
    model = tiny_causal("qwen2")
    model.config.architectures = ["Qwen2ForCausalLM"]  # what the builder dispatches on
    model.save_pretrained(path)
    tiny_omni_tokenizer().save_pretrained(path)
    ensure_onnx(path, **QUIET)
    return path


@pytest.fixture(scope="module")
def backend(folder):
    return load_onnx(folder, **QUIET)


def _ids(seed: int, n: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed))


def test_conversion_cached_and_hashed(folder):
    out = onnx_dir(folder)
    marker = json.loads((out / MARKER).read_text())
    assert marker["recipe"]["builder"] == "onnxruntime-genai==0.18.0"
    assert marker["source"]["model.safetensors"]["sha256"] == integrity.sha256_of(folder / "model.safetensors")
    for name in ("model.onnx", "model.onnx.data", "genai_config.json"):
        assert marker["files"][name]["sha256"] == integrity.sha256_of(out / name)
    assert not integrity.problems(out, marker["files"], hashes=True)
    stamp = (out / "model.onnx").stat().st_mtime_ns
    messages = []
    assert ensure_onnx(folder, log=messages.append, verify=True) == out  # reused: no rebuild, no message
    assert messages == [] and (out / "model.onnx").stat().st_mtime_ns == stamp
    assert {p.name for p in folder.iterdir() if p.name.startswith(".")} == {".onnx-int4.lock"}  # no temporary files


def test_graph_keeps_last_rows(backend):
    assert KEEP_INPUT in {i.name for i in backend._session.get_inputs()}
    assert isinstance(backend, Backend) and backend.vocab_size == VOCAB and not backend.accepts_audio


@pytest.mark.parametrize("pad_steps", [True, False])
def test_blocks_steps_and_crops_equal_one_forward(folder, pad_steps):
    backend = OnnxRuntimeBackend(onnx_dir(folder), pad_steps=pad_steps)
    ids = _ids(1, 40)
    state, full = backend.prefill(Prompt(ids), ids, keep=40)  # [40, V]: the reference rows
    assert full.shape == (40, VOCAB) and full.dtype == torch.float32 and state.length == 40

    def same(rows, start):
        got = torch.cat(rows) if isinstance(rows, list) else rows
        want = full[start : start + got.shape[0]]
        if pad_steps:
            assert torch.equal(got, want)
        assert (got - want).abs().max().item() <= TOLERANCE
        assert torch.equal(got.argmax(-1), want.argmax(-1))

    state, last = backend.prefill(Prompt(ids[:12]), ids[:12], keep=3)
    same(last, 9)  # keep: the prompt's last rows only
    same(backend.forward(state, ids[12:17]), 12)  # a block on the cache: positions 12..16
    backend.crop(state, 14)  # reject 3, then verify another block over the cropped rows
    same(backend.forward(state, ids[14:22], keep=8), 14)
    backend.crop(state, 20)
    same([backend.forward(state, ids[t : t + 1]) for t in range(20, 30)], 20)  # one-token steps
    assert backend.forward(state, ids[30:33], keep=1).shape == (1, VOCAB)
    assert backend.forward(state, ids[33:34], keep=0) is None and state.length == 34  # a padded step's extra row dropped
    backend.crop(state, 33)
    same(backend.forward(state, ids[33:40], keep=7), 33)
    assert state.length == 40
    with pytest.raises(ValueError):
        backend.crop(state, 41)


def test_buffers_grow_with_held_rows(folder, monkeypatch):
    import specdec.backends.onnxrt as onnxrt

    monkeypatch.setattr(onnxrt, "MIN_CAPACITY", 4)
    small = OnnxRuntimeBackend(onnx_dir(folder))
    ids = _ids(2, 30)
    _, full = small.prefill(Prompt(ids), ids, keep=30)
    state, _ = small.prefill(Prompt(ids[:3]), ids[:3])
    assert state.capacity == 4
    rows = [small.forward(state, ids[t : t + 3]) for t in range(3, 30, 3)]  # grows 4 -> 8 -> 16 -> 32
    assert state.capacity == 32 and torch.equal(torch.cat(rows), full[3:])


def test_damaged_source_refused_in_one_line(folder, tmp_path):
    copy = tmp_path / "damaged"
    shutil.copytree(folder, copy)
    weights = copy / "model.safetensors"
    with open(weights, "r+b") as f:
        f.truncate(weights.stat().st_size - 100)
    with pytest.raises(ModelError) as error:
        ensure_onnx(copy, **QUIET)
    message = str(error.value)
    assert "\n" not in message and "model.safetensors" in message and "truncated" in message


def test_damaged_output_rebuilt(folder, tmp_path):
    copy = tmp_path / "damaged-output"
    shutil.copytree(folder, copy)
    data = onnx_dir(copy) / "model.onnx.data"
    with open(data, "r+b") as f:
        f.truncate(data.stat().st_size - 64)
    messages = []
    backend = load_onnx(copy, log=messages.append)
    assert "is damaged" in messages[0] and "model.onnx.data" in messages[0]
    out = onnx_dir(copy)
    assert not integrity.problems(out, json.loads((out / MARKER).read_text())["files"], hashes=True)
    assert backend.vocab_size == VOCAB


def test_changed_source_rebuilt_touched_source_reused(folder, tmp_path, monkeypatch):
    import specdec.models.convert_onnx as convert_onnx

    copy = tmp_path / "changed"
    shutil.copytree(folder, copy)
    out = onnx_dir(copy)
    built = []

    def fake_build(model_dir, variant, tmp):
        built.append(model_dir)
        for name in ("model.onnx", "genai_config.json"):
            (tmp / name).write_text("{}")

    monkeypatch.setattr(convert_onnx, "_build", fake_build)
    config = copy / "generation_config.json"
    config.write_text(config.read_text())  # same bytes, new mtime: hashed again, reused, new mtime recorded
    assert ensure_onnx(copy, **QUIET) == out and built == []
    assert json.loads((out / MARKER).read_text())["source"][config.name]["mtime_ns"] == config.stat().st_mtime_ns
    config.write_text(config.read_text().replace("}", ', "temperature": 0.5}', 1))  # other bytes: rebuilt
    messages = []
    ensure_onnx(copy, log=messages.append)
    assert built == [copy] and "changed" in messages[0]



def test_the_unedited_variant_feeds_onnxruntime_genais_own_generator(folder):
    """The `genai-int4` conversion is the builder's graph as it is (no input the Generator cannot feed), cached like
    the others, refused by the backend; onnxruntime-genai's own greedy generation on it (a peer,
    bench/measure/peers/ort_genai.py), plain and with its n-gram decoding, equals the backend's greedy on the edited
    graph of the same int4 weights (one token per forward)."""
    import onnx

    from bench.measure.peers.ort_genai import OrtGenai
    from specdec.errors import ConfigError

    out = ensure_onnx(folder, "genai-int4", **QUIET)
    assert out == onnx_dir(folder, "genai-int4") and json.loads((out / MARKER).read_text())["recipe"]["variant"] == "genai-int4"
    assert KEEP_INPUT not in {i.name for i in onnx.load(out / "model.onnx", load_external_data=False).graph.input}
    with pytest.raises(ConfigError, match="load one of int4, int8"):
        load_onnx(folder, variant="genai-int4", **QUIET)
    backend = OnnxRuntimeBackend(onnx_dir(folder), pad_steps=True)
    ids = _ids(5, 6).repeat(4)  # repeats: something for an n-gram to find
    state, last = backend.prefill(Prompt(ids), ids, keep=1)
    greedy = [int(last[-1].argmax())]
    while len(greedy) < 12:
        greedy.append(int(backend.forward(state, torch.tensor(greedy[-1:]))[-1].argmax()))
    plain, first = OrtGenai(out, threads=1).generate(ids.tolist(), 12, frozenset())
    ngram, _ = OrtGenai(out, threads=1, ngram=True).generate(ids.tolist(), 12, frozenset())
    assert first is not None and first > 0
    assert plain == greedy and ngram == greedy
