"""A sweep worker killed by a signal (a native crash in a runtime, the OOM killer): the generation it ran is
recorded `crashed` with the signal and the point named, a fresh worker takes the rest, a point that crashed
twice (reruns included) is recorded `failed` and never run again, and a crash while loading stops the sweep.
Real worker processes: a stand-in (tests/crash_worker.py) that crashes on cue instead of loading models."""
import json
from dataclasses import asdict

import pytest

from bench.core.point import Point
from bench.core.prompts import load_prompts
from bench.core.records import ResultsFile
from bench.derive.summary import summarize
from bench.measure.launch import WorkerProcess, death_line
from bench.measure.sweep.messages import Exit, PointDone, Running, Tick, is_exit
from bench.measure.sweep.sweep import _run_sweep, crashed_out
from bench.measure.sweep.sweep_config import SweepConfig
from bench.measure.sweep.worker import worker_main
from specdec.errors import SpecdecError
from tests.crash_worker import CRASH_PLAN, crash_main

K2 = "spec k=2 thr=0 policy=greedy drafter=model edge torch → cloud torch on prompt"


def grid(pair, prompts) -> SweepConfig:
    """cloud, edge, spec k=1, spec k=2: four points x three prompts."""
    return SweepConfig.from_mapping({"edge": pair["edge"], "cloud": pair["cloud"], "prompts": [prompts],
                                     "mode": ["cloud", "edge", "spec"], "k": [1, 2], "entropy_threshold": [0],
                                     "policy": ["greedy"], "dtype": ["float32"], "max_new_tokens": 4})


def sweep(config, out, monkeypatch, **plan) -> tuple[dict, list[dict]]:
    monkeypatch.setenv(CRASH_PLAN, json.dumps({"once": False, **plan}))  # the spawned worker reads it
    out.mkdir(exist_ok=True)
    prompts = {name: load_prompts(name) for name in config.prompts}
    counts = _run_sweep(config, prompts, out, False, target=crash_main)
    return counts, ResultsFile(out / "results.jsonl").read()


def test_death_lines_name_the_signal():
    assert death_line(-11) == "a native crash (SIGSEGV)"
    assert death_line(-6) == "a native crash (SIGABRT)"
    assert death_line(-9) == "killed (SIGKILL: out of memory, or another process)"
    assert death_line(-15) == "killed by SIGTERM"
    assert death_line(-200) == "killed by signal 200"  # no such signal: still a line
    assert death_line(1) == "exit code 1"


@pytest.mark.subprocess
def test_the_real_worker_says_what_it_runs_before_it_runs_it(pair, prompts, tmp_path):
    """The protocol the stand-in imitates: `running` (its warm-up, then the generation) before each tick."""
    config = grid(pair, prompts)
    k2 = next(p for p in config.points() if p.k == 2)
    worker = WorkerProcess(worker_main, asdict(config), [(k2, [("p0", 0), ("p1", 0)])], str(tmp_path), {}).start()
    try:
        messages, exitcode = list(worker.messages(last=is_exit)), worker.wait()
    finally:
        worker.stop()
    assert exitcode == 0
    key = k2.key()
    assert messages == [Running(key, "p0", 0, f"{K2} p0 (its warm-up)"), Running(key, "p0", 0, f"{K2} p0"), Tick(),
                        Running(key, "p1", 0, f"{K2} p1"), Tick(), PointDone(key), Exit()]


@pytest.mark.subprocess
@pytest.mark.parametrize("name, said", [
    ("SIGSEGV", f"a native crash (SIGSEGV) in torch while running {K2} p0"),
    ("SIGILL", f"a native crash (SIGILL) in torch while running {K2} p0"),
    ("SIGKILL", f"killed (SIGKILL: out of memory, or another process) while running {K2} p0"),
])
def test_a_crash_is_recorded_with_its_signal_and_a_fresh_worker_goes_on(pair, prompts, tmp_path, monkeypatch,
                                                                         name, said):
    counts, rows = sweep(grid(pair, prompts), tmp_path / "s", monkeypatch, signal=name, k=2, once=True)
    crashed = [r for r in rows if r["status"] == "crashed"]
    assert [r["error"] for r in crashed] == [said]
    ok = {(Point.from_row(r).key(), r["id"]) for r in rows if r["status"] == "ok"}
    assert (Point.from_row(crashed[0]).key(), "p0") in ok  # its point's key: the fresh worker redid that prompt
    assert len(ok) == 4 * 3 and counts == {"ok": 12, "crashed": 1}


@pytest.mark.subprocess
def test_a_point_that_crashes_twice_fails_alone_and_a_rerun_keeps_it_so(pair, prompts, tmp_path, monkeypatch):
    config = grid(pair, prompts)
    counts, rows = sweep(config, tmp_path / "s", monkeypatch, signal="SIGSEGV", k=2)
    crashed = [r for r in rows if r["status"] == "crashed"]
    assert [(r["k"], r["id"]) for r in crashed] == [(2, "p0"), (2, "p0")]  # the first try, then the fresh worker's
    last = f"a native crash (SIGSEGV) in torch while running {K2} p0"
    assert crashed[-1]["error"] == last
    failed = [r for r in rows if r["status"] == "failed"]
    assert sorted((r["k"], r["id"]) for r in failed) == [(2, "p0"), (2, "p1"), (2, "p2")]
    assert {r["error"] for r in failed} == {f"crashed 2 times, last: {last}"}
    assert all(r["status"] == "ok" for r in rows if r["k"] != 2) and counts["ok"] == 3 * 3
    assert crashed_out(rows) == {Point.from_row(crashed[0]).label(): last}
    assert summarize([r for r in rows if r["status"] != "ok"]).empty  # crashed and failed rows measure nothing
    # A rerun (the point would crash again) runs nothing: its failed items are done, every row is kept.
    assert sweep(config, tmp_path / "s", monkeypatch, signal="SIGSEGV", k=2)[1] == rows


@pytest.mark.subprocess
def test_crashes_count_across_reruns(pair, prompts, tmp_path, monkeypatch):
    """A crash recorded by an earlier run counts: this run's first crash of the point is its second."""
    config = grid(pair, prompts)
    k2 = next(p for p in config.points() if p.k == 2)
    (tmp_path / "s").mkdir()
    ResultsFile(tmp_path / "s" / "results.jsonl").append(
        {"id": "p1", **k2.record(sweep=True), "repeat": 0, "status": "crashed", "error": "an earlier run's crash"})
    counts, rows = sweep(config, tmp_path / "s", monkeypatch, signal="SIGILL", k=2)
    assert counts == {"ok": 9, "crashed": 2, "failed": 3}
    assert {r["error"] for r in rows if r["status"] == "failed"} == {
        f"crashed 2 times, last: a native crash (SIGILL) in torch while running {K2} p0"}


@pytest.mark.subprocess
def test_a_crash_while_loading_stops_the_sweep(pair, prompts, tmp_path, monkeypatch):
    with pytest.raises(SpecdecError, match=r"^a sweep worker died while loading models: a native crash \(SIGSEGV\); "
                                           "rerun the same command to resume$"):
        sweep(grid(pair, prompts), tmp_path / "s", monkeypatch, signal="SIGSEGV", k=None)
    assert not (tmp_path / "s" / "results.jsonl").exists()
