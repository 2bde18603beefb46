"""A stand-in sweep worker for tests/test_sweep_crash.py: it speaks the real worker's queue protocol
(bench/measure/sweep/messages.py) and appends to the folder as the real one does, but loads no model (its ok
records hold the point's fields only), and kills itself with a signal where the plan in CRASH_PLAN says.
Module-level, so a spawned process can import it."""
from __future__ import annotations

import json
import os
import signal
from pathlib import Path

from bench.core.point import Point
from bench.core.records import ResultsFile
from bench.measure.launch import bind_to_parent
from bench.measure.sweep.messages import PointDone, Running, Tick
from bench.measure.sweep.worker import describe, exit_worker

# JSON: {"signal": "SIGSEGV", "k": 2 (the spec point that dies; null: die while loading), "once": true (only
# while the point has no crashed record yet) or false (every time)}
CRASH_PLAN = "SPECBENCH_TEST_CRASH_PLAN"


def die(name: str) -> None:
    number = signal.Signals[name]
    if number != signal.SIGKILL:  # (which has no handler to reset)
        signal.signal(number, signal.SIG_DFL)  # a handler (faulthandler's) would catch it
    os.kill(os.getpid(), number)


def crash_main(config_dict: dict, group: list, out: str, urls: dict, queue, parent: int) -> None:
    bind_to_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    plan = json.loads(os.environ[CRASH_PLAN])
    if plan["k"] is None:
        die(plan["signal"])
    results = ResultsFile(Path(out) / "results.jsonl")
    rows = results.read()
    done = {(Point.from_row(r).key(), r["id"], r.get("repeat", 0)) for r in rows if r["status"] != "crashed"}
    crashed = {Point.from_row(r).key() for r in rows if r["status"] == "crashed"}
    for point, items in group:
        key = point.key()
        for prompt_id, repeat in items:
            if (key, prompt_id, repeat) in done:
                continue
            queue.put(Running(key, prompt_id, repeat, describe(point, prompt_id)))
            if point.k == plan["k"] and not (plan["once"] and key in crashed):
                die(plan["signal"])
            results.append({"id": prompt_id, **point.record(sweep=True), "repeat": repeat, "status": "ok"})
            queue.put(Tick())
        queue.put(PointDone(key))
    exit_worker(queue, 0)
