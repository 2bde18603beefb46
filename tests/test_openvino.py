"""The OpenVINO runtime (specdec/backends/openvino.py, specdec/models/convert_openvino.py) on a tiny random
Qwen2 saved as a HF folder: conversion cached, hashed, rebuilt when damaged, refused when its source is;
blocks, steps and crops give one full forward's logits."""
import os
import shutil

import pytest
import torch

pytest.importorskip("openvino")
pytest.importorskip("nncf")

from specdec.backends.hf_causal import HFCausalBackend
from specdec.backends.openvino import OpenVinoBackend
from specdec.backends.prompt import Prompt
from specdec.errors import ModelError
from specdec.models import convert_openvino as conv
from specdec.models.integrity import sha256_of
from specdec.runtime_registry import batch_invariant
from tests.tiny import VOCAB, random_prompt, tiny_causal


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ov") / "qwen2"
    model = tiny_causal("qwen2")
    model.generation_config.eos_token_id = 5
    model.save_pretrained(folder)
    return folder, model


@pytest.fixture(scope="module")
def backend(tiny):
    folder, _ = tiny
    return conv.load_openvino(folder)


def test_conversion_cached_and_hashed(tiny, backend):
    folder, _ = tiny
    out = conv.ir_dir(folder)
    marker = conv.read_marker(out)
    assert marker["recipe"]["weights"] == "int8" and marker["model"]["layers"] == 2
    assert marker["source"]["model.safetensors"]["sha256"] == sha256_of(folder / "model.safetensors")
    for name in (conv.IR_XML, conv.IR_BIN):
        assert marker["files"][name] == {"size": (out / name).stat().st_size, "sha256": sha256_of(out / name)}
    built = (out / conv.IR_BIN).stat().st_mtime_ns
    logs = []
    assert conv.convert(folder, log=logs.append) == out and logs == []  # reused, not converted again
    assert (out / conv.IR_BIN).stat().st_mtime_ns == built
    assert [p.name for p in folder.glob(".openvino-*")] == [".openvino-int8.lock"]  # no temporary folder left behind
    weights = folder / "model.safetensors"
    os.utime(weights, ns=(built, built + 10**9))  # touched, same bytes: hashed, reused, the new mtime recorded
    assert conv.convert(folder, log=logs.append) == out and logs == []
    assert conv.read_marker(out)["source"]["model.safetensors"]["mtime_ns"] == built + 10**9
    assert backend.vocab_size == VOCAB and backend.eos_ids == {5} and backend.memory_bytes > 0
    assert backend.threads == torch.get_num_threads() and not backend.accepts_audio


def _steps(backend, ids, start):
    state, _ = backend.prefill(Prompt(ids[:start]), ids[:start])
    return state, torch.cat([backend.forward(state, ids[i : i + 1]) for i in range(start, ids.numel())])


ROWS_EXACT = pytest.mark.skipif(not batch_invariant("openvino-int8"), reason="OpenVINO's CPU plugin computes a block's "
                                "rows as its steps only on its AVX-512 kernels, and this CPU lacks avx512f")


@ROWS_EXACT
def test_blocks_steps_crops_equal_full(tiny, backend):
    _, model = tiny
    ids = random_prompt(3, 24)
    # The compiled model's first call: a prompt from position 0 with rows attending 16+ keys (the case a CPU
    # plugin bug in Loop bodies got wrong, see convert_openvino._rows_attended).
    _, full = backend.prefill(Prompt(ids), ids, keep=24)  # [24, V] in one forward
    assert full.shape == (24, VOCAB) and full.dtype == torch.float32
    _, reference = HFCausalBackend(model).prefill(Prompt(ids), ids, keep=24)  # torch float32, same weights
    assert ((full - reference).abs().amax(-1) < 0.05 * reference.abs().amax(-1)).all()  # int8 weights, every row
    _, steps = _steps(backend, ids, 6)
    state, first = backend.prefill(Prompt(ids[:6]), ids[:6], keep=2)
    block = backend.forward(state, ids[6:11], keep=3)  # the last 3 rows of a 5-row block
    assert state.length == 11 and block.shape == (3, VOCAB)
    backend.crop(state, 8)  # reject the last 3 and feed another block over them
    again = backend.forward(state, ids[8:24])
    assert state.length == 24
    # rowwise attention + per-row int8 activations: a row's logits do not depend on its block, bit for bit
    for got, want in ((first, full[4:6]), (block, full[8:11]), (again, full[8:24]), (steps, full[6:24])):
        assert torch.equal(got, want)
    assert backend.prefill(Prompt(ids), ids, keep=0)[1] is None
    with pytest.raises(ValueError):
        backend.crop(state, 25)


@ROWS_EXACT
def test_state_grows_past_first_capacity(tiny, backend, monkeypatch):
    monkeypatch.setattr("specdec.backends.openvino.FIRST_CAPACITY", 4)
    ids = random_prompt(5, 12)
    _, full = backend.prefill(Prompt(ids), ids, keep=12)
    state, steps = _steps(backend, ids, 3)
    assert state.keys[0].shape[0] == 16
    assert torch.equal(steps, full[3:])


def test_damaged_source_refused_damaged_ir_or_changed_source_converted_again(tiny, backend, tmp_path):
    folder = tmp_path / "m"
    shutil.copytree(tiny[0], folder)  # with its IR (mtimes kept: reused as is)
    logs = []
    out = conv.convert(folder, log=logs.append)
    assert logs == [] and out == conv.ir_dir(folder)
    first = conv.read_marker(out)
    weights = folder / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelError) as error:
        conv.convert(folder)
    message = str(error.value)
    assert "model.safetensors is truncated" in message and str(weights) in message and "\n" not in message
    weights.write_bytes(data)  # restored (another mtime, same bytes: reused after hashing); now damage the IR
    ir = out / conv.IR_BIN
    ir.write_bytes(ir.read_bytes()[:-16])
    assert conv.convert(folder, log=logs.append) == out
    assert "is damaged (openvino_model.bin has" in logs[0] and conv.read_marker(out)["files"][conv.IR_BIN] == {
        "size": ir.stat().st_size, "sha256": sha256_of(ir)}
    logs.clear()
    tiny_causal("qwen2", seed=2).save_pretrained(folder)  # same sizes, other weights: converted again
    assert conv.convert(folder, log=logs.append) == out
    second = conv.read_marker(out)
    assert any("changed" in line for line in logs)
    assert second["source"]["model.safetensors"]["sha256"] != first["source"]["model.safetensors"]["sha256"]
    assert second["files"][conv.IR_BIN]["sha256"] != first["files"][conv.IR_BIN]["sha256"]
    assert isinstance(conv.open_ir(out), OpenVinoBackend)


def test_a_step_streams_every_weight_but_the_embedding_table(tiny, backend):
    """The calibration's floor: the IR's weights less the table a Gather reads one row of (int8 here, with its
    scales), so more than nothing and less than the file by most of that table."""
    config = tiny[1].config
    embedding = config.vocab_size * config.hidden_size  # int8: one byte each
    assert 0 < backend.streamed_bytes < backend.memory_bytes - embedding // 2  # its scales and shapes aside
