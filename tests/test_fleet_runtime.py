"""`specbench fleet --cloud-runtime` on the tiny pair (fp32 weights, loopback): the fleet starts an
int8 server, every replayed verdict equals the one recorded against an int8 server at N = 1 and
at N = 3 with shared forwards, cloud-only serving runs on that server too, and the runtime is named
in fleet.json, the records, the summary and the report; against a --cloud-url server the records
carry what the server says it runs, or `unknown` when it says nothing (and so do a split run's records);
bad input is one line."""
from __future__ import annotations

import dataclasses
import json

import pandas as pd
import pytest

from bench.cli import main
from bench.derive.fleet_summary import read_fleet
from specdec.models.loading import load_model
from specdec.remote.background import BackgroundServer
from specdec.remote.server_config import ServeConfig
from tests.recording import record_split

pytestmark = pytest.mark.server  # see CONTRIBUTING.md: the quick loop leaves these out

SETTINGS = ["--dtype", "float32", "--policy", "greedy", "--entropy-threshold", "0", "--k", "3", "--max-new-tokens", "12"]


@pytest.fixture(scope="module")
def int8_cloud(pair):
    return load_model(pair["cloud"], "float32", log=lambda m: None, runtime="torch-int8")


@pytest.fixture(scope="module")
def recording(pair, prompts, int8_cloud, tmp_path_factory):
    """A split run against an int8 server, one edge at a time (no batching): what the fleet replays."""
    with BackgroundServer(int8_cloud, ServeConfig(max_batch=1)) as url:
        return record_split(pair["edge"], url, prompts, tmp_path_factory.mktemp("recording"), SETTINGS)


def test_an_int8_fleet_replays_without_a_mismatch_alone_and_counts_them_batched(pair, prompts, recording, tmp_path):
    out = tmp_path / "int8"
    assert main(["fleet", "--edge-replay", str(recording), "--cloud", pair["cloud"], "--cloud-runtime", "torch-int8",
                 "--max-batch", "8", "--batch-window-ms", "20", "--prompts", prompts, "--clients", "1,3",
                 "--out", str(out), *SETTINGS]) == 0
    records, levels, batches = read_fleet(out)
    assert len(records) == 2 * (1 + 3) * 3 and all(r["status"] == "ok" for r in records)
    assert {r["cloud_runtime"] for r in records} == {lv["cloud_runtime"] for lv in levels} == {"torch-int8"}
    spec = [r for r in records if r["mode"] == "spec"]
    # Alone, every verdict of the int8 server equals the recorded one. Sharing forwards with other rows it need not:
    # torch-int8 quantizes a forward's activations with one scale over all its rows (its declared block drift), so a
    # near tie can turn with the batch's make-up, which the arrival times decide (a clean-clone CI run saw 2 of the
    # batched verdicts differ). The mismatches are counted, each at most one a verify; the batch-invariant runtime's
    # replay without a mismatch is test_a_per_token_int8_fleet_replays_without_a_mismatch_batched.
    assert all(r["verifies"] > 0 for r in spec)
    assert [r["replay_mismatches"] for r in spec if r["clients"] == 1] == [0, 0, 0]
    assert max(b["rows"] for b in batches if b["clients"] == 3 and b["mode"] == "spec") >= 2
    assert all(0 <= r["replay_mismatches"] <= r["verifies"] for r in spec if r["clients"] == 3)
    # Cloud-only on the same int8 server: its own greedy steps (one token each), every record served.
    assert all(r["cloud_runtime"] == "torch-int8" for r in records if r["mode"] == "cloud")
    assert json.loads((out / "fleet.json").read_text())["config"]["cloud_runtime"] == "torch-int8"
    summary = pd.read_csv(out / "summary.csv")
    assert set(summary["cloud_runtime"]) == {"torch-int8"}
    assert main(["report", str(out), "--out", str(tmp_path / "report")]) == 0
    html = (tmp_path / "report" / "index.html").read_text()
    assert "cloud runtime torch-int8" in html and "Capacity against the closed forms" in html


def test_a_split_run_records_the_runtime_its_server_runs(recording):
    """`specbench run --cloud-url` asked for no cloud runtime (torch by default), but the int8 server verified."""
    rows = [json.loads(line) for line in (recording / "results.jsonl").read_text().splitlines()]
    assert rows and {r["cloud_runtime"] for r in rows} == {"torch-int8"}
    identity = json.loads((recording / "run.json").read_text())
    assert identity["point"]["cloud_runtime"] == "torch-int8" and identity["config"]["cloud_runtime"] == "torch"


def test_a_cloud_url_fleet_records_the_runtime_the_server_reports(pair, prompts, recording, int8_cloud, tmp_path):
    with BackgroundServer(int8_cloud) as url:
        assert main(["fleet", "--edge-replay", str(recording), "--cloud-url", url, "--prompts", prompts, "--clients",
                     "1", "--no-baseline", "--out", str(tmp_path / "said"), *SETTINGS]) == 0
    records, levels, _ = read_fleet(tmp_path / "said")
    assert {r["cloud_runtime"] for r in records} == {lv["cloud_runtime"] for lv in levels} == {"torch-int8"}
    assert json.loads((tmp_path / "said" / "fleet.json").read_text())["config"]["cloud_runtime"] is None
    # A server that does not say what runs its model (as one older than the field): unknown, not guessed.
    silent = dataclasses.replace(int8_cloud, runtime=None)
    with BackgroundServer(silent) as url:
        assert main(["fleet", "--edge-replay", str(recording), "--cloud-url", url, "--prompts", prompts, "--clients",
                     "1", "--no-baseline", "--out", str(tmp_path / "silent"), *SETTINGS]) == 0
    records, _, _ = read_fleet(tmp_path / "silent")
    assert {r["cloud_runtime"] for r in records} == {"unknown"}
    assert set(pd.read_csv(tmp_path / "silent" / "summary.csv")["cloud_runtime"]) == {"unknown"}


@pytest.mark.parametrize("args, message", [
    (["--cloud-url", "127.0.0.1:9", "--cloud-runtime", "torch-int8"], "a --cloud-url server runs as it was started"),
    (["--cloud", "m.gguf", "--cloud-runtime", "torch"], "is a GGUF file, which llama.cpp runs: use --cloud-runtime llamacpp"),
])
def test_a_fleet_cloud_runtime_is_checked_as_serve_checks_it(prompts, recording, tmp_path, capsys, args, message):
    out = tmp_path / "bad"
    assert main(["fleet", "--edge-replay", str(recording), "--prompts", prompts, "--out", str(out), *SETTINGS, *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error:") and message in err[-1], err
    assert not (out / "results.jsonl").exists()


def test_a_per_token_int8_fleet_replays_without_a_mismatch_batched(pair, prompts, tmp_path):
    """`--cloud MODEL@int8t` (batch-invariant int8, tests/test_int8_batch.py): recorded alone, replayed
    three at a time in shared forwards, every verdict the recorded one; the runtime recorded is int8t's."""
    recorded = tmp_path / "recorded"
    cloud = load_model(f"{pair['cloud']}@int8t", "float32", log=lambda m: None)
    with BackgroundServer(cloud, ServeConfig(max_batch=1)) as url:
        record_split(pair["edge"], url, prompts, recorded, SETTINGS)
    out = tmp_path / "int8t"
    assert main(["fleet", "--edge-replay", str(recorded), "--cloud", f"{pair['cloud']}@int8t", "--max-batch", "8",
                 "--batch-window-ms", "20", "--prompts", prompts, "--clients", "3", "--no-baseline", "--out", str(out),
                 *SETTINGS]) == 0
    records, _, batches = read_fleet(out)
    assert len(records) == 9 and {r["cloud_runtime"] for r in records} == {"torch-int8t"}
    assert max(b["rows"] for b in batches) >= 2 and sum(r["replay_mismatches"] for r in records) == 0
