"""The cached-artifact rule (specdec/models/artifact.py) once for each of its three users: every case runs
through the converter's own entry point (ensure_onnx, convert_openvino.convert, ensure_whisper) on a tiny
fake source folder, with the converter's `_build` replaced by a fake that writes the files its build makes
(no weights, no builder, no network). First build: the marker written last, nothing left beside it but the
lock; a second call reuses; a missing or damaged marker and a damaged artifact file are rebuilt; a damaged
source is refused in one line; two callers at once build once; a build that fails leaves what was in place."""
from __future__ import annotations

import importlib.util
import json
import os
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import NamedTuple

import numpy as np
import pytest
from safetensors.numpy import save_file

from specdec.errors import ModelError
from specdec.models import artifact, convert_ct2, convert_onnx, convert_openvino, integrity, registry


def _hf_folder(root: Path) -> Path:
    folder = root / "tiny-hf"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    save_file({"weight": np.arange(16, dtype=np.float32)}, str(folder / "model.safetensors"))
    return folder


def _ct2_folder(root: Path) -> Path:
    folder = root / "tiny-ct2"
    folder.mkdir()
    (folder / "model.bin").write_bytes(bytes(range(64)))
    (folder / "config.json").write_text(json.dumps({"suppress_ids": []}))
    (folder / "tokenizer.json").write_text("{}")
    return folder


def _missing(*modules: str):
    absent = [m for m in modules if importlib.util.find_spec(m) is None]
    return pytest.mark.skipif(bool(absent), reason=f"{', '.join(absent)} not installed")


class Case(NamedTuple):
    module: ModuleType  # the converter
    make_source: Callable[[Path], Path]  # a tiny source folder under the given root
    entry: Callable[..., Path]  # its entry point: (source, log, hashes) -> the artifact's folder
    folder: Callable[[Path], Path]  # where the artifact of a source lives
    outputs: tuple[str, ...]  # the files its build makes


CASES = {
    "onnx": Case(convert_onnx, _hf_folder,
                 lambda source, log, hashes: convert_onnx.ensure_onnx(source, log=log, verify=hashes),
                 convert_onnx.onnx_dir, ("model.onnx", "model.onnx.data", "genai_config.json")),
    "openvino": Case(convert_openvino, _hf_folder,
                     lambda source, log, hashes: convert_openvino.convert(source, log=log, hashes=hashes),
                     convert_openvino.ir_dir, (convert_openvino.IR_XML, convert_openvino.IR_BIN)),
    "ct2": Case(convert_ct2, _ct2_folder,
                lambda source, log, hashes: convert_ct2.ensure_whisper(source, log=log, hashes=hashes),
                convert_ct2.hf_dir, ("model.safetensors", "config.json", "tokenizer.json")),
}
SKIPS = {"onnx": _missing("onnxruntime_genai", "onnxruntime", "onnx", "onnx_ir"),
         "openvino": _missing("openvino", "nncf")}


class Converter:
    """One converter on a fake source folder, its builds counted (and, through `during`, interrupted)."""

    def __init__(self, case: Case, root: Path, monkeypatch) -> None:
        self.case, self.outputs = case, case.outputs
        self.source = case.make_source(root)
        self.folder = case.folder(self.source)
        self.builds: list[Path] = []
        self.during: Callable[[Path], None] | None = None  # called with the build's folder once its files are written
        monkeypatch.setattr(case.module, "_build", self._fake_build)

    def _fake_build(self, *args) -> dict:
        tmp = args[-1]  # every converter's _build(source, option, tmp)
        self.builds.append(tmp)
        for name in self.outputs:
            if name.endswith(".safetensors"):  # whole: the artifact's headers are checked too
                save_file({"weight": np.full(8, len(self.builds), dtype=np.float32)}, str(tmp / name))
            else:
                (tmp / name).write_bytes(f"{name} of build {len(self.builds)}\n".encode() * 4)
        if self.during is not None:
            self.during(tmp)
        return {}

    def ensure(self, hashes: bool = False) -> tuple[Path, list[str]]:
        logs: list[str] = []
        return self.case.entry(self.source, logs.append, hashes), logs

    def marker(self) -> dict:
        return json.loads((self.folder / artifact.MARKER).read_text())

    def hidden(self) -> set[str]:
        return {p.name for p in self.source.iterdir() if p.name.startswith(".")}


@pytest.fixture(params=[pytest.param(name, marks=SKIPS.get(name, ())) for name in CASES])
def conv(request, tmp_path, monkeypatch) -> Converter:
    return Converter(CASES[request.param], tmp_path, monkeypatch)


def test_first_build_writes_the_marker_last_and_a_second_call_reuses(conv):
    seen = []
    conv.during = lambda tmp: seen.append((conv.folder.exists(), (tmp / artifact.MARKER).exists()))
    folder, logs = conv.ensure()
    assert folder == conv.folder and len(conv.builds) == 1
    assert seen == [(False, False)]  # while building: nothing in place, no marker yet
    marker = conv.marker()
    assert set(marker["files"]) == set(conv.outputs)
    assert marker["files"] == integrity.record(folder, skip=(artifact.MARKER,))  # hashed the files' final bytes
    assert set(marker["source"]) >= {"config.json"} and marker["recipe"]
    assert conv.hidden() == {f".{folder.name}.lock"}  # no temporary folder; the lock file stays (artifact.locked)
    assert any("building" in line for line in logs)

    stamps = {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}
    assert conv.ensure(hashes=True) == (folder, [])  # reused: no build, no message
    assert len(conv.builds) == 1 and {p.name: p.stat().st_mtime_ns for p in folder.iterdir()} == stamps
    config = conv.source / "config.json"
    os.utime(config, ns=(config.stat().st_atime_ns, config.stat().st_mtime_ns + 10**9))  # touched, same bytes
    assert conv.ensure() == (folder, []) and len(conv.builds) == 1
    assert conv.marker()["source"]["config.json"]["mtime_ns"] == config.stat().st_mtime_ns  # no hashing next time


@pytest.mark.parametrize("damage", ["deleted", "not json", "no files", "another recipe"])
def test_a_missing_or_damaged_marker_is_rebuilt(conv, damage):
    folder, _ = conv.ensure()
    marker_path = folder / artifact.MARKER
    if damage == "deleted":
        marker_path.unlink()
    elif damage == "not json":
        marker_path.write_text(marker_path.read_text()[:20])
    elif damage == "no files":
        marker_path.write_text(json.dumps({**conv.marker(), "files": None}))
    else:
        marker_path.write_text(json.dumps({**conv.marker(), "recipe": {**conv.marker()["recipe"], "format": -1}}))
    again, logs = conv.ensure()
    assert again == folder and len(conv.builds) == 2 and "building it again" in logs[0]
    assert conv.marker()["files"] == integrity.record(folder, skip=(artifact.MARKER,))
    assert conv.ensure() == (folder, []) and len(conv.builds) == 2


@pytest.mark.parametrize("hashes", [True, False])
def test_a_damaged_artifact_file_is_rebuilt(conv, hashes):
    folder, _ = conv.ensure()
    damaged = folder / conv.outputs[-1]
    data = damaged.read_bytes()
    if hashes:  # other bytes, same size: found by the sha256s
        damaged.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    else:  # another size: found at every use
        damaged.write_bytes(data[: len(data) // 2])
    again, logs = conv.ensure(hashes=hashes)
    assert again == folder and len(conv.builds) == 2
    assert "is damaged" in logs[0] and damaged.name in logs[0]
    assert not integrity.problems(folder, conv.marker()["files"], hashes=True)


def test_other_bytes_of_the_same_size_pass_a_size_only_check(conv):
    """Without hashes only sizes are compared: the rule's documented cost, not a rebuild."""
    folder, _ = conv.ensure()
    damaged = folder / conv.outputs[0]
    data = damaged.read_bytes()
    damaged.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    assert conv.ensure(hashes=False) == (folder, []) and len(conv.builds) == 1


def test_a_damaged_source_is_refused_in_one_line(conv):
    registry_marker = conv.source / registry.MARKER  # as a fetched model folder has: its files' sizes and sha256s
    registry_marker.write_text(json.dumps({"files": integrity.record(conv.source)}))
    folder, _ = conv.ensure()
    before = conv.marker()
    victim = max((p for p in conv.source.iterdir() if p.is_file() and p.name != registry.MARKER
                  and not p.name.startswith(".")), key=lambda p: p.stat().st_size)
    victim.write_bytes(victim.read_bytes()[:-4])
    with pytest.raises(ModelError) as error:
        conv.ensure()
    message = str(error.value)
    assert "\n" not in message and str(victim) in message and "restore that file" in message
    assert len(conv.builds) == 1 and conv.marker() == before  # nothing built from it, the artifact left alone


def test_two_callers_at_once_build_once(conv):
    lock = conv.folder.with_name(f".{conv.folder.name}.lock")
    conv.during = lambda tmp: _wait_for_a_waiter(lock)  # the second caller is blocked on the lock meanwhile
    results, errors = [], []

    def call():
        try:
            results.append(conv.ensure()[0])
        except BaseException as e:
            errors.append(e)

    first = threading.Thread(target=call)
    first.start()
    while not conv.builds and first.is_alive():  # the first caller holds the lock and builds
        time.sleep(0.01)
    second = threading.Thread(target=call)
    second.start()
    first.join()
    second.join()
    assert errors == [] and results == [conv.folder, conv.folder] and len(conv.builds) == 1


def _wait_for_a_waiter(lock: Path, limit_s: float = 30.0) -> None:
    """Return once some caller is blocked on an flock of `lock` (a "->" line of /proc/locks for its inode)."""
    inode = os.stat(lock).st_ino
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        for line in Path("/proc/locks").read_text().splitlines():
            fields = line.split()
            if "->" in fields and "FLOCK" in fields and fields[-3].endswith(f":{inode}"):
                return
        time.sleep(0.01)
    raise AssertionError(f"no second caller waited on {lock}: ensure does not lock")


def test_a_build_that_fails_leaves_what_was_in_place(conv):
    def crash(tmp):
        raise RuntimeError("killed mid-build")

    conv.during = crash
    with pytest.raises(RuntimeError):
        conv.ensure()
    assert not conv.folder.exists() and conv.hidden() == {f".{conv.folder.name}.lock"}  # no half artifact anywhere

    conv.during = None
    folder, _ = conv.ensure()
    whole = conv.marker()
    config = conv.source / "config.json"
    config.write_text(config.read_text().replace("}", ', "changed": true}'))  # a rebuild is due ...
    conv.during = crash
    with pytest.raises(RuntimeError):  # ... and fails: the previous artifact stays in place, whole
        conv.ensure()
    assert conv.marker() == whole and not integrity.problems(folder, whole["files"], hashes=True)
    assert conv.hidden() == {f".{folder.name}.lock"}

    for leftover in (".tmp", ".old"):  # what a killed process (no `finally`) leaves: cleared by the next build
        junk = folder.with_name(f".{folder.name}{leftover}")
        junk.mkdir()
        (junk / conv.outputs[0]).write_text("half")
    conv.during = None
    again, logs = conv.ensure()
    assert again == folder and "changed" in logs[0] and conv.marker()["source"]["config.json"]["sha256"] == \
        integrity.sha256_of(config)
    assert conv.hidden() == {f".{folder.name}.lock"}


def test_a_registry_folder_is_repaired_by_fetching_it_again(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_HOME", str(tmp_path))
    alias = next(entry.alias for entry in registry.list_models() if not entry.base)
    folder = registry.model_dir(alias)
    assert artifact.repair_hint(folder) == f"run `specbench models fetch {alias}` to fetch it again"
    assert artifact.repair_hint(tmp_path / "elsewhere" / alias) == "restore that file"


@pytest.mark.parametrize("fields, message", [
    (dict(inputs=()), "reads no files: name its inputs"),
    (dict(name=".hidden"), "a plain name inside its model folder, got '.hidden'"),
    (dict(recipe={"files": 1}), "recipe keys ['files'] are the marker's own"),
])
def test_a_bad_artifact_is_refused(tmp_path, fields, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        artifact.Artifact(**{**dict(source=tmp_path, name="out", inputs=("config.json",), recipe={}), **fields})
