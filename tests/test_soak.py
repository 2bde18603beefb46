"""The soak's parts that need no minutes of load: its fault schedule, its config's refusals, the
judgement of its rows (bench/derive/soak_summary.py) on rows written here, and the server's `live`
counts it samples. The soak itself is a benchmark (bench/test_bench_soak.py, marker `soak`)."""
from __future__ import annotations

import asyncio

import pytest

from bench.derive.soak_summary import last_run, p99_ratio, summarize_soak
from bench.measure.serving.clients import Connection
from bench.measure.serving.soak import FAULT_WINDOW, SoakConfig, schedule
from specdec.errors import ConfigError
from specdec.models.loading import load_model
from specdec.remote.background import BackgroundServer
from specdec.remote.server_config import ServeConfig

CONFIG = dict(edge="e", cloud="c", prompts="p")


def test_the_schedule_is_drawn_from_the_seed_and_stays_in_the_fault_window():
    config = SoakConfig(**CONFIG, duration_s=1200, edges=4)
    faults = schedule(config)
    assert faults == schedule(config) and faults != schedule(SoakConfig(**CONFIG, duration_s=1200, edges=4, seed=1))
    start, end = (share * 1200 for share in FAULT_WINDOW)
    assert all(start <= f["t"] < end for f in faults)
    kinds = [f["fault"] for f in faults]
    assert {"vanish", "slow_reader", "server_stop"} <= set(kinds) and kinds.count("server_stop") == 1
    kills = [f["t"] for f in faults if f["fault"] == "edge_kill"]
    assert all(10 <= b - a <= 30 for a, b in zip(kills, kills[1:])) and len(kills) >= 480 // 30
    assert all(0 <= f["edge"] < 4 for f in faults if f["fault"] == "edge_kill")
    assert [f["until"] - f["t"] for f in faults if f["fault"] == "server_stop"] == [5.0]


@pytest.mark.parametrize("bad, named", [
    (dict(edges=0), "edges"), (dict(duration_s=5), "duration_s"), (dict(kill_every_s=(30, 10)), "kill_every_s"),
    (dict(cloud_runtime="onnx"), "cloud_runtime"), (dict(k=0), "k"),
])
def test_a_bad_soak_config_is_refused_naming_the_field(bad, named):
    with pytest.raises(ConfigError, match=named):
        SoakConfig(**CONFIG, **bad)


def sample(t, phase, rss=100 << 20, fds=20, sessions=2, connections=2, tasks=10):
    return {"kind": "sample", "run": "r", "t": t, "phase": phase, "rss_bytes": rss, "fds": fds, "threads": 5,
            "sessions": sessions, "connections": connections, "tasks": tasks}


def generation(t, phase, client=0, incarnation=0, seq=0, status="ok", waits=(0.05, 0.06), error=None):
    row = {"kind": "generation", "run": "r", "t": t, "phase": phase, "client": client, "incarnation": incarnation,
           "seq": seq, "id": "p0", "status": status}
    if status == "ok":
        row.update(verify_wait_s=list(waits), replay_mismatches=0)
    else:
        row["error"] = error
    return row


def healthy() -> list[dict]:
    """A soak that went well: steady before and after, a fault in between that it recovered from."""
    rows = [{"kind": "baseline", "run": "r", "t": 0.0, "rss_bytes": 90 << 20, "fds": 12, "threads": 5, "connections": 0,
             "sessions": 0, "tasks": 4}]
    rows += [sample(t, "before") for t in range(10, 20)]
    rows += [generation(10 + i, "before", seq=i) for i in range(10)]
    rows += [{"kind": "fault", "run": "r", "t": 20.0, "fault": "edge_kill", "edge": 0, "at": 20.0},
             {"kind": "fault_end", "run": "r", "t": 20.0, "fault": "edge_kill", "at": 20.5}]
    rows += [sample(20 + t, "faults", fds=40 if t < 3 else 20, sessions=5 if t < 3 else 2) for t in range(10)]
    rows += [generation(20.1, "faults", seq=10, status="failed", error="the edge process was SIGKILLed by the soak (fault)")]
    rows += [generation(21 + i, "faults", incarnation=1, seq=i) for i in range(5)]
    rows += [sample(t, "after", rss=(100 << 20) + (2 << 20)) for t in range(30, 40)]
    rows += [generation(30 + i, "after", incarnation=1, seq=5 + i) for i in range(10)]
    rows += [{"kind": "end", "run": "r", "t": 43.0, "rss_bytes": 100 << 20, "fds": 12, "threads": 5, "connections": 0,
              "sessions": 0, "tasks": 4}]
    return rows


def test_a_healthy_soak_passes_every_check_with_its_figures():
    summary = summarize_soak(healthy())
    assert {name: c["ok"] for name, c in summary["checks"].items()} == dict.fromkeys(summary["checks"], True)
    assert summary["recoveries"] == [{"fault": "edge_kill", "t": 20.0, "ended_s": 20.5, "recovered_after_s": 2.5}]
    assert summary["failed"] == {"the edge process was SIGKILLed by the soak (fault)": 1}
    assert summary["rss_growth"] == pytest.approx(0.02)
    assert "+2.0%" in summary["checks"]["memory"]["figure"]


@pytest.mark.parametrize("damage, check", [
    (lambda rows: [r for r in rows if not (r["kind"] == "generation" and r["seq"] == 3 and r["incarnation"] == 1)],
     "nothing lost"),
    (lambda rows: [{**r, "replay_mismatches": 1} if r["kind"] == "generation" and r["status"] == "ok" and r["seq"] == 2 else r
                   for r in rows], "verdicts"),
    (lambda rows: [{**r, "rss_bytes": 120 << 20} if r["kind"] == "sample" and r["phase"] == "after" else r for r in rows],
     "memory"),
    (lambda rows: [{**r, "fds": 13} if r["kind"] == "end" else r for r in rows], "end state"),
    (lambda rows: [{**r, "sessions": 1} if r["kind"] == "end" else r for r in rows], "end state"),
    (lambda rows: [{**r, "tasks": 5} if r["kind"] == "end" else r for r in rows], "end state"),
    (lambda rows: [{**r, "fds": 40} if r["kind"] == "sample" and r["phase"] != "before" else r for r in rows], "recovery"),
    (lambda rows: [{**r, "verify_wait_s": [0.05, 0.5]} if r["kind"] == "generation" and r["phase"] == "after"
                   and r["status"] == "ok" else r for r in rows], "p99 verify wait"),
])
def test_each_kind_of_damage_fails_its_check_and_only_it(damage, check):
    checks = summarize_soak(damage(healthy()))["checks"]
    assert [name for name, c in checks.items() if not c["ok"]] == [check]


def test_the_p99_judges_block_verifies_and_reports_the_prompt_carrying_first_ones():
    """Coinciding prefills before the faults (first verifies 10x slower) are no server regression."""
    rows = [{**r, "verify_wait_s": [0.5, *r["verify_wait_s"][1:]]} if r["kind"] == "generation" and r["phase"] == "before"
            and r["status"] == "ok" else r for r in healthy()]
    check = summarize_soak(rows)["checks"]["p99 verify wait"]
    assert check["ok"] and "first verifies (with the prompt) 500 -> 50 ms, not judged" in check["rule"]


def test_only_the_last_finished_run_is_judged():
    interrupted = [{**r, "run": "old"} for r in healthy() if r["kind"] != "end"]
    assert last_run(interrupted + healthy()) == healthy()
    assert last_run(interrupted) == []


def test_the_p99_ratio_interval_holds_the_point_and_tightens_with_more_generations():
    before = [[0.05, 0.06, 0.07]] * 40
    after = [[0.05, 0.06, 0.08]] * 20 + [[0.05, 0.06, 0.07]] * 20
    ratio, low, high = p99_ratio(before, after)
    assert low <= ratio <= high and ratio > 1


@pytest.mark.server
def test_stats_tells_a_loopback_client_the_live_connections_sessions_and_tasks(pair):
    server = BackgroundServer(load_model(pair["cloud"], "float32"), ServeConfig())

    async def live(url: str) -> tuple[dict, dict]:
        async with Connection(url, None, 10) as holder:
            await holder.send("open", prompt_ids=[3, 4, 5], features=None, eos_ids=[], vocab=64, max_new_tokens=4,
                              temperature=0.0, seed=0, policy="greedy", accept_threshold=0.3, verifier="cached",
                              constraints="none")
            await holder.send("verify", base=3, new=[], draft=[6], probs=None)
            await holder.receive("verdict")
            async with Connection(url, None, 10) as watcher:
                await watcher.send("stats", since=1 << 40)
                held = (await watcher.receive("stats"))["live"]
        async with Connection(url, None, 10) as watcher:
            await asyncio.sleep(0.2)  # the holder's handler ends once its close arrives
            await watcher.send("stats", since=1 << 40)
            after = (await watcher.receive("stats"))["live"]
        return held, after

    with server as url:
        held, after = asyncio.run(live(url))
    assert held["connections"] == 2 and held["sessions"] == 1 and held["tasks"] >= 2
    assert after["connections"] == 1 and after["sessions"] == 0 and after["tasks"] < held["tasks"]
