"""Harness overhead: the sweep's instrumentation (trackers, memory watchdog, network and health
fields, fsynced records) against the bare engine on the same prompts, interleaved
(bench/measure/overhead.py). The fraction goes into `extra_info["overhead"]`; it is reported, not gated.

    pytest bench/test_bench_harness.py --benchmark-only -m realmodel -s   # the real pair's figure
"""
import pytest

from bench.measure.overhead import harness_overhead


def bench_overhead(benchmark, pair, repeats: int) -> dict:
    info = benchmark.pedantic(harness_overhead, args=(pair,), kwargs={"repeats": repeats}, rounds=1, iterations=1)
    benchmark.extra_info.update(info)
    print(f"\nharness overhead ({pair.workload.suite}): {info}")
    return info


def test_tiny_harness_overhead(benchmark, tiny_pair):
    info = bench_overhead(benchmark, tiny_pair, repeats=5)
    assert info["records_written"] == 5 * len(tiny_pair.workload.prompts)


@pytest.mark.realmodel
def test_real_harness_overhead(benchmark, real_pair):
    info = bench_overhead(benchmark, real_pair, repeats=3)
    assert info["records_written"] == 3 * len(real_pair.workload.prompts)
