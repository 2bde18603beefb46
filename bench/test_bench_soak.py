"""The soak (bench/measure/serving/soak.py): one `specbench serve` and N replayed edges for a set time with
faults on a schedule (edges SIGKILLed and restarted, the server SIGSTOPped for 5 s, a client that
vanishes holding a session, a slow reader), the server's RSS, FDs, sessions and tasks sampled every
second. Not in the default suite (marker `soak`); docs/soak.md has the 20-minute figures.

    pytest bench/test_bench_soak.py --benchmark-only -m "soak and not realmodel" -s   # tiny pair, 1 min (CI)
    SPECBENCH_SOAK_S=1200 pytest bench/test_bench_soak.py --benchmark-only -m "soak and realmodel" -s

`SPECBENCH_SOAK_S` sets the duration (tiny: 60 s, real pair: 1200 s by default), `SPECBENCH_SOAK_OUT`
keeps the folder (default: a temporary one) for `specbench report`. The tiny soak asserts what does
not depend on the machine's speed (nothing lost, the recorded verdicts, the end state, every fault
recovered); its memory and p99 figures are printed and kept in `extra_info`, judged by the real soak.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from bench.derive.soak_summary import read_soak, summarize_soak
from bench.measure import tinypair
from bench.measure.serving.soak import SoakConfig, run_soak
from bench.measure.workload import CLOUD_ALIAS, EDGE_ALIAS
from specdec.models.registry import is_fetched

pytestmark = pytest.mark.soak
UNTIMED = ("nothing lost", "verdicts", "end state", "recovery")


def server_cores() -> str | None:
    """The server on the first core and the edges on the rest, where there are two or more."""
    cores = sorted(os.sched_getaffinity(0))
    return str(cores[0]) if len(cores) > 1 else None


def soak(benchmark, config: SoakConfig, tmp_path: Path) -> dict:
    out = Path(os.environ.get("SPECBENCH_SOAK_OUT") or tmp_path / "soak")
    benchmark.pedantic(lambda: run_soak(config, out, progress=False), rounds=1, iterations=1)
    summary = summarize_soak(read_soak(out))
    print(f"\nsoak, {config.duration_s:.0f} s, {config.edges} edges, {summary['generations']} generations ({out}):")
    for name, check in summary["checks"].items():
        print(f"  {'pass' if check['ok'] else 'FAIL'}  {name}: {check['figure']}  [{check['rule']}]")
    benchmark.extra_info.update({"checks": json.loads(json.dumps(summary["checks"])), "rss_growth": summary["rss_growth"],
                                 "p99_ratio": summary["p99_ratio"], "recoveries": summary["recoveries"]})
    return summary


def test_soak_tiny(benchmark, tmp_path):
    pair = tinypair.save_pair(tmp_path / "models")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "prompt": text}) + "\n" for i, text in enumerate(tinypair.PROMPTS)))
    config = SoakConfig(edge=pair["edge"], cloud=pair["cloud"], prompts=str(prompts), edges=4, max_new_tokens=24,
                        duration_s=float(os.environ.get("SPECBENCH_SOAK_S", 60)), cloud_cores=server_cores())
    summary = soak(benchmark, config, tmp_path)
    failed = {name: summary["checks"][name]["figure"] for name in UNTIMED if not summary["checks"][name]["ok"]}
    assert failed == {}
    assert summary["finished"] > 0 and summary["generations"] > config.edges


@pytest.mark.realmodel
def test_soak_real(benchmark, tmp_path):
    missing = [alias for alias in (EDGE_ALIAS, CLOUD_ALIAS) if not is_fetched(alias)]
    if missing:
        pytest.skip(f"real pair not fetched ({', '.join(missing)}): run `specbench models fetch {EDGE_ALIAS} {CLOUD_ALIAS}`")
    # int8 with activations quantized per token: a batched verdict is the session's own, so every
    # replayed verdict can be checked against the recording (per-tensor int8 may flip near-ties).
    config = SoakConfig(edge=EDGE_ALIAS, cloud=f"{CLOUD_ALIAS}@int8t", prompts="code", limit=4, edges=4,
                        max_new_tokens=32, duration_s=float(os.environ.get("SPECBENCH_SOAK_S", 1200)),
                        cloud_cores=server_cores())
    summary = soak(benchmark, config, tmp_path)
    assert {name: check["figure"] for name, check in summary["checks"].items() if not check["ok"]} == {}
