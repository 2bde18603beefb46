"""Sweeps over the split deployment: the sweep starts the verifier server and the shaped links
itself, split points reproduce in-process and cloud-only tokens, records carry what crossed and
the measured link time beside the modelled one, and nothing is left running afterwards, not even
after an interrupted sweep."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from bench.cli import main
from bench.core.records import ResultsFile
from bench.measure.sweep_config import SweepConfig
from specdec.errors import ConfigError


def servers_of(model_dir: str) -> list[psutil.Process]:
    """Every `specbench serve` process of this model still alive on the machine."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        cmdline = process.info["cmdline"] or []
        if "serve" in cmdline and model_dir in cmdline:
            found.append(process)
    return found


def sweep_args(pair, prompts, out, *extra) -> list[str]:
    return ["sweep", "--edge", pair["edge"], "--cloud", pair["cloud"], "--prompts", prompts, "--out", str(out),
            "--max-new-tokens", "8", "--dtype", "float32", "--policy", "greedy", "--entropy-threshold", "0",
            "--k", "3", *map(str, extra)]


def test_split_points_equal_in_process_and_record_the_link(pair, prompts, tmp_path):
    out = tmp_path / "s"
    assert main(sweep_args(pair, prompts, out, "--mode", "cloud,spec", "--deployment", "inproc,split",
                           "--link", "none,rtt=20ms,up=20mbit,down=50mbit", "--overlap", "true,false")) == 0
    rows = ResultsFile(out / "results.jsonl").read()
    # cloud + inproc spec + split spec x 2 links x 2 overlap settings = 6 points x 3 prompts
    assert len(rows) == 18 and all(r["status"] == "ok" for r in rows)
    cloud = {r["id"]: r["tokens"] for r in rows if r["mode"] == "cloud"}
    for r in rows:
        assert r["tokens"] == cloud[r["id"]]  # greedy, every block verified: lossless everywhere
    split = [r for r in rows if r["deployment"] == "split"]
    assert {(r["link"], r["overlap"]) for r in split} == {("none", True), ("none", False),
                                                          ("rtt=20ms,up=20mbit,down=50mbit", True),
                                                          ("rtt=20ms,up=20mbit,down=50mbit", False)}
    for r in split:
        assert r["wire_up_bytes"] > 0 and r["wire_down_bytes"] > 0 and r["server_compute_s"] > 0
        assert r["network"] == r["link"]  # modelled on the link it really crossed
        if r["link"] != "none":
            assert r["link_s"] >= 0.02 * r["cloud_calls"] and r["network_s"] >= 0.02 * r["cloud_calls"]
    inproc = [r for r in rows if r["mode"] == "spec" and r["deployment"] == "inproc"]
    assert all(r["link"] is None and r["overlap"] is None and r["wire_up_bytes"] is None for r in inproc)
    summary = (out / "summary.csv").read_text().splitlines()
    assert "link_s_mean" in summary[0] and "network_s_mean" in summary[0] and "deployment" in summary[0]
    assert not servers_of(pair["cloud"])  # the sweep stopped its server


def test_an_interrupted_split_sweep_leaves_no_server_and_resumes(pair, prompts, tmp_path):
    out = tmp_path / "i"
    args = sweep_args(pair, prompts, out, "--mode", "spec", "--deployment", "split", "--link",
                      "rtt=300ms,up=20mbit,down=50mbit", "--max-new-tokens", "12")
    process = subprocess.Popen([sys.executable, "-m", "bench.cli", *args], stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not servers_of(pair["cloud"]):
        time.sleep(0.1)
    assert servers_of(pair["cloud"]), "the sweep never started its server"
    while time.monotonic() < deadline and not (out / "results.jsonl").exists():
        time.sleep(0.1)
    process.send_signal(signal.SIGINT)  # Ctrl-C in the middle of the points
    assert process.wait(60) == 130
    assert "interrupted" in process.stderr.read()
    deadline = time.monotonic() + 10
    while servers_of(pair["cloud"]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not servers_of(pair["cloud"])
    before = ResultsFile(out / "results.jsonl").read()
    assert main(args) == 0  # resumes: what was written stays, the rest is done
    after = ResultsFile(out / "results.jsonl").read()
    assert after[: len(before)] == before and len([r for r in after if r["status"] == "ok"]) == 3
    assert not servers_of(pair["cloud"])


def test_a_killed_sweep_takes_its_server_with_it(pair, prompts, tmp_path):
    """SIGKILL leaves no chance to clean up: the server dies with its parent (PR_SET_PDEATHSIG)."""
    out = tmp_path / "k"
    args = sweep_args(pair, prompts, out, "--mode", "spec", "--deployment", "split", "--link",
                      "rtt=300ms,up=20mbit,down=50mbit", "--max-new-tokens", "12")
    process = subprocess.Popen([sys.executable, "-m", "bench.cli", *args], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not servers_of(pair["cloud"]):
        time.sleep(0.1)
    assert servers_of(pair["cloud"])
    os.kill(process.pid, signal.SIGKILL)
    process.wait(10)
    deadline = time.monotonic() + 15
    while servers_of(pair["cloud"]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not servers_of(pair["cloud"])


@pytest.mark.parametrize("changes, message", [
    ({"deployment": ("cluster",)}, "unknown deployment 'cluster': use one of inproc, split"),
    ({"deployment": ("split",), "link": ("3g",)}, "unknown network '3g'"),
    ({"cloud_cores": 64}, "--cloud-cores must be between 1 and"),
    ({"overlap": ("maybe",)}, "overlap must be a list of true/false values"),
])
def test_bad_split_settings_are_refused_before_anything_runs(changes, message):
    with pytest.raises(ConfigError, match=message):
        SweepConfig.from_mapping({"edge": "e", "cloud": "c", "mode": ("spec",), **changes})
