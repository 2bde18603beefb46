"""The GPU check (bench/gpu/check.sh, bench/measure/gpu_check.py) stays runnable on a machine nobody here can
try it on: its dry run goes through the same commands on the CPU (tiny configs, few shapes), what it runs is
held to the project (the CUDA test file and its marker, the configs, the driver's flags), and what it derives
from a curve is checked on numbers whose answer is known."""
import csv
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pandas as pd
import pytest

from bench.cli import build_parser
from bench.core.records import read_records
from bench.derive.gpu_costs import capacity, graph_bound, spread, summarize
from bench.measure import gpu_check, gpu_trees
from bench.measure.serving.clients import script_of

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "bench" / "gpu" / "check.sh"


@pytest.mark.subprocess
def test_the_dry_run_writes_every_file_through_the_same_commands(tmp_path):
    results = tmp_path / "results"
    done = subprocess.run(["bash", str(SCRIPT), str(results), "--dry-run"], capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable}, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    files = sorted(p.name for p in results.iterdir())
    assert files == ["check.log", "cost_curve.csv", "cost_summary.json", "cuda_tests.txt", "environment.json",
                     "fleet_levels.jsonl", "fleet_results.jsonl", "fleet_summary.csv", "tree_costs.csv"]
    environment = json.loads((results / "environment.json").read_text())
    assert environment["dry_run"] and environment["device"] == "cpu" and "gpu" in environment
    assert environment["missing_packages"] == [] and environment["bandwidth_gbs"] > 0
    tests = (results / "cuda_tests.txt").read_text()
    assert tests.startswith("gpu: None\n$ pytest tests/test_cuda.py -m cuda") and "exit code 0" in tests
    assert re.search(r"\d+ skipped", tests)  # no GPU here: every CUDA test collected and skipped
    with (results / "cost_curve.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert {(r["model"], r["mode"]) for r in rows} == {(m, mode) for m in gpu_check.MODELS for mode in ("eager", "static")}
    assert all(r["median_ms"] and len(r["times_ms"].split()) == 2 and "gpu" in r for r in rows)
    # Verify cycles through the backends: every shape on both caches (the static one eagerly on a CPU), each in
    # steps of its own cache.
    with (results / "tree_costs.csv").open() as f:
        trees = list(csv.DictReader(f))
    assert [(r["shape"], int(r["width"]), int(r["depth"])) for r in trees if r["model"] == gpu_check.MODELS[0]
            and r["cache"] == "static"] == [(s, w, d) for s, w, d in gpu_trees.TREE_SHAPES]
    assert {(r["model"], r["cache"]) for r in trees} == {(m, c) for m in gpu_check.MODELS for c in ("static", "dynamic")}
    assert all(float(r["steps"]) > 0 and len(r["times_ms"].split()) == 2 for r in trees)
    assert all(float(r["steps"]) == 1.0 for r in trees if r["shape"] == "step")
    summary = json.loads((results / "cost_summary.json").read_text())
    agreed = summary["tree_agreement"]  # a 4 x 4 tree's rows and a chain's against their steps, per model and cache
    assert {(a["model"], a["cache"]) for a in agreed} == {(m, c) for m in gpu_check.MODELS for c in ("static", "dynamic")}
    assert all(a["tree"]["rows"] == 16 and 0 <= a["tree"]["same_argmax"] <= 16 and a["chain"]["rows"] == 4 for a in agreed)
    assert summary["complete"] and summary["failed"] == {} and "gpu" in summary
    assert set(summary["models"]) == set(gpu_check.MODELS)
    # The fleets: the recorded edges against a tiny architecture keeping their verdicts, spec beside cloud-only, on
    # the server's dynamic cache, then its static one.
    records = [json.loads(line) for line in (results / "fleet_results.jsonl").read_text().splitlines()]
    assert {(r["kv_cache"], r["mode"]) for r in records} == {(c, m) for c in gpu_check.FLEET_CACHES for m in ("spec", "cloud")}
    assert all(r["status"] == "ok" for r in records)
    assert all(r["followed"] and r["cloud"].startswith("arch:") for r in records if r["mode"] == "spec")
    with (results / "fleet_summary.csv").open() as f:
        assert {(r["kv_cache"], r["mode"]) for r in csv.DictReader(f)} == {(c, m) for c in gpu_check.FLEET_CACHES
                                                                           for m in ("spec", "cloud")}
    for cache in gpu_check.FLEET_CACHES:
        measured = summary["fleet"]["caches"][cache]
        level = measured["levels"]["1"]
        assert measured["exit_code"] == 0 and level["spec_tokens_per_s"] > 0 and level["cloud_tokens_per_s"] > 0
        assert level["verifies"] == len(script_of(recorded()[records[0]["id"]]).steps)
        assert measured["graph_bound"] == {"1": {"cloud_tokens_per_s": None, "spec_over_graph_bound": None}}  # no graphs on a CPU


def test_what_the_check_runs_is_in_the_project():
    script = SCRIPT.read_text()
    assert "python -m bench.measure.gpu_check" in script.replace('"$python"', "python")
    assert "pip install -q --no-deps --no-build-isolation -e ." in script and "SPECBENCH_WHEELS" in script
    limit = re.search(r"SPECBENCH_CHECK_TIMEOUT_S:-(\d+)", script)
    assert limit and int(limit[1]) <= 8 * 60 - 30  # the default: with the install, within 8 minutes
    test_file, _, marker = gpu_check.TESTS[:3]
    assert (ROOT / test_file).is_file()
    markers = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["markers"]
    assert any(m.startswith(f"{marker}:") for m in markers)
    for name in gpu_check.MODELS:
        assert json.loads((gpu_check.CONFIGS / f"{name}.json").read_text())["model_type"] == "qwen2"


@pytest.mark.parametrize("name, layers, params_b", [("qwen2.5-1.5b", 28, 1.54), ("qwen2.5-7b", 28, 7.62)])
def test_the_configs_are_the_real_architectures(name, layers, params_b):
    import torch

    with torch.device("meta"):  # the real size, no memory
        model = gpu_check.build(name, "meta", dry=False)
    assert model.config.num_hidden_layers == layers
    assert round(sum(p.numel() for p in model.parameters()) / 1e9, 2) == params_b
    assert next(model.parameters()).dtype == torch.bfloat16


def recorded() -> dict[str, dict]:
    return {r["id"]: r for r in read_records(gpu_check.RECORDING / "results.jsonl")}


def test_the_fleets_command_is_the_clis_and_matches_its_recording(tmp_path):
    command = gpu_check.fleet_command("bench/gpu/qwen2.5-7b.json", tmp_path / "f", "cuda", dry=False, kv_cache="static")
    assert command[1:3] == ["-m", "bench.cli"]
    args = build_parser().parse_args(command[3:])  # every flag is the CLI's
    assert args.follow_verdicts and args.cloud == "arch:bench/gpu/qwen2.5-7b.json" and args.cloud_device == "cuda"
    assert args.kv_cache == "static"
    records = recorded()
    assert len(records) >= args.limit
    for record in records.values():  # the replay's settings are the recording's (a replay refuses others)
        assert (record["prompts"], record["k"], record["max_new_tokens"], record["policy"], record["entropy_threshold"],
                record["dtype"]) == (args.prompts, args.k, args.max_new_tokens, args.policy, args.entropy_threshold,
                                     args.dtype)
        assert record["deployment"] == "split" and script_of(record).steps  # its trace rebuilds its tokens
    assert set(args.clients) <= set(gpu_check.ROWS)  # the curve holds a graph-captured bound for each N


def test_the_capacity_reads_spec_against_cloud_only_and_the_graph_bound():
    def level(mode, clients, tokens_per_s, per_cloud_s, ratio=None):
        return {"mode": mode, "clients": clients, "repeats": 2, "server_accepted_tokens_per_s": tokens_per_s,
                "accepted_tokens_per_cloud_s": per_cloud_s, "mean_batch_size": 3.0, "cloud_busy_fraction": 0.5,
                "replay_mismatches": 7, "verifies": 9, "throughput_vs_cloud_only": ratio,
                "throughput_vs_cloud_only_min": ratio and ratio - 0.1, "throughput_vs_cloud_only_max": ratio and ratio + 0.1}

    table = pd.DataFrame([level("spec", 1, 20.0, 400.0, 0.5), level("cloud", 1, 40.0, 100.0),
                          level("spec", 8, 300.0, 600.0, 2.5), level("cloud", 8, 120.0, 200.0)])
    fleet = capacity(table)
    assert fleet["levels"][8]["spec_over_cloud"] == 2.5 and fleet["levels"][8]["spec_over_cloud_min"] == 2.4
    assert fleet["levels"][1]["per_cloud_s_ratio"] == 4.0 and fleet["levels"][8]["server_disagreed"] == 7
    assert list(fleet["target"].values()) == [{"measured": 2.5, "target": 2.0, "met": True}]
    curve = [{"model": "m", "mode": "graphs", "rows": 8, "tokens": 1, "median_ms": 10.0}]
    assert graph_bound(fleet, curve, "m") == {1: {"cloud_tokens_per_s": None, "spec_over_graph_bound": None},
                                              8: {"cloud_tokens_per_s": 800.0, "spec_over_graph_bound": 0.375}}
    assert capacity(pd.DataFrame())["levels"] == {}


def test_the_curve_starts_nothing_after_its_budget(tmp_path):
    rows, sizes, failed = gpu_check.curve(list(gpu_check.MODELS), tmp_path, "cpu", None, dry=True, deadline=0.0, repeats=2)
    assert rows == [] and sizes == {} and failed == {"budget": "the time budget ended before qwen2.5-1.5b"}
    assert (tmp_path / "cost_curve.csv").read_text().startswith("gpu,model,mode,rows,tokens")


def test_a_device_this_machine_lacks_is_one_line_exit_2(tmp_path, capsys):
    assert gpu_check.main([str(tmp_path / "r"), "--device", "tpu"]) == 2
    assert capsys.readouterr().err == "error: unknown device 'tpu' for --device: use cpu, cuda or cuda:N\n"
    assert gpu_check.main([str(tmp_path / "r"), "--dry-run", "--models", "qwen9"]) == 2
    assert not (tmp_path / "r").exists()


def test_the_summary_reads_floors_and_targets_from_the_curve():
    def row(mode, rows, tokens, ms):
        return {"model": "m", "mode": mode, "rows": rows, "tokens": tokens, "median_ms": ms}

    curve = [row("graphs", 1, 1, 6.0), row("graphs", 1, 5, 7.2), row("eager", 1, 1, 22.0), row("graphs", 64, 5, 12.0)]
    summary = summarize(curve, {"m": 15_000_000_000}, bandwidth_gbs=3000.0, gpu="NVIDIA H100")
    model = summary["models"]["m"]
    assert summary["gpu"] == "NVIDIA H100" and model["floor_ms"] == 5.0  # 15 GB at 3 TB/s
    assert model["plain_ms"] == 6.0 and model["step_floors"] == {"eager": 4.4, "graphs": 1.2}
    step, verify = model["targets"].values()
    assert step == {"measured": 1.2, "target": 1.5, "met": True}
    assert verify == {"measured": 1.2, "target": 1.3, "met": True}
    assert {"mode": "graphs", "rows": 64, "tokens": 5, "steps": 2.0} in model["block_steps"]
    missing = summarize([row("eager", 1, 1, 22.0)], {"m": 1}, 1.0, None)["models"]["m"]["targets"]
    assert all(t["measured"] is None and t["met"] is None for t in missing.values())
    assert spread([3.0, 1.0, 2.0]) == (2.0, 1.0, 3.0)
