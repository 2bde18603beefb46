"""`specbench fleet` on the tiny pair (fp32, loopback): replayed edges re-send a recorded split run
and every verdict matches the recording at every fleet size; cloud-only serving of the same
clients returns the recorded tokens; real edge processes produce the cloud's greedy tokens; the
records, levels, forwards and summary hold what the issue names; a killed fleet resumes with its
finished levels untouched; bad input is one line."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest
import torch

from bench.cli import main
from bench.derive.fleet_summary import cost_curve, read_fleet
from bench.measure.caps import pin_cores
from specdec.models.loading import load_model
from specdec.remote.background import BackgroundServer
from specdec.remote.server_config import ServeConfig
from tests.recording import record_split

pytestmark = pytest.mark.server  # see CONTRIBUTING.md: the quick loop leaves these out

SETTINGS = ["--dtype", "float32", "--policy", "greedy", "--entropy-threshold", "0", "--k", "3", "--max-new-tokens", "12"]
SUMMARY_COLUMNS = ("clients", "server_accepted_tokens_per_s", "server_verified_tokens_per_s", "edge_tokens_per_s_p50",
                   "edge_tokens_per_s_p90", "verify_latency_p50_s", "verify_latency_p99_s", "mean_batch_size",
                   "cloud_busy_fraction", "batch_hist")


@pytest.fixture(scope="module")
def server(pair):
    background = BackgroundServer(load_model(pair["cloud"], "float32"), ServeConfig(max_batch=8, batch_window_ms=5))
    with background as url:
        yield url


@pytest.fixture(scope="module")
def recording(pair, prompts, server, tmp_path_factory):
    """A split run of the prompts: what replayed edges replay."""
    return record_split(pair["edge"], server, prompts, tmp_path_factory.mktemp("recording"), SETTINGS)


def fleet(*args: str) -> int:
    return main(["fleet", *args, *SETTINGS])


def test_replayed_fleet_matches_the_recording_and_summarizes(pair, prompts, server, recording, tmp_path):
    out = tmp_path / "fleet"
    assert fleet("--edge-replay", str(recording), "--cloud-url", server, "--prompts", prompts, "--clients", "1,3",
                 "--out", str(out)) == 0
    records, levels, batches = read_fleet(out)
    assert sorted((lv["mode"], lv["clients"]) for lv in levels) == [("cloud", 1), ("cloud", 3), ("spec", 1), ("spec", 3)]
    assert len(records) == 2 * (1 + 3) * 3 and all(r["status"] == "ok" for r in records)
    spec = [r for r in records if r["mode"] == "spec"]
    cloud = [r for r in records if r["mode"] == "cloud"]
    # Every verdict equals the recorded one, alone and in batches; cloud-only returns the recorded tokens.
    assert all(r["replay_mismatches"] == 0 and r["verifies"] > 0 for r in spec)
    assert all(r["tokens_match"] for r in cloud)
    recorded = {json.loads(line)["id"]: json.loads(line) for line in (recording / "results.jsonl").read_text().splitlines()}
    assert all(r["new_tokens"] == recorded[r["id"]]["new_tokens"] for r in records)
    assert sorted({(r["clients"], r["client"]) for r in spec}) == [(1, 0), (3, 0), (3, 1), (3, 2)]
    # Three clients at once shared forwards; one never did.
    three = [b for b in batches if b["clients"] == 3]
    assert max(b["rows"] for b in three) >= 2 and all(b["rows"] == 1 for b in batches if b["clients"] == 1)
    summary = pd.read_csv(out / "summary.csv")
    assert set(SUMMARY_COLUMNS) <= set(summary.columns)
    assert sorted(zip(summary["mode"], summary["clients"])) == [("cloud", 1), ("cloud", 3), ("spec", 1), ("spec", 3)]
    row = summary[(summary["mode"] == "spec") & (summary["clients"] == 3)].iloc[0]
    assert row["server_accepted_tokens_per_s"] > 0 and 1 <= row["mean_batch_size"] <= 3
    assert 0 < row["cloud_busy_fraction"] <= 1 and row["verify_latency_p99_s"] >= row["verify_latency_p50_s"]
    assert sum(json.loads(row["batch_hist"])) == len([b for b in three if b["mode"] == "spec"])
    assert row["edge_tokens_per_s_p90"] <= row["edge_tokens_per_s_p50"]  # the rate 90 % reach is the lower one
    assert "throughput_vs_cloud_only" in summary.columns and "throughput_vs_smallest" in summary.columns
    curve = cost_curve(batches)
    assert curve["forwards"] == len(batches) and curve["b_s_per_token"] == curve["b_s_per_token"]  # fitted (not NaN)
    # `specbench report` on the folder: the fleet page with its three figures and the capacity model.
    assert main(["report", str(out), "--out", str(tmp_path / "report")]) == 0
    html = (tmp_path / "report" / "index.html").read_text()
    assert "Capacity: server throughput and per-edge rate against N" in html and "Scale on paper" in html
    assert "servers for 1,000 (spec)" in html and "Assumptions" in html
    assert sorted(p.name for p in (tmp_path / "report" / "figures").glob("*.png")) == [
        "batch_sizes.png", "capacity.png", "cost_curve.png"]


def test_a_replay_against_another_cloud_counts_its_mismatches(pair, prompts, recording, tmp_path):
    """The check has teeth: the edge model served as the 'cloud' gives other verdicts, and the
    replay says so (and still finishes every generation by re-opening at the recorded prefix)."""
    background = BackgroundServer(load_model(pair["edge"], "float32"))
    with background as url:
        assert fleet("--edge-replay", str(recording), "--cloud-url", url, "--prompts", prompts, "--clients", "1",
                     "--no-baseline", "--out", str(tmp_path / "f")) == 0
    records, _, _ = read_fleet(tmp_path / "f")
    assert len(records) == 3 and sum(r["replay_mismatches"] for r in records) > 0


def test_real_edge_processes_produce_the_clouds_greedy_tokens(pair, prompts, server, recording, tmp_path):
    out = tmp_path / "edges"
    assert fleet("--edge", pair["edge"], "--cloud-url", server, "--prompts", prompts, "--clients", "2",
                 "--out", str(out)) == 0
    records, levels, _ = read_fleet(out)
    recorded = {json.loads(line)["id"]: json.loads(line)["tokens"]
                for line in (recording / "results.jsonl").read_text().splitlines()}
    spec = [r for r in records if r["mode"] == "spec"]
    assert len(spec) == 6 and all(r["tokens"] == recorded[r["id"]] for r in spec)
    assert all(r["edge_kind"] == "process" and r["cores_shared"] == os.cpu_count() for r in spec)
    assert all(r["tokens_match"] for r in records if r["mode"] == "cloud")  # cloud-only from the fleet's own spec runs
    assert len(levels) == 2


def test_open_loop_arrivals(pair, prompts, server, recording, tmp_path):
    out = tmp_path / "open"
    assert fleet("--edge-replay", str(recording), "--cloud-url", server, "--prompts", prompts, "--clients", "2",
                 "--rate", "20", "--no-baseline", "--out", str(out)) == 0
    records, _, _ = read_fleet(out)
    for client in (0, 1):
        mine = sorted((r for r in records if r["client"] == client), key=lambda r: r["arrival_s"])
        assert len({r["arrival_s"] for r in mine}) == 3 and mine[0]["arrival_s"] > 0  # Poisson, not all at 0
        assert all(r["start_s"] >= r["arrival_s"] - 1e-3 and r["response_s"] >= r["latency_s"] - 1e-3 for r in mine)


def test_a_killed_fleet_resumes_with_finished_levels_intact(pair, prompts, server, recording, tmp_path):
    out = tmp_path / "killed"
    command = [sys.executable, "-m", "bench.cli", "fleet", "--edge-replay", str(recording), "--cloud-url", server,
               "--prompts", prompts, "--clients", "1,2,4", "--no-baseline", "--out", str(out), *SETTINGS]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               env={**os.environ, "HF_HUB_OFFLINE": "1"})
    levels_file = out / "levels.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (levels_file.is_file() and levels_file.read_text().count("\n") >= 1):
        time.sleep(0.01)
    # Mid-level: the first finished, the next one's records are being written.
    while time.monotonic() < deadline and (out / "results.jsonl").read_text().count("\n") < 4:
        time.sleep(0.005)
    process.send_signal(signal.SIGKILL)
    process.wait(30)
    levels_before = levels_file.read_bytes()
    results_before = (out / "results.jsonl").read_bytes()
    finished = [json.loads(line) for line in levels_before.decode().splitlines()]
    assert 1 <= len(finished) < 3
    assert main(command[3:]) == 0
    records, levels, _ = read_fleet(out)
    assert levels_file.read_bytes().startswith(levels_before) and (out / "results.jsonl").read_bytes().startswith(results_before)
    assert sorted(lv["clients"] for lv in levels) == [1, 2, 4]  # each level once: the finished ones not rerun
    runs = {lv["level_run"] for lv in levels}
    assert {lv["level_run"] for lv in finished} <= runs
    assert sum(r["level_run"] in runs for r in records) == (1 + 2 + 4) * 3


@pytest.mark.parametrize("args, message", [
    (["--clients", "0"], "clients must be fleet sizes in [1, 256]"),
    (["--clients", "2,2"], "lists a fleet size twice"),
    (["--rate", "-1"], "rate must be > 0"),
    (["--policy", "sample"], "--edge-replay needs a deterministic policy"),
    (["--k", "5"], "split records differ in k: 3 there, 5 here"),
    (["--max-batch", "0"], "max_batch must be >= 1"),
])
def test_bad_fleet_settings_are_one_line(prompts, recording, server, tmp_path, capsys, args, message):
    out = tmp_path / "bad"
    code = main(["fleet", "--edge-replay", str(recording), "--cloud-url", server, "--prompts", prompts, "--out", str(out),
                 *SETTINGS, *args])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1].startswith("error:") and message in err[-1], err
    assert not (out / "results.jsonl").exists()


def test_fleet_needs_its_edges_and_its_server(prompts, tmp_path, capsys):
    for args, message in ((["--cloud-url", "127.0.0.1:9"], "give exactly one"),
                          (["--edge-replay", str(tmp_path)], "a fleet needs its server"),
                          (["--edge-replay", str(tmp_path), "--cloud-url", "127.0.0.1:9"], "no results.jsonl there")):
        assert main(["fleet", "--prompts", prompts, "--out", str(tmp_path / "o"), *args]) == 2
        assert message in capsys.readouterr().err


def test_fleet_starts_its_own_server_and_says_why_when_it_cannot(pair, prompts, recording, tmp_path, capsys, monkeypatch):
    cores = sorted(os.sched_getaffinity(0))
    out = tmp_path / "own"
    threads = torch.get_num_threads()
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):  # the fleet sizes them for its edges: restored after the test
        if name in os.environ:
            monkeypatch.setenv(name, os.environ[name])
        else:
            monkeypatch.delenv(name, raising=False)
    try:
        assert fleet("--edge-replay", str(recording), "--cloud", pair["cloud"], "--cloud-cores", str(cores[-1]),
                     "--prompts", prompts, "--clients", "2", "--no-baseline", "--out", str(out)) == 0
        assert sorted(os.sched_getaffinity(0)) == cores[:-1] or len(cores) == 1  # off the server's core
    finally:
        pin_cores(cores)  # every thread of this process back where it was
        torch.set_num_threads(threads)
    records, _, _ = read_fleet(out)
    assert len(records) == 6 and all(r["replay_mismatches"] == 0 for r in records)
    empty = tmp_path / "not-a-model"
    empty.mkdir()
    assert fleet("--edge-replay", str(recording), "--cloud", str(empty), "--prompts", prompts, "--clients", "1",
                 "--out", str(tmp_path / "none")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: the verifier server did not start (") and "Traceback" not in "\n".join(err)


def test_a_fleet_folder_has_one_configuration_and_is_not_a_runs(prompts, server, recording, tmp_path, capsys):
    out = tmp_path / "one"
    base = ["--edge-replay", str(recording), "--cloud-url", server, "--prompts", prompts, "--no-baseline"]
    assert fleet(*base, "--clients", "1", "--out", str(out)) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file() and p.name != ".specbench.lock"}
    capsys.readouterr()
    assert fleet(*base, "--clients", "1,2", "--out", str(out)) == 2
    assert "differs in clients: [1] there, [1, 2] here" in capsys.readouterr().err
    assert fleet(*base, "--clients", "1", "--out", str(recording)) == 2  # a run's folder
    assert "holds the results of a `specbench run`; a fleet does not add to them" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file() and p.name != ".specbench.lock"} == before
