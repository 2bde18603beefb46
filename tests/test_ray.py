"""`specbench sweep --executor ray` on a local Ray instance (2 CPUs), tiny pair, fp32: the same
tokens and counters as the local executor; a killed task's worker and a killed driver both leave
every finished row intact and none computed twice; a cluster without room, a bad address and a
missing Ray are one `error:` line. CI installs Ray with the `test` extra: these run, not skip."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
import ray

from bench.cli import main
from bench.core.records import ResultsFile
from bench.measure.sweep.messages import Ended, Exit, Started
from bench.read.report.recommend import node_notes

pytestmark = pytest.mark.cluster  # see CONTRIBUTING.md: the quick loop leaves these out

ROOT = Path(__file__).resolve().parents[1]
COUNTERS = ("tokens", "new_tokens", "num_draft_tokens", "num_accepted_tokens", "cloud_calls", "cycles", "status")


@pytest.fixture(scope="module")
def cluster():
    """A Ray instance for this module; its GCS address for a driver in another process."""
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=100 << 20, log_to_driver=False,
             logging_level="ERROR")
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


@pytest.fixture(scope="module")
def many(tmp_path_factory) -> str:
    """Enough prompts (and tokens) for a sweep to be killed mid-way."""
    path = tmp_path_factory.mktemp("many") / "many.jsonl"
    path.write_text("".join(json.dumps({"id": f"b{i}", "prompt": f"hello number {i}"}) + "\n" for i in range(16)))
    return str(path)


def sweep_args(pair, prompts, out, *extra) -> list[str]:
    return ["sweep", "--edge", pair["edge"], "--cloud", pair["cloud"], "--prompts", prompts, "--out", str(out),
            "--max-new-tokens", "8", "--dtype", "float32", "--mode", "cloud,edge,spec", "--k", "1,3",
            "--policy", "greedy", *map(str, extra)]


def by_run(path: Path) -> dict:
    rows = ResultsFile(path).read()
    keyed = {(r["id"], r["mode"], r["k"], r.get("repeat", 0)): r for r in rows}
    assert len(keyed) == len(rows), "a (prompt, point) was computed twice"
    return keyed


def complete_lines(path: Path) -> bytes:
    data = path.read_bytes()
    return data[: data.rfind(b"\n") + 1]


def wait_for_records(path: Path, n: int, alive=lambda: True, timeout_s: float = 900) -> None:
    """Until `n` complete records are in `path`, the driver dies (alive() false: fail now) or `timeout_s`
    passes: a bound against a hang, not a speed check. A driver process on a 2-core machine with the other
    core busy took over 120 s to its first record (Ray workers importing torch on one core), and the old
    120 s bound failed two tests there."""
    start = time.monotonic()
    while not (path.is_file() and complete_lines(path).count(b"\n") >= n):
        assert alive() and time.monotonic() - start < timeout_s, "no records came"
        time.sleep(0.05)


def test_ray_and_local_give_the_same_tokens_and_counters(cluster, pair, prompts, tmp_path):
    # --edge-cores 1: two tasks per group on the 2-CPU instance, each on a share of the prompts
    assert main(sweep_args(pair, prompts, tmp_path / "ray", "--executor", "ray", "--edge-cores", 1)) == 0
    assert main(sweep_args(pair, prompts, tmp_path / "local", "--edge-cores", 1)) == 0
    on_ray, local = by_run(tmp_path / "ray" / "results.jsonl"), by_run(tmp_path / "local" / "results.jsonl")
    assert len(on_ray) == 4 * 3 and on_ray.keys() == local.keys()
    for key, row in on_ray.items():
        assert {c: row[c] for c in COUNTERS} == {c: local[key][c] for c in COUNTERS}, key
        assert row["node"] == local[key]["node"] and row["node"]["hostname"] and row["edge_cores"] == 1
    # where a sweep runs is not part of its identity: the local executor resumes the ray one's folder
    assert main(sweep_args(pair, prompts, tmp_path / "ray", "--edge-cores", 1)) == 0
    assert len(by_run(tmp_path / "ray" / "results.jsonl")) == 12


def group_tasks() -> list[psutil.Process]:
    """The Ray workers running a task of the sweep now under way: each has its sweep worker (a spawned
    child) alive. An earlier test's worker can still be titled `ray::group_task` after its task ended
    (on a busy machine, for tens of seconds), its sweep worker gone: killing that one would test nothing."""
    def sweeping(p: psutil.Process) -> bool:
        try:
            return any("multiprocessing.spawn" in " ".join(c.cmdline()) and c.status() != psutil.STATUS_ZOMBIE
                       for c in p.children())
        except psutil.Error:
            return False

    return [p for p in psutil.process_iter(["cmdline"])
            if (p.info["cmdline"] or [""])[0] == "ray::group_task" and sweeping(p)]


def test_a_killed_worker_loses_only_its_unfinished_prompt(cluster, pair, many, tmp_path, capsys):
    out = tmp_path / "killed-worker"
    argv = sweep_args(pair, many, out, "--executor", "ray", "--edge-cores", 1, "--max-new-tokens", 48)
    code = []
    driver = threading.Thread(target=lambda: code.append(main(argv)))
    driver.start()
    try:
        wait_for_records(out / "results.jsonl", 3, driver.is_alive)
        tasks = group_tasks()
        assert tasks, "no ray::group_task process found"
        tasks[0].kill()  # a Ray worker, mid-prompt: its sweep worker dies with it
        kept = complete_lines(out / "results.jsonl")
    finally:
        driver.join(300)
    said = capsys.readouterr()
    assert code == [0], said.err
    assert "was lost (WorkerCrashedError" in said.out  # the progress bar's line (tqdm.write), as for a capped point
    assert (out / "results.jsonl").read_bytes().startswith(kept)  # finished rows byte for byte
    rows = by_run(out / "results.jsonl")  # and none twice
    assert len(rows) == 4 * 16 and all(r["status"] == "ok" for r in rows.values())


def test_a_killed_driver_resumes_with_every_finished_row(cluster, pair, many, tmp_path):
    out = tmp_path / "killed-driver"
    argv = sweep_args(pair, many, out, "--executor", "ray", "--ray-address", cluster, "--max-new-tokens", 48)
    driver = subprocess.Popen([sys.executable, "-m", "bench.cli", *argv], cwd=ROOT, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_records(out / "results.jsonl", 3, lambda: driver.poll() is None)
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait(60)
    kept = complete_lines(out / "results.jsonl")
    assert 3 <= kept.count(b"\n") < 4 * 16
    assert main(argv) == 0  # resumes: a torn last line is cut, the rest kept
    assert (out / "results.jsonl").read_bytes().startswith(kept)
    rows = by_run(out / "results.jsonl")
    assert len(rows) == 4 * 16 and all(r["status"] == "ok" for r in rows.values())


def test_sigterm_stops_a_ray_sweep_as_it_stops_a_local_one(cluster, pair, many, tmp_path):
    """Ray's driver handler made SIGTERM exit 15 with a native stack dump: now exit 130, one line."""
    out = tmp_path / "terminated"
    argv = sweep_args(pair, many, out, "--executor", "ray", "--ray-address", cluster, "--max-new-tokens", 48)
    driver = subprocess.Popen([sys.executable, "-m", "bench.cli", *argv], cwd=ROOT, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_records(out / "results.jsonl", 1, lambda: driver.poll() is None)
    finally:
        driver.send_signal(signal.SIGTERM)
    assert driver.wait(60) == 130
    err = driver.stderr.read().strip().splitlines()
    assert err[-1].startswith("interrupted: results written so far are kept") and "Traceback" not in "\n".join(err)


def refused(argv: list[str], capsys, expect: str) -> None:
    capsys.readouterr()
    assert main([str(a) for a in argv]) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and expect in errors[0] and "Traceback" not in err, err


@pytest.mark.parametrize("extra,expect", [
    (("--executor", "ray", "--edge-cores", 3), "no node of the Ray cluster has 3 CPUs"),
    (("--executor", "ray", "--ray-address", "127.0.0.1:1"), "no Ray cluster answers at 127.0.0.1:1"),
    (("--executor", "ray", "--ray-address", "headnode"), "--ray-address 'headnode' is not HOST:PORT"),
    (("--ray-address", "auto"), "--ray-address is for --executor ray"),
    (("--executor", "ray", "--deployment", "split"), "--executor ray runs in-process points only"),
])
def test_what_a_cluster_cannot_run_is_one_line_and_nothing_is_written(cluster, pair, prompts, tmp_path, capsys,
                                                                      extra, expect):
    out = tmp_path / "o"
    refused(sweep_args(pair, prompts, out, *extra), capsys, expect)
    assert not (out / "results.jsonl").exists()


def test_without_ray_installed_the_error_names_the_extra(pair, prompts, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # what `import ray` meets where Ray is not installed
    refused(sweep_args(pair, prompts, tmp_path / "o", "--executor", "ray"), capsys, "pip install -e '.[cluster]'")


def test_the_cli_does_not_import_ray():
    done = subprocess.run([sys.executable, "-c", "import sys, bench.cli; print('ray' in sys.modules)"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.stdout.strip() == "False", done.stderr


def test_the_report_warns_when_one_comparison_spans_nodes():
    def row(mode, host, prompts="code"):
        return {"id": "a", "mode": mode, "status": "ok", "prompts": prompts, "dtype": "float32",
                "node": {"hostname": host, "cpu_model": f"{host} cpu"}}

    assert node_notes([row("cloud", "n1"), row("spec", "n1"), row("cloud", "n2", "zh")]) == []
    (note,) = node_notes([row("cloud", "n1"), row("spec", "n2"), row("cloud", "n1", "zh")])
    assert note.startswith("code (float32): timing points come from 2 different nodes (n1: n1 cpu; n2: n2 cpu)")


def test_tasks_on_one_node_claim_different_cores():
    """Ray counts CPUs but does not say which: each task takes cores no other task holds, and a node
    whose Ray CPUs overstate its cores is one line."""
    script = ("from bench.measure.sweep.cluster import claim_cores\nfrom specdec.errors import ConfigError\n"
              "claimed = [claim_cores(1) for _ in range(len(__import__('os').sched_getaffinity(0)))]\n"
              "print(sorted(c for cores in claimed for c in cores) == sorted(__import__('os').sched_getaffinity(0)))\n"
              "try:\n    claim_cores(1)\nexcept ConfigError as e:\n    print(e)\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    lines = done.stdout.splitlines()
    assert lines[0] == "True" and "free cores for --edge-cores 1: its Ray CPUs overstate its cores" in lines[1], done


def test_a_task_waits_for_cores_an_ended_task_still_holds():
    """Ray gives an ended task's CPUs to the next task before its worker process (which holds the core
    locks) has exited: with the other core busy, the next task found every core locked and failed. A
    claim now waits for them, holding none meanwhile; with no wait it refuses at once."""
    script = """
import os, subprocess, sys, time
from bench.measure.sweep.cluster import claim_cores
from specdec.errors import ConfigError
holder = subprocess.Popen([sys.executable, "-c", "import os, sys\\nfrom bench.measure.sweep.cluster import claim_cores\\n"
                           "claim_cores(len(os.sched_getaffinity(0)))\\nprint('held', flush=True)\\nsys.stdin.read()"],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
assert holder.stdout.readline().strip() == "held"
try:
    claim_cores(1)
    print("claimed a held core")
except ConfigError as e:
    print("refused:", e)
try:
    claim_cores(1, wait_s=0.5)
    print("claimed a held core")
except ConfigError as e:
    print("waited:", e)
waits = []
real_sleep = time.sleep
def sleep(s):  # the first wait lets the holder end, as an ended task's worker finally exits
    waits.append(s)
    holder.stdin.close() if not holder.stdin.closed else None
    real_sleep(s)
time.sleep = sleep
print(claim_cores(1, wait_s=300), len(waits) > 0)
"""
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    lines = done.stdout.splitlines()
    assert len(lines) == 3 and lines[0].startswith("refused:") and "overstate its cores" in lines[0], done
    assert lines[1].startswith("waited:") and "another process holds them" in lines[1], done  # a bounded wait
    assert lines[2].endswith("True") and lines[2].startswith("["), done  # it waited, then claimed a core


def test_a_task_lets_its_cores_go_before_it_ends(monkeypatch):
    """The task's cores are free when it sends its exit code (before Ray counts it ended), not when its
    Ray worker process exits, which on a busy node came tens of seconds later."""
    from bench.measure.sweep import cluster

    class Worker:  # the sweep worker, done at once
        def __init__(self, *args):
            pass

        def start(self):
            return self

        def messages(self, last):
            yield Exit()

        def wait(self):
            return 0

    monkeypatch.setattr(cluster, "WorkerProcess", Worker)
    monkeypatch.setattr(cluster, "node_ray_cpus", lambda: 1, raising=False)
    monkeypatch.setattr(cluster.os, "sched_setaffinity", lambda pid, cores: None)
    probe = ("import os\nfrom bench.measure.sweep.cluster import claim_cores\n"
             "print(claim_cores(len(os.sched_getaffinity(0))))")

    def all_cores_free() -> bool:
        done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
        return done.returncode == 0

    task = cluster.group_task({"edge_cores": 1}, [])
    try:
        assert isinstance(next(task), Started)
        assert not all_cores_free()  # the task holds one while it runs
        assert next(task) == Exit()
        assert next(task) == Ended(0)
        assert all_cores_free()  # let go before the task's last message
    finally:
        task.close()
        cluster.release_cores()
