"""A runtime is one declaration: a toy runtime declared in tests/toy_runtime.py, outside specdec and named by nothing
else, runs through `run`, `sweep` and `calibrate` (its name and its old name taken by every flag, its rows and its
calibration entry recorded under its name), and the registry refuses a name declared twice."""
from __future__ import annotations

import sys

import pytest

from bench.cli import main
from bench.core.records import ResultsFile
from bench.measure import calibrate
from specdec import runtime_registry as runtimes
from specdec.errors import ConfigError
from specdec.runtime_registry import PLUGINS, Runtime

pytestmark = pytest.mark.subprocess  # the sweep and the calibration spawn workers


@pytest.fixture
def toy(monkeypatch, tmp_path):
    monkeypatch.setenv(PLUGINS, "tests.toy_runtime")  # spawned workers import it as this process does
    monkeypatch.setenv("SPECBENCH_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(calibrate, "bandwidth_bytes", lambda: 1 << 24)
    from tests import toy_runtime

    runtimes.register(toy_runtime.RUNTIME)  # (again, where an earlier test imported and forgot it)
    yield toy_runtime.NAME
    runtimes.unregister(toy_runtime.NAME)
    sys.modules.pop("tests.toy_runtime", None)


def rows(out) -> list[dict]:
    return ResultsFile(out / "results.jsonl").read()


def test_a_toy_runtime_runs_through_run_sweep_and_calibrate(toy, pair, prompts, tmp_path, capsys):
    common = ["--prompts", prompts, "--max-new-tokens", "4", "--dtype", "float32"]
    # run: by its old name, recorded under its name; torch in float32 is what it runs, token for token
    assert main(["run", "--mode", "cloud", "--cloud", pair["cloud"], "--cloud-runtime", "toy", *common,
                 "--out", str(tmp_path / "toy")]) == 0
    assert main(["run", "--mode", "cloud", "--cloud", pair["cloud"], *common, "--out", str(tmp_path / "torch")]) == 0
    toy_rows, torch_rows = rows(tmp_path / "toy"), rows(tmp_path / "torch")
    assert {r["cloud_runtime"] for r in toy_rows} == {toy} and all(r["status"] == "ok" for r in toy_rows)
    assert [r["tokens"] for r in toy_rows] == [r["tokens"] for r in torch_rows]
    # sweep: the toy as the spec point's verifier and as its plain decoding, in spawned workers
    assert main(["sweep", "--edge", pair["edge"], "--cloud", pair["cloud"], *common, "--mode", "cloud,spec",
                 "--cloud-runtime", toy, "--plain-runtimes", toy, "--policy", "greedy", "--entropy-threshold", "0",
                 "--k", "2", "--out", str(tmp_path / "sweep")]) == 0
    swept = rows(tmp_path / "sweep")
    assert swept and all(r["status"] == "ok" and r["cloud_runtime"] == toy for r in swept)
    cloud = {r["id"]: r["tokens"] for r in swept if r["mode"] == "cloud"}
    assert all(r["tokens"] == cloud[r["id"]] for r in swept if r["mode"] == "spec")  # greedy: lossless
    # calibrate: measured in a spawned child, which knows the toy through SPECBENCH_RUNTIMES
    capsys.readouterr()
    assert main(["calibrate", "--models", pair["cloud"], "--runtimes", toy, "--threads", "1", "--rounds", "1"]) == 0
    [entry] = calibrate.read_calibration(calibrate.calibration_path(calibrate.fingerprint()["machine_class"]))["entries"]
    assert (entry["runtime"], entry["error"]) == (toy, None) and entry["step_ms"] > 0
    assert any(line.startswith(f"{toy} | {pair['cloud']} | 1 | ") for line in capsys.readouterr().out.splitlines())


def test_an_unknown_runtime_flag_is_the_flags_fault_in_one_short_line(pair, prompts, tmp_path, capsys):
    """Given with a config file, a bad --cloud-runtime is named as the flags' (the file was blamed), before anything
    is calibrated, and its choices are the runtimes' names and PLAIN+BLOCKS (every pair was spelled out)."""
    config = tmp_path / "grid.toml"
    config.write_text(f'edge = "{pair["edge"]}"\ncloud = "{pair["cloud"]}"\nprompts = ["{prompts}"]\n')
    assert main(["sweep", "--config", str(config), "--cloud-runtime", "onnx-int9", "--out", str(tmp_path / "s")]) == 2
    [error] = capsys.readouterr().err.strip().splitlines()
    assert error.startswith("error: the sweep options: unknown cloud_runtime 'onnx-int9': use one of torch, ")
    assert error.endswith(", PLAIN+BLOCKS") and len(error) < 250 and str(config) not in error


def test_a_name_declared_twice_is_refused():
    with pytest.raises(ValueError, match="'vnni-int4' is declared twice"):
        runtimes.register(Runtime("fresh", "nothing", loader=print, aliases=("vnni-int4",)))
    assert "fresh" not in runtimes.names()


def test_a_plugin_module_that_cannot_be_imported_is_one_line(monkeypatch):
    monkeypatch.setenv(PLUGINS, "no_such_runtime_module")
    monkeypatch.setattr(runtimes, "_DISCOVERED", [])  # as a fresh process reads the declarations
    with pytest.raises(ConfigError, match=r"^SPECBENCH_RUNTIMES names 'no_such_runtime_module', which cannot be "
                                          r"imported \(.*\): fix the name or unset SPECBENCH_RUNTIMES$"):
        runtimes.names()
