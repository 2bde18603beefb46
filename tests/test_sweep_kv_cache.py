"""The KV cache as a sweep axis (`--kv-cache dynamic,static`): each cache is a point of its own, timed
interleaved with the others in one worker that loads a model per cache; a point where the cache changes
nothing (no torch model in its process) appears once; a cache no point can use is refused in one line; a
folder written when kv_cache was one setting, or before it existed, resumes. Tiny fp32 models on the CPU,
where the static cache is exact, so every cache decodes the same tokens; `compiled` (torch.compile) is left out."""
import json

import pandas as pd
import pytest

from bench.cli import main
from bench.core.point import Point
from bench.core.records import ResultsFile
from bench.derive.summary import plain_name, summarize
from bench.measure.sweep.sweep_config import SweepConfig
from bench.measure.sweep.worker import ModelCache, describe
from bench.read.report.pareto import point_labels
from specdec.backends.hf_causal import HFCausalBackend
from specdec.backends.static_cache import StaticCausalBackend
from specdec.core.config import DecodeConfig
from specdec.engine import Engine
from specdec.errors import ConfigError


def sweep(pair, prompts, out, *extra):
    return main(["sweep", "--edge", pair["edge"], "--cloud", pair["cloud"], "--prompts", prompts, "--out", str(out),
                 "--max-new-tokens", "8", "--dtype", "float32", *map(str, extra)])


@pytest.mark.subprocess
def test_one_sweep_times_each_cache_interleaved_decodes_alike_and_resumes(pair, prompts, tmp_path, capsys):
    out = tmp_path / "kv"
    args = ("--mode", "cloud,spec", "--kv-cache", "dynamic,static", "--policy", "greedy", "--entropy-threshold", "0",
            "--k", "3")
    assert sweep(pair, prompts, out, *args) == 0
    rows = ResultsFile(out / "results.jsonl").read()
    assert all(r["status"] == "ok" for r in rows)
    # cloud-only and spec, each under both caches: 4 points x 3 prompts, the cache recorded in every row
    assert sorted((r["mode"], r["kv_cache"], r["id"]) for r in rows) == sorted(
        (mode, cache, f"p{i}") for mode in ("cloud", "spec") for cache in ("dynamic", "static") for i in range(3))
    for round_ in (rows[i:i + 4] for i in range(0, len(rows), 4)):  # one prompt at a time, every point on it
        assert len({r["id"] for r in round_}) == 1 and {r["kv_cache"] for r in round_} == {"dynamic", "static"}
    tokens = {(r["mode"], r["kv_cache"], r["id"]): r["tokens"] for r in rows}
    for i in range(3):  # fp32: the static cache is exact, and greedy speculation is the cloud's own decoding
        reference = tokens[("cloud", "dynamic", f"p{i}")]
        assert tokens[("cloud", "static", f"p{i}")] == tokens[("spec", "dynamic", f"p{i}")] == reference
        assert tokens[("spec", "static", f"p{i}")] == reference
    assert sum(r["corrections"] for r in rows) and sum(r["num_accepted_tokens"] for r in rows)  # both paths ran
    summary = pd.read_csv(out / "summary.csv")
    assert sorted(zip(summary["mode"], summary["kv_cache"])) == [("cloud", "dynamic"), ("cloud", "static"),
                                                                 ("spec", "dynamic"), ("spec", "static")]
    assert "kv_cache" in capsys.readouterr().err  # the closing table shows the axis
    before = (out / "results.jsonl").read_bytes()
    assert sweep(pair, prompts, out, *args) == 0  # a rerun finds every point done
    assert (out / "results.jsonl").read_bytes() == before


@pytest.mark.subprocess
def test_folders_from_before_the_axis_resume(pair, prompts, tmp_path, capsys):
    """A folder whose sweep.json holds kv_cache as one value (`--kv-cache static` before it was an axis) resumes
    with that value; one written before the setting existed (no kv_cache in its identity or its records) resumes
    as auto; another cache is another configuration, refused in one line naming kv_cache."""
    one_value = tmp_path / "static"
    args = ("--mode", "cloud", "--limit", "2")
    assert sweep(pair, prompts, one_value, *args, "--kv-cache", "static") == 0
    identity = json.loads((one_value / "sweep.json").read_text())
    identity["config"]["kv_cache"] = "static"  # as a sweep wrote it when kv_cache was one setting
    (one_value / "sweep.json").write_text(json.dumps(identity))
    before = (one_value / "results.jsonl").read_bytes()
    assert sweep(pair, prompts, one_value, *args, "--kv-cache", "static") == 0
    assert (one_value / "results.jsonl").read_bytes() == before
    capsys.readouterr()
    assert sweep(pair, prompts, one_value, *args, "--kv-cache", "static,dynamic") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and 'kv_cache: ["static"] there, ["static", "dynamic"] here' in err[0]

    older = tmp_path / "older"
    assert sweep(pair, prompts, older, *args) == 0
    identity = json.loads((older / "sweep.json").read_text())
    for name in ("kv_cache", "cuda_graphs", "edge_device", "cloud_device"):  # the devices came together
        del identity["config"][name]
    (older / "sweep.json").write_text(json.dumps(identity))
    rows = ResultsFile(older / "results.jsonl").read()
    for row in rows:
        for name in ("kv_cache", "cuda_graphs", "edge_device", "cloud_device"):
            del row[name]
    (older / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    before = (older / "results.jsonl").read_bytes()
    assert sweep(pair, prompts, older, *args) == 0
    assert (older / "results.jsonl").read_bytes() == before


@pytest.mark.parametrize("argv, problem", [
    (("--mode", "cloud", "--cloud-runtime", "torch-int8", "--kv-cache", "dynamic,static"),
     "error: the sweep options: kv_cache static changes no point of this sweep: it is the KV cache of the torch models "
     "a point runs in its own process, and the points given it run none (llama.cpp, ONNX Runtime, OpenVINO and the "
     "int8 runtimes keep their own caches, a split point's cloud runs in its server, a draft-free drafter needs no "
     "edge model): drop it from --kv-cache, or add torch to --cloud-runtime or --edge-runtime"),
    (("--mode", "cloud", "--kv-cache", "dynamic,paged"),
     "error: the sweep options: unknown kv_cache 'paged': use one of auto, dynamic, static, compiled"),
])
def test_a_cache_no_point_can_use_is_refused_in_one_line_exit_2(pair, prompts, tmp_path, capsys, argv, problem):
    assert sweep(pair, prompts, tmp_path / "o", *argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(problem), err
    assert not (tmp_path / "o").exists()  # refused before anything was written


def test_a_point_the_cache_does_not_reach_appears_once():
    config = SweepConfig.from_mapping({"edge": "e", "cloud": "c", "mode": ["cloud", "spec"], "k": [2],
                                       "cloud_runtime": ["torch", "torch-int8"], "kv_cache": ["static", "dynamic"],
                                       "deployment": ["inproc", "split"], "edge_runtime": ["torch-int8"],
                                       "split_cores": "shared"})
    points = [(p.mode, p.cloud_runtime, p.deployment, p.kv_cache) for p in config.points()]
    assert len(points) == len(set(points))
    assert [p for p in points if p[0] == "cloud"] == [("cloud", "torch", "inproc", "static"),
                                                     ("cloud", "torch", "inproc", "dynamic"),
                                                     ("cloud", "torch-int8", "inproc", "static")]  # the first cache
    # a split point's cloud runs in its server and its edge in int8: one point, while its co-located twin (the
    # cloud in this process) runs torch under each cache
    assert [p for p in points if p[:3] == ("spec", "torch", "split")] == [("spec", "torch", "split", "static")]
    assert [p for p in points if p[:3] == ("spec", "torch", "colocated")] == [
        ("spec", "torch", "colocated", "static"), ("spec", "torch", "colocated", "dynamic")]
    assert [p for p in points if p[:3] == ("spec", "torch-int8", "inproc")] == [("spec", "torch-int8", "inproc", "static")]
    # one value is today's setting: every point carries it, wherever it applies or not
    single = SweepConfig.from_mapping({"cloud": "c", "mode": ["cloud"], "cloud_runtime": ["torch", "torch-int8"],
                                       "kv_cache": ["static"]})
    assert [(p.cloud_runtime, p.kv_cache) for p in single.points()] == [("torch", "static"), ("torch-int8", "static")]
    assert SweepConfig.from_mapping({"cloud": "c", "mode": ["cloud"]}).kv_cache == ("auto",)


def test_the_cache_is_in_a_points_key_and_auto_keeps_the_keys_written_before():
    before = Point(mode="cloud", cloud_runtime="torch", prompts="code")
    assert Point(mode="cloud", cloud_runtime="torch", prompts="code", kv_cache="auto").key() == before.key()
    assert Point(mode="cloud", cloud_runtime="torch", prompts="code", kv_cache="static").key() != before.key()
    assert "kv_cache=static" in Point(mode="cloud", dtype="float32", prompts="code", kv_cache="static").label()
    assert describe(Point(mode="cloud", cloud_runtime="torch", kv_cache="static"), "p0") == \
        "cloud in torch, static KV cache on prompt p0"
    assert describe(Point(mode="cloud", cloud_runtime="llamacpp", kv_cache="static"), "p0") == "cloud in llamacpp on prompt p0"


def test_a_workers_engines_share_a_model_per_cache(pair):
    loader = ModelCache()

    def cloud(cache: str) -> Engine:
        engine = Engine(mode="cloud", cloud=pair["cloud"], dtype="float32", kv_cache=cache, loader=loader,
                        decode=DecodeConfig(max_new_tokens=6), log=lambda m: None)
        engine.load()
        return engine

    static, dynamic, auto, again = cloud("static"), cloud("dynamic"), cloud("auto"), cloud("static")
    assert isinstance(static.model("cloud").backend, StaticCausalBackend)
    assert type(dynamic.model("cloud").backend) is HFCausalBackend
    assert auto.model("cloud") is dynamic.model("cloud")  # auto on the CPU is the dynamic cache: one load
    assert again.model("cloud") is static.model("cloud") and len(loader.models()) == 2
    assert static.generate("hello world").tokens == dynamic.generate("hello world").tokens


def synthetic(mode, pid, latency, cache, **kw):
    base = dict(id=pid, mode=mode, dtype="float32", prompts="p", policy=None, k=None, entropy_threshold=None,
                accept_threshold=None, verifier=None, status="ok", text="a b c", tokens=[1, 2, 3], new_tokens=8,
                latency_s=latency, ttft_s=0.1, tpot_s=0.01, num_draft_tokens=0, num_accepted_tokens=0, cloud_calls=0,
                cycles=8, edge_s=0, cloud_s=0, overhead_s=0.0, punct_density=0.1, peak_rss_bytes=1,
                edge_runtime=None if mode == "cloud" else "torch", cloud_runtime="torch", kv_cache=cache)
    return {**base, **kw}


def test_the_summary_and_the_report_put_the_caches_side_by_side():
    spec = dict(policy="greedy", k=4, entropy_threshold=0.0, accept_threshold=0.1, verifier="cached", drafter="model",
                num_draft_tokens=8, num_accepted_tokens=6, cloud_calls=2, cycles=2)
    rows = []
    for pid, scale in (("a", 1.0), ("b", 2.0), ("c", 3.0)):
        rows += [synthetic("cloud", pid, 4.0 * scale, "dynamic"), synthetic("cloud", pid, 2.0 * scale, "static"),
                 synthetic("spec", pid, 2.0 * scale, "dynamic", **spec), synthetic("spec", pid, 0.5 * scale, "static", **spec),
                 synthetic("cloud", pid, 1.0 * scale, "dynamic", cloud_runtime="llamacpp")]
    summary = summarize(rows)
    point = summary.set_index(["mode", "cloud_runtime", "kv_cache"])
    # each cache's speculation against the plain decoding with the same cache
    assert point.loc[("spec", "torch", "dynamic"), "speedup_vs_cloud"] == pytest.approx(2.0)
    assert point.loc[("spec", "torch", "static"), "speedup_vs_cloud"] == pytest.approx(4.0)
    # and every point against the fastest plain decoding, whatever its cache: the caches side by side
    assert point.loc[("cloud", "torch", "static"), "speedup_vs_fastest_cloud"] == pytest.approx(0.5)
    assert point.loc[("cloud", "torch", "dynamic"), "speedup_vs_fastest_cloud"] == pytest.approx(0.25)
    labels = dict(zip(zip(summary["mode"], summary["cloud_runtime"], summary["kv_cache"]), point_labels(summary)))
    assert labels[("cloud", "torch", "static")] == "cloud-only (cloud torch, kv static)"
    assert labels[("cloud", "torch", "dynamic")] == "cloud-only (cloud torch, kv dynamic)"
    assert labels[("cloud", "llamacpp", "dynamic")] == "cloud-only (cloud llamacpp)"  # llama.cpp keeps its own cache
    assert labels[("spec", "torch", "static")] == "(0, 4, greedy, kv static)"
    assert point.loc[("spec", "torch", "static"), "fastest_cloud"] == "llamacpp"
    assert plain_name({"mode": "cloud", "dtype": "float32", "cloud_runtime": "torch", "kv_cache": "static"}) == \
        "torch float32, static KV cache"
    assert plain_name({"mode": "cloud", "dtype": "float32", "cloud_runtime": "torch", "kv_cache": "auto"}) == "torch float32"


def test_rows_override_the_cache_like_any_axis(tmp_path):
    config = tmp_path / "sweep.toml"
    config.write_text('cloud = "c"\nmode = ["cloud"]\n[[rows]]\nkv_cache = ["static"]\n')
    assert [p.kv_cache for p in SweepConfig.from_toml(config).points()] == ["auto", "static"]
    config.write_text('cloud = "c"\nmode = ["cloud"]\ncloud_runtime = ["torch-int8"]\n[[rows]]\nkv_cache = ["static"]\n')
    with pytest.raises(ConfigError, match="kv_cache static changes no point of this sweep"):
        SweepConfig.from_toml(config)
