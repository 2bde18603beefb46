"""Runtimes as sweep axes: a tiny sweep over the edge's runtimes (torch and llama.cpp on a GGUF
written in the test beside the HF files) runs, records each point's runtime, stays lossless in
every runtime, resumes, and refuses a resume with another runtime; the server the sweep starts for
split points runs the cloud in the point's runtime (`specbench serve --runtime`)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (pip install 'specbench[llamacpp]')")

from transformers import AutoModelForCausalLM

from bench.cli import main
from bench.core.records import ResultsFile
from tests.tiny_gguf import write_llama_gguf

pytestmark = pytest.mark.subprocess  # see CONTRIBUTING.md: the quick loop leaves these out


@pytest.fixture(scope="module")
def gguf_pair(pair):
    """The tiny pair with each model's GGUF (F32) beside its HF files: one name, both runtimes."""
    for role in ("edge", "cloud"):
        model = AutoModelForCausalLM.from_pretrained(pair[role], dtype=torch.float32)
        write_llama_gguf(model, f"{pair[role]}/model.gguf", model.config.eos_token_id)
    return pair


def sweep(pair, prompts, out, *extra):
    return main(["sweep", "--edge", pair["edge"], "--cloud", pair["cloud"], "--prompts", prompts, "--out", str(out),
                 "--max-new-tokens", "6", "--dtype", "float32", "--policy", "greedy", "--entropy-threshold", "0",
                 "--k", "2", *map(str, extra)])


def test_a_sweep_over_edge_runtimes_runs_records_them_and_resumes(gguf_pair, prompts, tmp_path, capsys):
    out = tmp_path / "s"
    args = ("--mode", "cloud,edge,spec", "--edge-runtime", "torch,llamacpp")
    assert sweep(gguf_pair, prompts, out, *args) == 0
    rows = ResultsFile(out / "results.jsonl").read()
    assert all(r["status"] == "ok" for r in rows)
    points = {(r["mode"], r["edge_runtime"], r["cloud_runtime"]) for r in rows}
    # cloud-only once (it loads no edge: its edge runtime is blank), edge-only and spec in each edge runtime
    assert points == {("cloud", None, "torch"), ("edge", "torch", None), ("edge", "llamacpp", None),
                      ("spec", "torch", "torch"), ("spec", "llamacpp", "torch")}
    assert len(rows) == len(points) * 3
    cloud = {r["id"]: r["tokens"] for r in rows if r["mode"] == "cloud"}
    for r in rows:
        if r["mode"] == "spec":  # greedy, every block verified: lossless whatever runs the drafter
            assert r["tokens"] == cloud[r["id"]], r["edge_runtime"]
    summary = (out / "summary.csv").read_text()
    assert "edge_runtime" in summary.splitlines()[0] and "llamacpp" in summary
    table = capsys.readouterr().err
    assert "edge_runtime" in table and "llamacpp" in table, table  # the closing table names the varying axis
    assert sweep(gguf_pair, prompts, out, *args) == 0  # resume: nothing recomputed
    assert len(ResultsFile(out / "results.jsonl").read()) == len(rows)
    capsys.readouterr()
    assert sweep(gguf_pair, prompts, out, "--mode", "cloud,edge,spec", "--edge-runtime", "torch") == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and 'edge_runtime: ["torch", "llamacpp"] there, ["torch"] here' in err


def test_plain_runtimes_time_the_baselines_in_another_runtime_and_old_folders_resume(gguf_pair, prompts, tmp_path):
    out = tmp_path / "plain"
    args = ("--mode", "cloud,edge,spec", "--plain-runtimes", "llamacpp", "--limit", "2")
    assert sweep(gguf_pair, prompts, out, *args) == 0
    rows = ResultsFile(out / "results.jsonl").read()
    assert all(r["status"] == "ok" for r in rows)
    points = {(r["mode"], r["edge_runtime"], r["cloud_runtime"]) for r in rows}
    # plain decoding of each model in both runtimes; speculation only in the grid's (torch → torch)
    assert points == {("cloud", None, "torch"), ("cloud", None, "llamacpp"), ("edge", "torch", None),
                      ("edge", "llamacpp", None), ("spec", "torch", "torch")}
    by = {(r["mode"], r["edge_runtime"] or r["cloud_runtime"], r["id"]): r["tokens"] for r in rows}
    for (mode, runtime, prompt), tokens in by.items():
        if mode == "cloud" and runtime == "llamacpp":  # the same F32 weights: llama.cpp decodes as torch does
            assert tokens == by[("cloud", "torch", prompt)]
    header, *lines = (out / "summary.csv").read_text().splitlines()
    assert "fastest_plain" in header.split(",") and len(lines) == len(points)
    # a folder written before the setting existed resumes as "no extra runtimes"
    old = tmp_path / "old"
    assert sweep(gguf_pair, prompts, old, "--mode", "cloud,edge,spec", "--limit", "2") == 0
    stored = json.loads((old / "sweep.json").read_text())
    del stored["config"]["plain_runtimes"]
    (old / "sweep.json").write_text(json.dumps(stored))
    before = (old / "results.jsonl").read_bytes()
    assert sweep(gguf_pair, prompts, old, "--mode", "cloud,edge,spec", "--limit", "2") == 0
    assert (old / "results.jsonl").read_bytes() == before


def test_split_points_get_a_server_in_their_cloud_runtime(gguf_pair, prompts, tmp_path):
    out = tmp_path / "split"
    assert sweep(gguf_pair, prompts, out, "--mode", "cloud,spec", "--deployment", "split",
                 "--cloud-runtime", "torch,llamacpp", "--limit", "1") == 0
    rows = ResultsFile(out / "results.jsonl").read()
    assert all(r["status"] == "ok" for r in rows)
    spec = {r["cloud_runtime"]: r for r in rows if r["mode"] == "spec" and r["deployment"] == "split"}
    alone = {r["cloud_runtime"]: r for r in rows if r["mode"] == "cloud"}
    # every split point's co-located baseline runs the same cloud runtime, in process
    colocated = {r["cloud_runtime"]: r for r in rows if r["mode"] == "spec" and r["deployment"] == "colocated"}
    assert set(spec) == set(alone) == set(colocated) == {"torch", "llamacpp"}
    assert len(rows) == 6
    # the torch server verifies as the torch cloud decodes alone: lossless through it
    assert spec["torch"]["tokens"] == alone["torch"]["tokens"]


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bench.cli", *args], capture_output=True, text=True, timeout=120)


def test_serve_refuses_a_gguf_in_another_runtime(gguf_pair):
    done = run_cli("serve", "--model", f"{gguf_pair['cloud']}/model.gguf", "--runtime", "torch", "--port", "0")
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert done.stderr.startswith("error: ") and "--runtime llamacpp" in done.stderr


def test_sweep_with_one_server_url_takes_one_cloud_runtime(pair, prompts, tmp_path, capsys):
    assert main(["sweep", "--edge", pair["edge"], "--cloud", pair["cloud"], "--prompts", prompts, "--out",
                 str(tmp_path / "u"), "--mode", "spec", "--deployment", "split", "--cloud-url", "127.0.0.1:9",
                 "--cloud-runtime", "torch,llamacpp"]) == 2
    assert "give one --cloud-runtime" in capsys.readouterr().err
