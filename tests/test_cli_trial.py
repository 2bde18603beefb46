"""A new user's mistakes with `specbench predict`, `python -m bench.measure.peers.llama_speculative` and the
runtime peers' settings: each is one `error:` line naming the problem and the fix, exit 2 (Ctrl-C: one
`interrupted:` line, 130), never a traceback. Tiny synthetic inputs only; nothing is built or loaded."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from bench.cli import main
from bench.measure.peers import llama_speculative
from bench.measure.peers.llama_speculative import BINARY_ENV
from bench.measure.peers.runtimes import PeerSettings
from specdec.errors import ConfigError
from tests.test_costmodel import USER, synthetic, write_folder

pytestmark = pytest.mark.subprocess  # see CONTRIBUTING.md: the quick loop leaves these out


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and "Traceback" not in err, err
    return err


# --- specbench predict --------------------------------------------------------------------------
def test_a_folder_that_is_missing_a_file_or_empty_is_named(tmp_path, capsys):
    assert main(["predict", str(tmp_path / "nowhere")]) == 2
    assert "nowhere does not exist" in one_error_line(capsys)
    write_folder(tmp_path / "r", synthetic())
    assert main(["predict", str(tmp_path / "r" / "results.jsonl")]) == 2  # the file, not its folder
    assert f"is a file: give the folder that holds results.jsonl ({tmp_path / 'r'})" in one_error_line(capsys)
    (tmp_path / "empty").mkdir()
    assert main(["predict", str(tmp_path / "empty")]) == 2
    assert "has no results.jsonl" in one_error_line(capsys)
    assert main(["predict", *USER, "--acceptance-from", str(tmp_path / "empty")]) == 2
    assert "has no results.jsonl" in one_error_line(capsys)


def test_a_torn_last_line_is_skipped_and_a_garbage_line_is_named(tmp_path, capsys):
    write_folder(tmp_path / "r", synthetic())
    results = tmp_path / "r" / "results.jsonl"
    whole = results.read_bytes()
    results.write_bytes(whole + b'{"id": "p9", "mode": "sp')  # a sweep killed mid-write
    assert main(["predict", str(tmp_path / "r")]) == 0
    assert "spec points: median |error|" in capsys.readouterr().out
    assert not (tmp_path / "r" / "predictions.csv.partial").exists()
    lines = whole.split(b"\n")
    results.write_bytes(b"\n".join([*lines[:3], b"garbage \x00 here", *lines[3:]]))
    assert main(["predict", str(tmp_path / "r")]) == 2
    assert "results.jsonl line 4 is not a JSON record" in one_error_line(capsys)


def test_flags_of_the_other_mode_are_refused(tmp_path, capsys):
    write_folder(tmp_path / "r", synthetic())
    assert main(["predict", str(tmp_path / "r"), "--colocated-ms-per-token", "5"]) == 2
    assert "not both" in one_error_line(capsys)
    assert main(["predict", *USER, "--acceptance-from", str(tmp_path / "r"), "--cores", "split"]) == 2
    assert "--cores applies to a RESULTS_DIR" in one_error_line(capsys)


@pytest.mark.parametrize("flag, value", [("--colocated-ms-per-token", "-1"), ("--colocated-ms-per-token", "x"),
                                         ("--rtt-ms", "20,,50"), ("--bandwidth-mbps", "inf"),
                                         ("--verify-cost", "20,5,1")])
def test_more_bad_user_numbers_are_one_line(tmp_path, capsys, flag, value):
    write_folder(tmp_path / "r", synthetic())
    assert main(["predict", *USER, flag, value, "--acceptance-from", str(tmp_path / "r")]) == 2
    assert one_error_line(capsys).startswith(f"error: {flag} ")


def test_a_wrong_flag_is_argparses_usage_and_one_error_line(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["predict", "--edge-ms", "10", "--no-such-flag"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert [line for line in err.splitlines() if "error:" in line] == [
        "specbench: error: unrecognized arguments: --no-such-flag"]


# --- python -m bench.measure.peers.llama_speculative ----------------------------------------------------
def test_build_refuses_a_file_as_out_and_a_missing_cmake(tmp_path, capsys, monkeypatch):
    (tmp_path / "file").write_text("x")
    assert llama_speculative.main(["build", "--out", str(tmp_path / "file")]) == 2
    assert "is a file, not a folder" in one_error_line(capsys)
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))  # no cmake on it
    assert llama_speculative.main(["build", "--out", str(tmp_path / "out")]) == 2
    assert "cmake is not on PATH: install cmake" in one_error_line(capsys)
    assert not (tmp_path / "out").exists()  # nothing half-made


@pytest.mark.parametrize("flag, value", [("--threads", "0"), ("--threads", "-2"), ("--max-new-tokens", "many")])
def test_run_refuses_a_count_below_one(capsys, flag, value):
    with pytest.raises(SystemExit) as stop:
        llama_speculative.main(["run", "--target", "t", "--draft", "d", "--prompt", "p", flag, value])
    assert stop.value.code == 2
    assert f"argument {flag}: need a whole number >= 1, got {value!r}" in capsys.readouterr().err


def fake_example(tmp_path: Path, body: str) -> Path:
    """An executable standing in for the example binary (a shell script: nothing is built)."""
    binary = tmp_path / "llama-speculative-simple"
    binary.write_text(f"#!/bin/sh\n{body}\n")
    binary.chmod(0o755)
    return binary


def test_run_names_a_missing_gguf_and_a_failing_example(tmp_path, capsys):
    binary = fake_example(tmp_path, 'echo "gguf_init: failed to load model" >&2; exit 1')
    (tmp_path / "d.gguf").write_bytes(b"")
    args = ["run", "--binary", str(binary), "--draft", str(tmp_path / "d.gguf"), "--prompt", "hi"]
    assert llama_speculative.main([*args, "--target", str(tmp_path / "t.gguf")]) == 2
    assert "--target" in (err := one_error_line(capsys)) and "is not a file" in err
    assert llama_speculative.main([*args, "--target", str(tmp_path / "d.gguf")]) == 2
    assert "exited with 1: gguf_init: failed to load model (check" in one_error_line(capsys)


def test_ctrl_c_mid_run_is_one_line_and_130(tmp_path):
    """The stand-in interrupts its parent the way a terminal's Ctrl-C does, then waits to be stopped.

    A terminal's Ctrl-C reaches a foreground process, whose SIGINT is at its default. A suite started
    with SIGINT ignored (a background job of a script, `cmd &`, as a run beside a busy core may be)
    passed that on to the child, whose Python then installs no KeyboardInterrupt: the child slept its
    30 s and failed. So the child starts here with SIGINT at its default whatever launched pytest (a
    Python handler in the parent becomes SIG_DFL across exec)."""
    binary = fake_example(tmp_path, "kill -INT $PPID; exec sleep 30")  # exec: the parent's kill stops the sleep too
    (tmp_path / "m.gguf").write_bytes(b"")
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        done = subprocess.run([sys.executable, "-m", "bench.measure.peers.llama_speculative", "run", "--binary", str(binary),
                               "--target", str(tmp_path / "m.gguf"), "--draft", str(tmp_path / "m.gguf"), "--prompt", "hi"],
                              capture_output=True, text=True, timeout=60, env={**os.environ, BINARY_ENV: ""})
    finally:
        signal.signal(signal.SIGINT, before)
    assert done.returncode == 130 and done.stderr.strip() == "interrupted: nothing written", done.stderr


# --- the runtime peers' settings (bench/test_bench_peer_runtimes.py reads them) -----------------------
@pytest.mark.parametrize("variable, value", [("SPECBENCH_PEER_PROMPTS", "0"), ("SPECBENCH_PEER_TOKENS", "-5"),
                                             ("SPECBENCH_PEER_THREADS", "two"), ("SPECBENCH_PEER_TOKENS", "4.5")])
def test_peer_settings_refuse_a_bad_count_naming_the_variable(variable, value):
    with pytest.raises(ConfigError, match=f"^{variable}='?{value}'?: need a whole number >= 1, e.g. {variable}="):
        PeerSettings.from_env({variable: value})


def test_peer_settings_read_their_defaults_and_values(tmp_path):
    assert PeerSettings.from_env({}) == PeerSettings(3, 48, 2, Path("runs/peer_runtimes.jsonl"))
    read = PeerSettings.from_env({"SPECBENCH_PEER_THREADS": " 1 ", "SPECBENCH_PEER_JSONL": str(tmp_path / "t.jsonl")})
    assert (read.threads, read.sink) == (1, tmp_path / "t.jsonl")
    with pytest.raises(ConfigError, match="is a folder: give a file path"):
        PeerSettings.from_env({"SPECBENCH_PEER_JSONL": str(tmp_path)})


@pytest.mark.parametrize("line", ['{"id": "x", "mode": "spec"}', '{"id": "x", "mode": "spec", "status": "ok", "k": 2}'])
def test_a_json_line_that_is_no_result_record_is_named(tmp_path, capsys, line):
    """Valid JSON with an id and a mode (another tool's JSONL pasted in): the summary would fail deep inside."""
    write_folder(tmp_path / "r", synthetic())
    with (tmp_path / "r" / "results.jsonl").open("a") as f:
        f.write(line + "\n")
    count = len(synthetic()) + 1
    assert main(["predict", str(tmp_path / "r")]) == 2
    assert f"record {count} (id 'x') has no 'text' field" in one_error_line(capsys)
    assert main(["predict", *USER, "--acceptance-from", str(tmp_path / "r")]) == 2
    assert f"record {count} (id 'x') has no 'text' field" in one_error_line(capsys)


def test_an_empty_results_file_says_so(tmp_path, capsys):
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "results.jsonl").write_bytes(b"")
    assert main(["predict", str(tmp_path / "r")]) == 2
    assert "holds no finished record" in one_error_line(capsys)
