"""bench/measure/overhead.py measures what it says: both paths run the same generations, and the
instrumented path writes one complete sweep record per prompt and repeat."""
from bench.measure import overhead
from bench.measure.workload import Pair, tiny_workload


def test_harness_overhead_runs_both_paths_and_writes_sweep_records(monkeypatch):
    written = []
    real_instrumented = overhead.instrumented

    def spy(engine, record, point, results, network):
        real_instrumented(engine, record, point, results, network)
        written.append(results.read()[-1])

    monkeypatch.setattr(overhead, "instrumented", spy)
    with Pair(tiny_workload(max_new_tokens=6), log=lambda m: None) as pair:
        info = overhead.harness_overhead(pair, repeats=2)
        bare_tokens = pair.run("spec")[0].tokens
    assert info["records_written"] == 2 * len(pair.workload.prompts) == len(written)
    assert info["bare_s"] > 0 and info["harness_s"] > 0
    row = written[0]
    # The instrumented path is the sweep's: trackers, network and health fields, the status.
    assert row["status"] == "ok" and row["network"] == "4g"
    for field in ("latency_s", "peak_rss_bytes", "latency_with_network_s", "uplink_bytes", "punct_density"):
        assert field in row, field
    assert row["tokens"] == bare_tokens  # the same generation as the bare path
