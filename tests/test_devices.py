"""Devices (specdec/backends/devices.py): the device-agnostic path on the CPU named explicitly (greedy spec =
cloud-only, token for token, through the CLI), and every device a machine does not have refused in one line,
exit 2, by every command that takes one. The same path on CUDA: tests/test_cuda.py."""
import json

import pytest
import torch

from bench.cli import main
from bench.measure.serving.fleet_config import FleetConfig
from bench.measure.trackers import LatencyTracker, PeakMemoryTracker, tracked
from specdec.backends.devices import check_device, check_served_device, clock, gpu_peaks
from specdec.core.config import EngineConfig
from specdec.errors import ConfigError

NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: tests/test_cuda.py covers it")


def read(out):
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]


def test_greedy_spec_on_an_explicit_cpu_is_cloud_only_token_for_token(pair, prompts, tmp_path):
    common = ["--prompts", prompts, "--max-new-tokens", "12", "--dtype", "float32"]
    assert main(["run", "--mode", "cloud", "--cloud", pair["cloud"], "--cloud-device", "cpu", "--out",
                 str(tmp_path / "c"), *common]) == 0
    for verifier in ("cached", "stateless"):
        out = tmp_path / f"s-{verifier}"
        assert main(["run", "--mode", "spec", "--edge", pair["edge"], "--cloud", pair["cloud"], "--edge-device", "cpu",
                     "--cloud-device", "cpu", "--policy", "greedy", "--entropy-threshold", "0", "--k", "3",
                     "--verifier", verifier, "--out", str(out), *common]) == 0
        cloud_only, spec = read(tmp_path / "c"), read(out)
        assert [r["tokens"] for r in spec] == [r["tokens"] for r in cloud_only]
        assert sum(r["corrections"] for r in spec) and sum(r["num_accepted_tokens"] for r in spec)  # both paths ran
        assert {(r["edge_device"], r["cloud_device"]) for r in spec} == {("cpu", "cpu")}
        assert not any("peak_gpu_allocated_bytes" in r for r in spec)  # no CUDA here: RSS alone
    assert {r["edge_device"] for r in cloud_only} == {None}  # cloud mode runs no edge


@pytest.mark.parametrize("device, problem", [
    ("tpu", "unknown device 'tpu' for --cloud-device: use cpu, cuda or cuda:N"),
    ("cuda:x", "unknown device 'cuda:x' for --cloud-device: use cpu, cuda or cuda:N"),
    ("CUDA", "unknown device 'CUDA' for --cloud-device: use cpu, cuda or cuda:N"),
])
def test_an_unknown_device_is_one_line(device, problem):
    with pytest.raises(ConfigError) as raised:
        EngineConfig(mode="cloud", cloud="m", cloud_device=device)
    assert str(raised.value) == problem


@NO_CUDA
@pytest.mark.parametrize("device", ["cuda", "cuda:0", "cuda:3"])
def test_cuda_where_there_is_none_is_one_line_naming_the_fix(device):
    with pytest.raises(ConfigError, match=rf"^--edge-device {device}: CUDA is not available here \(torch .*\): use "
                                          r"--edge-device cpu, or run on a machine with a GPU$"):
        EngineConfig(mode="edge", edge="m", edge_device=device)
    with pytest.raises(ConfigError, match="^--device cuda: CUDA is not available here"):
        check_served_device("cuda", "torch")


def test_a_device_is_checked_only_for_the_roles_that_run():
    EngineConfig(mode="cloud", cloud="m", edge_device="tpu")  # cloud mode loads no edge
    with pytest.raises(ConfigError, match="with --cloud-url the server's model runs where that server was started"):
        EngineConfig(mode="spec", edge="e", cloud_url="127.0.0.1:1", cloud_device="cuda")
    assert check_device("cpu") == "cpu" and check_served_device("cpu", "llamacpp") == "cpu"


@NO_CUDA
@pytest.mark.parametrize("argv", [
    ["run", "--mode", "cloud", "--cloud", "{cloud}", "--cloud-device", "cuda", "--prompts", "{prompts}", "--out", "{out}"],
    ["run", "--mode", "spec", "--edge", "{edge}", "--cloud", "{cloud}", "--edge-device", "cuda:1", "--prompts", "{prompts}",
     "--out", "{out}"],
    ["profile", "--mode", "cloud", "--cloud", "{cloud}", "--cloud-device", "tpu", "--prompts", "{prompts}", "--out", "{out}"],
    ["sweep", "--mode", "cloud", "--cloud", "{cloud}", "--cloud-device", "cuda", "--prompts", "{prompts}", "--out", "{out}"],
    ["serve", "--model", "{cloud}", "--device", "cuda"],
    ["serve", "--model", "{cloud}", "--device", "tpu"],
    ["fleet", "--cloud", "{cloud}", "--cloud-device", "cuda", "--edge", "{edge}", "--prompts", "{prompts}", "--out", "{out}"],
    ["calibrate", "--models", "{cloud}", "--runtimes", "torch", "--device", "cuda"],
])
def test_every_command_refuses_a_missing_device_in_one_line_exit_2(argv, pair, prompts, tmp_path, capsys):
    filled = [a.format(cloud=pair["cloud"], edge=pair["edge"], prompts=prompts, out=tmp_path / "out") for a in argv]
    assert main(filled) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and ("CUDA is not available" in err[0] or "tpu" in err[0])
    assert not (tmp_path / "out").exists()  # refused before anything was written


def test_the_fleets_server_device_is_checked_as_serve_checks_it(pair, prompts):
    with pytest.raises(ConfigError, match="a --cloud-url server runs as it was started"):
        FleetConfig(prompts=prompts, cloud_url="127.0.0.1:9", cloud_device="cuda", edge=pair["edge"])
    assert FleetConfig(prompts=prompts, cloud=pair["cloud"], edge=pair["edge"]).cloud_device == "cpu"


def test_timing_and_memory_on_the_cpu_need_no_cuda():
    assert clock("cpu") <= clock()
    with tracked(memory := PeakMemoryTracker(), latency := LatencyTracker()):
        torch.ones(1000).sum()
    assert latency.elapsed_s > 0 and memory.peak_rss_bytes > 0
    if not torch.cuda.is_available():
        assert memory.gpu is None and gpu_peaks() is None
