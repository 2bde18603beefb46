"""`specbench sweep`: grid, resume, per-point summary, caps and bad configs (tiny models)."""
import argparse
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from bench.cli import main
from bench.commands.options import add_sweep_options, sweep_from_args
from bench.core.point import Point
from bench.core.records import ResultsFile
from bench.derive.metrics import expected_speedup
from bench.derive.summary import summarize
from bench.measure.sweep.sweep_config import SweepConfig

pytestmark = pytest.mark.subprocess  # see CONTRIBUTING.md: the quick loop leaves these out


def sweep(pair, prompts, out, *extra):
    return main(["sweep", "--edge", pair["edge"], "--cloud", pair["cloud"], "--prompts", prompts, "--out", str(out),
                 "--max-new-tokens", "8", "--dtype", "float32", *map(str, extra)])


def test_grid_runs_resumes_and_summarizes(pair, prompts, tmp_path, capsys):
    out = tmp_path / "s"
    args = ("--mode", "cloud,edge,spec", "--k", "1,3", "--entropy-threshold", "0,inf", "--policy", "greedy", "--network", "4g")
    assert sweep(pair, prompts, out, *args) == 0
    rows = ResultsFile(out / "results.jsonl").read()
    # cloud and edge once each, spec 2 k x 2 thresholds: 6 points x 3 prompts
    assert len(rows) == 18 and all(r["status"] == "ok" for r in rows)
    assert {r["network"] for r in rows} == {"4g"}
    cloud = {r["id"]: r["tokens"] for r in rows if r["mode"] == "cloud"}
    for r in rows:
        if r["mode"] == "spec" and r["entropy_threshold"] == 0:
            assert r["tokens"] == cloud[r["id"]]  # greedy, every block verified: lossless
            assert r["uplink_bytes"] > 0 and r["latency_with_network_s"] > r["latency_s"]
        if r["mode"] == "spec" and r["entropy_threshold"] == float("inf"):
            assert r["cloud_calls"] == 0 and r["uplink_bytes"] == 0
    summary = (out / "summary.csv").read_text()
    assert "speedup_vs_cloud" in summary and "theoretical_speedup" in summary
    capsys.readouterr()
    assert sweep(pair, prompts, out, *args) == 0  # resume: nothing recomputed
    assert len(ResultsFile(out / "results.jsonl").read()) == 18
    assert sweep(pair, prompts, out, "--mode", "edge") == 2
    assert "different sweep configuration (differs in" in capsys.readouterr().err


def test_points_are_timed_interleaved_per_prompt_and_repeats_resume(pair, prompts, tmp_path):
    """Within a worker every point runs a prompt before any point runs the next one (the baselines
    and spec points of a prompt back to back), in a rotating order; --repeats 2 does that round
    twice, and a rerun finds everything done."""
    out = tmp_path / "r"
    args = ("--mode", "cloud,edge,spec", "--k", "1,2", "--policy", "greedy", "--repeats", "2")
    assert sweep(pair, prompts, out, *args) == 0
    rows = ResultsFile(out / "results.jsonl").read()
    points = 4  # cloud, edge, spec k=1, spec k=2
    assert len(rows) == points * 3 * 2
    rounds = [rows[i:i + points] for i in range(0, len(rows), points)]
    for number, round_ in enumerate(rounds):
        assert {(r["id"], r["repeat"]) for r in round_} == {(f"p{number % 3}", number // 3)}  # one prompt per round
        assert len({(r["mode"], r["k"]) for r in round_}) == points  # every point once
    firsts = {(rounds[n][0]["mode"], rounds[n][0]["k"]) for n in range(len(rounds))}
    assert len(firsts) > 1  # the order rotates
    assert sweep(pair, prompts, out, *args) == 0 and len(ResultsFile(out / "results.jsonl").read()) == len(rows)
    summary = summarize(ResultsFile(out / "results.jsonl").read())
    assert set(summary["n_prompts"]) == {3}  # repeats collapse to one row per prompt


ROOT = Path(__file__).resolve().parents[1]
WORKER_WITH_A_LOCK = """
import multiprocessing
from bench.measure.sweep.messages import Exit
from bench.measure.sweep.worker import exit_worker

def child(queue):
    from tqdm import tqdm
    for _ in tqdm(range(2)):  # a progress bar, as transformers shows loading a real model: tqdm makes a semaphore
        pass
    exit_worker(queue, 3)

if __name__ == "__main__":
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    worker = ctx.Process(target=child, args=(queue,), daemon=True)
    worker.start()
    assert queue.get(timeout=120) == Exit()
    worker.join()
    print("exit code", worker.exitcode)
"""


def test_a_worker_leaves_no_semaphore_behind(tmp_path):
    """The worker's shutdown path unlinks what the worker made: no resource-tracker warning."""
    script = tmp_path / "worker_with_a_lock.py"
    script.write_text(WORKER_WITH_A_LOCK)
    # (not -W error: the resource tracker, a process of its own, would then swallow its warning)
    done = subprocess.run([sys.executable, str(script)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert "exit code 3" in done.stdout, done.stderr
    assert "leaked" not in done.stderr and "Warning" not in done.stderr, done.stderr


def test_a_sweep_ends_without_warnings(pair, prompts, tmp_path):
    """A normal sweep, run as a user runs it: its stderr has no leaked semaphores and no warnings."""
    done = subprocess.run([sys.executable, "-m", "bench.cli", "sweep", "--edge", pair["edge"], "--cloud", pair["cloud"],
                           "--prompts", prompts, "--out", str(tmp_path / "s"), "--max-new-tokens", "4",
                           "--dtype", "float32", "--mode", "cloud,spec", "--k", "2"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "leaked" not in done.stderr and "Warning" not in done.stderr, done.stderr


def test_memory_cap_is_recorded_and_the_sweep_goes_on(pair, prompts, tmp_path):
    out = tmp_path / "cap"
    # The tiny edge's weights fit in 0.05 GiB, but a Python + torch worker does not.
    assert sweep(pair, prompts, out, "--mode", "cloud,edge", "--edge-memory-gb", "0.05") == 0
    rows = ResultsFile(out / "results.jsonl").read()
    statuses = {(r["mode"], r["status"]) for r in rows}
    assert ("edge", "over_memory_cap") in statuses and ("cloud", "ok") in statuses
    over = [r for r in rows if r["status"] == "over_memory_cap"]
    assert len(over) == 1 and "over the 0.05 GiB cap" in over[0]["error"] and over[0]["edge_memory_gb"] == 0.05


def test_summary_math_on_synthetic_rows():
    def row(mode, pid, latency, tokens, **kw):
        base = dict(id=pid, mode=mode, dtype="float32", prompts="p", policy=None, k=None, entropy_threshold=None,
                    accept_threshold=None, verifier=None, status="ok", text="说话人语速平缓，情绪稳定。", tokens=[1, 2, 3],
                    new_tokens=tokens, latency_s=latency, ttft_s=0.1, tpot_s=0.01, num_draft_tokens=0, num_accepted_tokens=0,
                    cloud_calls=0, cycles=tokens, edge_s=0, cloud_s=0, overhead_s=0.0, punct_density=0.1, peak_rss_bytes=1)
        return {**base, **kw}

    spec = dict(policy="greedy", k=4, entropy_threshold=0.0, accept_threshold=0.1, verifier="cached")
    rows = [row("cloud", "a", 4.0, 8), row("cloud", "b", 4.0, 8), row("edge", "a", 1.0, 8), row("edge", "b", 1.0, 8),
            row("spec", "a", 2.0, 8, num_draft_tokens=8, num_accepted_tokens=6, cloud_calls=2, cycles=2, **spec),
            row("spec", "b", 2.0, 8, num_draft_tokens=8, num_accepted_tokens=6, cloud_calls=2, cycles=2, **spec)]
    summary = summarize(rows).set_index("mode")
    point = summary.loc["spec"]
    assert point["tokens_per_s"] == 4.0 and point["speedup_vs_cloud"] == 2.0 and point["speedup_vs_edge"] == 0.5
    assert point["acceptance_rate"] == 0.75 and point["cloud_call_rate"] == 1.0
    assert point["cost_ratio_c"] == 0.25  # cloud 2 tok/s / edge 8 tok/s
    assert point["theoretical_speedup"] == pytest.approx((1 - 0.75**5) / (0.25 * 2.0))
    assert point["chrf_vs_cloud"] == 100.0 and point["token_match_vs_cloud"] == 1.0


def synthetic(mode, pid, latency, tokens, repeat=0, **kw):
    base = dict(id=pid, mode=mode, dtype="float32", prompts="p", policy=None, k=None, entropy_threshold=None,
                accept_threshold=None, verifier=None, status="ok", text="说话人语速平缓，情绪稳定。", tokens=[1, 2, 3],
                new_tokens=tokens, latency_s=latency, ttft_s=0.1, tpot_s=0.01, num_draft_tokens=0, num_accepted_tokens=0,
                cloud_calls=0, cycles=tokens, edge_s=0, cloud_s=0, overhead_s=0.0, punct_density=0.1, peak_rss_bytes=1,
                repeat=repeat)
    return {**base, **kw}


def test_intervals_pair_prompts_with_their_baseline_run():
    """Prompt difficulty cancels in the paired speed-up: each prompt's spec run is 2x its cloud run,
    so the interval is [2, 2] however much the prompts differ; the acceptance interval spans the
    per-prompt rates; with one prompt there is no interval."""
    spec = dict(policy="greedy", k=4, entropy_threshold=0.0, accept_threshold=0.1, verifier="cached", cycles=2, cloud_calls=1)
    rows = []
    for pid, cloud_s, accepted in (("a", 1.0, 8), ("b", 4.0, 4), ("c", 9.0, 2), ("d", 2.0, 6)):
        rows += [synthetic("cloud", pid, cloud_s, 8),
                 synthetic("spec", pid, cloud_s / 2, 8, num_draft_tokens=8, num_accepted_tokens=accepted, **spec)]
    point = summarize(rows).set_index("mode").loc["spec"]
    assert point["speedup_vs_cloud"] == pytest.approx(2.0)
    assert (point["speedup_vs_cloud_ci_low"], point["speedup_vs_cloud_ci_high"]) == pytest.approx((2.0, 2.0))
    assert 0.25 <= point["acceptance_rate_ci_low"] < point["acceptance_rate"] < point["acceptance_rate_ci_high"] <= 1.0
    assert point["cloud_call_rate_ci_low"] == point["cloud_call_rate_ci_high"] == 0.5
    assert point["chrf_vs_cloud_ci_low"] == point["chrf_vs_cloud_ci_high"] == 100.0
    # the same prompts unpaired would scatter: the interval on a noisy pairing is wide
    noisy = [r if r["mode"] == "cloud" else {**r, "latency_s": r["latency_s"] * (3 if r["id"] in "ab" else 1)} for r in rows]
    wide = summarize(noisy).set_index("mode").loc["spec"]
    assert wide["speedup_vs_cloud_ci_low"] < 1.0 < wide["speedup_vs_cloud_ci_high"]
    one = summarize([r for r in rows if r["id"] == "a"]).set_index("mode").loc["spec"]
    assert one["speedup_vs_cloud"] == pytest.approx(2.0) and one["speedup_vs_cloud_ci_low"] != one["speedup_vs_cloud_ci_low"]


def test_repeats_count_each_prompt_once_with_its_median_time():
    rows = [synthetic("cloud", pid, latency, 8, repeat=r) for pid in "ab" for r, latency in enumerate((4.0, 40.0, 5.0))]
    point = summarize(rows).set_index("mode").loc["cloud"]
    assert point["n_prompts"] == 2 and point["latency_total_s"] == 10.0  # median 5.0 per prompt, not the 40 s outlier


def test_terminal_table_shows_every_varying_axis_and_the_intervals():
    from bench.derive.summary import terminal_table

    spec = dict(k=4, entropy_threshold=0.0, accept_threshold=0.1, verifier="cached", num_draft_tokens=8,
                num_accepted_tokens=6, cloud_calls=2, cycles=2)
    rows = [synthetic("cloud", pid, 4.0 + i, 8) for i, pid in enumerate("ab")]
    rows += [synthetic("spec", pid, 2.0 + i, 8, policy=policy, **spec) for policy in ("greedy", "threshold")
             for i, pid in enumerate("ab")]
    table = terminal_table(summarize(rows))
    header, *lines = table.splitlines()
    assert "policy" in header.split() and "mode" in header.split() and "k" not in header.split()  # k does not vary
    assert len({line for line in lines}) == len(lines) == 3  # greedy and threshold rows no longer look alike
    assert "[" in lines[1] and "-" in lines[1].split("[")[1]


def test_expected_speedup_limits():
    assert expected_speedup(0.0, 4, 0.1) == pytest.approx(1 / 1.4)  # nothing accepted: pay for the drafts
    assert expected_speedup(1.0, 4, 0.0) == 5.0  # perfect free drafter: k+1 tokens per cloud call


@pytest.mark.parametrize(
    "toml,message",
    [
        ("k = [0]", "k must be >= 1, got 0"),
        ("network = 'carrier-pigeon'", "carrier-pigeon"),
        ("mode = ['spec']\nedge = 'x'", "no cloud model"),
        ("colour = 'blue'", "unknown setting 'colour'"),
        ("k = [", "not valid TOML"),
        ("entropy_threshold = ['high']", "must be a list of numbers"),
        ("plain_runtimes = ['onnx']", "unknown plain runtime 'onnx': use one of torch, torch-int8, torch-int8t, llamacpp"),
        ("plain_runtimes = 'torch-int8'", "plain_runtimes must be"),
    ],
)
def test_bad_sweep_configs(tmp_path, capsys, toml, message):
    config = tmp_path / "sweep.toml"
    config.write_text("edge = 'e'\ncloud = 'c'\n" + toml if "edge" not in toml else toml)
    assert main(["sweep", "--config", str(config), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def test_unreachable_cap_is_refused(pair, prompts, tmp_path, capsys):
    # Weights of the tiny edge are ~150 KB: a cap of 100 KB is below the model itself.
    assert sweep(pair, prompts, tmp_path / "u", "--mode", "edge", "--edge-memory-gb", str(100e3 / 2**30)) == 2
    assert "is below the edge model" in capsys.readouterr().err


def test_config_points_dedupe_baselines():
    config = SweepConfig.from_mapping({"edge": "e", "cloud": "c", "mode": ["edge", "cloud", "spec"], "k": [2, 4],
                                       "entropy_threshold": [0, 1]})
    modes = [p.mode for p in config.points()]
    assert modes.count("edge") == 1 and modes.count("cloud") == 1 and modes.count("spec") == 4


def test_points_are_points_in_the_grids_order_holding_the_sweeps_settings():
    config = SweepConfig.from_mapping({"edge": "e", "cloud": "c", "mode": ["cloud", "spec"], "k": [2, 4],
                                       "deployment": ["inproc", "split"], "link": ["4g"], "split_cores": "shared",
                                       "plain_runtimes": ["torch-int8"], "max_new_tokens": 8})
    points = config.points()
    assert all(isinstance(p, Point) for p in points)
    # mode outermost, deployment inside k; a cloud point once (k and deployment do not apply), then in
    # each plain runtime; a split point followed by its co-located baseline
    assert [(p.mode, p.cloud_runtime, p.k, p.deployment, p.link, p.overlap) for p in points] == [
        ("cloud", "torch", None, "inproc", None, None), ("cloud", "torch-int8", None, "inproc", None, None),
        ("spec", "torch", 2, "inproc", None, None), ("spec", "torch", 2, "split", "4g", "auto"),
        ("spec", "torch", 2, "colocated", None, None),
        ("spec", "torch", 4, "inproc", None, None), ("spec", "torch", 4, "split", "4g", "auto"),
        ("spec", "torch", 4, "colocated", None, None)]
    cloud, spec = points[0], points[2]
    assert (cloud.edge, cloud.cloud, cloud.max_new_tokens, cloud.policy) == (None, "c", 8, None)
    assert (spec.edge, spec.cloud, spec.max_new_tokens, spec.policy) == ("e", "c", 8, "threshold")
    assert pickle.loads(pickle.dumps(points)) == points  # they travel to spawned workers and Ray tasks


def test_plain_runtimes_add_baselines_not_speculative_points():
    """The main job times plain decoding in the fastest runtime too, without paying for a spec grid in it."""
    config = SweepConfig.from_mapping({"edge": "e", "cloud": "c", "mode": ["edge", "cloud", "spec"], "k": [2, 4],
                                       "edge_runtime": ["torch"], "cloud_runtime": ["torch-int8"],
                                       "plain_runtimes": ["torch-int8", "torch"]})
    points = {(p.mode, p.edge_runtime, p.cloud_runtime, p.k) for p in config.points()}
    assert points == {("edge", "torch", None, None), ("edge", "torch-int8", None, None),
                      ("cloud", None, "torch-int8", None), ("cloud", None, "torch", None),
                      ("spec", "torch", "torch-int8", 2), ("spec", "torch", "torch-int8", 4)}
    assert len(config.points()) == len(points)  # a runtime the grid already has adds nothing twice
    assert config.identity()["plain_runtimes"] == ["torch-int8", "torch"]


def test_plain_runtimes_flag_takes_a_comma_separated_list(tmp_path):
    parser = argparse.ArgumentParser()
    add_sweep_options(parser)
    args = parser.parse_args(["--out", str(tmp_path / "o"), "--edge", "e", "--cloud", "c",
                              "--plain-runtimes", "torch-int8,torch"])
    assert sweep_from_args(args).plain_runtimes == ("torch-int8", "torch")


def test_peak_memory_tracker_sees_the_blocks_own_peak():
    import mmap

    from bench.measure.trackers import LatencyTracker, PeakMemoryTracker, tracked

    def touch(mib: int) -> None:
        """`mib` MiB made resident and let go, in a mapping of its own. A numpy block of 300 MiB once
        raised no peak at all in the full suite on a busy machine (not reproduced alone): an allocator
        may serve a block from memory freed earlier and still resident, a fresh mapping cannot."""
        with mmap.mmap(-1, mib << 20) as block:
            for offset in range(0, mib << 20, mmap.PAGESIZE):
                block[offset] = 1

    high = PeakMemoryTracker()
    with tracked(high):
        touch(300)
    low, latency = PeakMemoryTracker(), LatencyTracker()
    with tracked(low, latency):
        touch(1)
    # The reset on entry forgets the earlier 300 MiB peak: the second block's peak is its own.
    assert high.peak_rss_bytes - low.peak_rss_bytes > 200 << 20
    assert latency.elapsed_s > 0
