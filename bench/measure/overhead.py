"""Harness overhead: what the sweep's instrumentation costs on top of the bare engine.

"Bare" is `Engine.generate` on a prompt and nothing else. "Instrumented" is exactly what a sweep
worker does for one (point, prompt): `generate_one` with its latency and peak-memory trackers,
the memory watchdog thread polling RSS every 50 ms, the network-cost decoration, the text-health
and record building, and the fsynced append to results.jsonl. Both run on the same engine and
models, interleaved prompt by prompt in alternating order, so drift and bursts of load hit both.
"""
from __future__ import annotations

import gc
import statistics
import tempfile
import time
from pathlib import Path

from bench.core.network import profile
from bench.core.point import Point
from bench.core.prompts import PromptRecord
from bench.core.records import ResultsFile
from bench.measure.caps import MemoryWatchdog
from bench.measure.run import generate_one
from bench.measure.sweep.worker import network_fields
from bench.measure.workload import Pair

NEVER = 1 << 50  # a memory cap that never fires: the watchdog runs, polls, and never stops the run


def instrumented(engine, record: PromptRecord, point: dict, results: ResultsFile, network) -> None:
    """One (point, prompt) as a sweep worker runs it (bench/measure/sweep/worker.py), with a memory cap set."""
    with MemoryWatchdog(NEVER, on_exceeded=lambda rss: None):
        generate_one(engine, record, point, results,
                     decorate=lambda row, g: row.update(network_fields(row, g, network)))


def harness_overhead(pair: Pair, mode: str = "spec", repeats: int = 3, network: str = "4g") -> dict:
    """Wall seconds of bare vs instrumented generation over the workload's prompts, `repeats`
    times. overhead = sum of per-prompt median instrumented / sum of per-prompt median bare - 1."""
    engine = pair.engines[mode]
    records = [PromptRecord(id=f"p{i}", prompt=text) for i, text in enumerate(pair.workload.prompts)]
    point = {**Point.of(engine, "workload").record(), "network": network}
    net = profile(network)
    bare: dict[str, list[float]] = {r.id: [] for r in records}
    harness: dict[str, list[float]] = {r.id: [] for r in records}
    with tempfile.TemporaryDirectory(prefix="specbench-overhead-") as tmp:
        results = ResultsFile(Path(tmp) / "results.jsonl")
        engine.generate(records[0].prompt)  # warm-up, untimed
        gc.collect()
        for r in range(repeats):
            for i, record in enumerate(records):
                order = ("bare", "harness") if (r + i) % 2 == 0 else ("harness", "bare")
                for kind in order:
                    start = time.perf_counter()
                    if kind == "bare":
                        engine.generate(record.prompt)
                        bare[record.id].append(time.perf_counter() - start)
                    else:
                        instrumented(engine, record, {**point, "repeat": r}, results, net)  # one row per repeat
                        harness[record.id].append(time.perf_counter() - start)
        rows = results.read()
    bare_s = sum(statistics.median(v) for v in bare.values())
    harness_s = sum(statistics.median(v) for v in harness.values())
    return {
        "mode": mode, "prompts": len(records), "repeats": repeats, "records_written": len(rows),
        "bare_s": bare_s, "harness_s": harness_s, "overhead": harness_s / bare_s - 1,
    }
