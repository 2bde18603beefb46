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
from bench.measure.sweep.sweep_config import SweepConfig
from specdec.errors import ConfigError

pytestmark = pytest.mark.subprocess  # see CONTRIBUTING.md: the quick loop leaves these out


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
    # cloud + inproc spec + split spec x 2 links x 2 overlap settings + their co-located point = 7 points x 3 prompts
    assert len(rows) == 21 and all(r["status"] == "ok" for r in rows)
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
    # the split point and its co-located baseline, 3 prompts each
    assert after[: len(before)] == before and len([r for r in after if r["status"] == "ok"]) == 6
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
    ({"deployment": ("cluster",)}, "unknown deployment 'cluster': use one of inproc, split, colocated"),
    ({"deployment": ("split",), "link": ("3g",)}, "unknown network '3g'"),
    ({"cloud_cores": 64}, "--cloud-cores must be between 1 and"),
    ({"overlap": ("maybe",)}, "overlap must be a list of auto/true/false values"),
    ({"deployment": ("split",), "edge_cores": 2, "cloud_cores": 1}, "do not fit this machine's 2 cores without sharing"),
    ({"deployment": ("split",), "edge_cores": 2}, "a server on 0 cores do not fit this machine's 2 cores"),
    ({"deployment": ("split",), "split_cores": "apart"}, "unknown split_cores 'apart': use one of disjoint, shared"),
])
def test_bad_split_settings_are_refused_before_anything_runs(changes, message):
    with pytest.raises(ConfigError, match=message):
        SweepConfig.from_mapping({"edge": "e", "cloud": "c", "mode": ("spec",), **changes})


def test_split_points_get_disjoint_cores_and_a_co_located_baseline(pair, prompts, tmp_path):
    """By default a split point's edge and server run on cores of their own (on this 2-core machine
    core 0 and core 1), the cloud-only and co-located points on the server's; every record says so,
    and the summary gives each split point its speed-up against its co-located point."""
    out = tmp_path / "c"
    assert main(sweep_args(pair, prompts, out, "--mode", "cloud,spec", "--deployment", "split", "--overlap", "false")) == 0
    rows = ResultsFile(out / "results.jsonl").read()
    by_deployment = {(r["mode"], r["deployment"]): r for r in rows}
    assert set(by_deployment) == {("cloud", "inproc"), ("spec", "split"), ("spec", "colocated")}
    cloud = {r["id"]: r["tokens"] for r in rows if r["mode"] == "cloud"}
    assert all(r["tokens"] == cloud[r["id"]] for r in rows)  # greedy, every block verified
    cores = sorted(os.sched_getaffinity(0))
    edge_ids, cloud_ids = ",".join(map(str, cores[:len(cores) // 2])), ",".join(map(str, cores[len(cores) // 2:]))
    assert all(r["split_cores"] == "disjoint" and r["cloud_cores"] == cloud_ids for r in rows)
    assert {(r["mode"], r["deployment"], r["cores"]) for r in rows} == {
        ("cloud", "inproc", cloud_ids), ("spec", "split", edge_ids), ("spec", "colocated", cloud_ids)}
    colocated = by_deployment[("spec", "colocated")]
    assert colocated["link"] is None and colocated["overlap"] is None and colocated["k"] == 3
    import pandas as pd
    summary = pd.read_csv(out / "summary.csv")
    split = summary[summary["deployment"] == "split"].iloc[0]
    beside = summary[summary["deployment"] == "colocated"].iloc[0]
    assert split["speedup_vs_colocated"] == pytest.approx(split["tokens_per_s"] / beside["tokens_per_s"])
    assert split["speedup_vs_colocated_ci_low"] <= split["speedup_vs_colocated_ci_high"]
    assert split["split_cores"] == "disjoint" and summary["speedup_vs_colocated"].notna().sum() == 1


def test_shared_cores_are_today_s_placement_and_say_so(pair, prompts, tmp_path):
    out = tmp_path / "h"
    assert main(sweep_args(pair, prompts, out, "--mode", "spec", "--deployment", "split", "--overlap", "false",
                           "--split-cores", "shared", "--limit", "1")) == 0
    rows = ResultsFile(out / "results.jsonl").read()
    every = ",".join(map(str, sorted(os.sched_getaffinity(0))))
    assert {(r["deployment"], r["split_cores"], r["cores"]) for r in rows} == {("split", "shared", every),
                                                                                ("colocated", "shared", every)}


def test_a_folder_from_before_placements_resumes_as_shared_or_is_refused_in_one_line(pair, prompts, tmp_path, capsys):
    """A folder written before `split_cores` and the co-located points existed: the default (disjoint
    cores, overlap auto) is another configuration, refused in one line naming what differs; with the
    settings that reproduce it (shared cores, overlap true) it resumes and gains its co-located points."""
    import json
    out = tmp_path / "old"
    old = sweep_args(pair, prompts, out, "--mode", "spec", "--deployment", "split", "--limit", "1")
    assert main([*old, "--split-cores", "shared", "--overlap", "true"]) == 0
    identity = json.loads((out / "sweep.json").read_text())
    del identity["config"]["split_cores"]  # as written before the setting existed
    (out / "sweep.json").write_text(json.dumps(identity))
    rows = [r for r in ResultsFile(out / "results.jsonl").read() if r["deployment"] == "split"]
    for row in rows:
        for name in ("split_cores", "cloud_cores", "cores"):
            del row[name]
    (out / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    capsys.readouterr()
    assert main(old) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "split_cores" in error[0] and "overlap" in error[0]
    assert main([*old, "--split-cores", "shared", "--overlap", "true"]) == 0
    after = ResultsFile(out / "results.jsonl").read()
    assert after[:1] == rows and {r["deployment"] for r in after} == {"split", "colocated"}
