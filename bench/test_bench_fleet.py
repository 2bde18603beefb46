"""The batched verify forward's cost against its rows: what lets one server carry many edges
(figures go to `extra_info`; nothing here asserts a time). The fleet's own capacity curve is
`specbench fleet` (docs/capacity.md, "One cloud, many edges").

    pytest bench/test_bench_fleet.py --benchmark-only -s                    # tiny pair + real pair
    pytest bench/test_bench_fleet.py --benchmark-only -m "not realmodel"   # tiny pair only

B sessions, each a steady-state verify (its last accepted token + k = 4 draft tokens on a cached
prompt), verified in one forward for B = 1, 2, 4, 8 (16 on the real pair). The sizes are timed in
rotation, round after round, so drift hits all alike; per size the median forward and the ratio to
B = 1 with its spread over rounds (p10-p90).
"""
from __future__ import annotations

import statistics
import time

import pytest
import torch

from bench.measure.workload import CLOUD_ALIAS
from specdec.backends.prompt import Prompt
from specdec.core.cloud import LocalCloudSession
from specdec.core.config import DecodeConfig, SpecConfig
from specdec.core.processors import Constraints
from specdec.core.session import AcceptedSequence
from specdec.core.shared_forward import BatchRow, batch_logits
from specdec.models.loading import load_model
from specdec.models.registry import is_fetched

K = 4


def sessions(backend, count: int, prompt_len: int, vocab: int) -> list[BatchRow]:
    """`count` sessions with a cached prompt each, ready to verify a K-token draft."""
    generator = torch.Generator().manual_seed(0)
    rows = []
    for i in range(count):
        ids = torch.randint(0, vocab, (prompt_len + i,), generator=generator)  # lengths differ, as they do
        seq = AcceptedSequence(ids, 8)
        cloud = LocalCloudSession(backend, Prompt(ids), SpecConfig(k=K, policy="greedy"), DecodeConfig(max_new_tokens=8),
                                  Constraints(), vocab, torch.Generator())
        draft = torch.randint(0, vocab, (K,), generator=generator)
        rows.append(BatchRow(cloud.verifier, seq, draft))
    batch_logits(backend, rows)  # prefill every prompt once
    for row in rows:
        row.verifier.rollback(row.seq.length - 1, row.seq)
    return rows


def cost_curve(backend, sizes: tuple[int, ...], prompt_len: int, vocab: int, rounds: int) -> dict:
    pool = sessions(backend, max(sizes), prompt_len, vocab)
    times: dict[int, list[float]] = {size: [] for size in sizes}
    for round_ in range(rounds + 1):
        for size in sizes[round_ % len(sizes):] + sizes[: round_ % len(sizes)]:  # rotating order
            rows = pool[:size]
            start = time.perf_counter()
            batch_logits(backend, rows)
            elapsed = time.perf_counter() - start
            for row in rows:  # back to the same state: last accepted token unseen
                row.verifier.rollback(row.seq.length - 1, row.seq)
            if round_:  # round 0 warms up
                times[size].append(elapsed)
    base = times[sizes[0]]
    curve = {}
    for size in sizes:
        ratios = sorted(t / b for t, b in zip(times[size], base))
        deciles = statistics.quantiles(ratios, n=10) if len(ratios) > 1 else ratios * 9
        curve[size] = {"forward_ms_p50": statistics.median(times[size]) * 1e3,
                       "vs_one_row": statistics.median(ratios), "vs_one_row_p10": deciles[0],
                       "vs_one_row_p90": deciles[-1], "rows_per_forward_cost": size / statistics.median(ratios)}
    return curve


def report(curve: dict, what: str) -> None:
    print(f"\nbatched verify forward ({what}), k = {K}:")
    for size, c in curve.items():
        print(f"  B = {size:2d}: {c['forward_ms_p50']:8.1f} ms, {c['vs_one_row']:.2f}x one row "
              f"(p10-p90 {c['vs_one_row_p10']:.2f}-{c['vs_one_row_p90']:.2f}); {c['rows_per_forward_cost']:.1f} rows "
              "per one-row cost")


def test_batched_verify_cost_tiny(benchmark, tiny_pair):
    backend = tiny_pair.models["cloud"].backend
    curve = benchmark.pedantic(lambda: cost_curve(backend, (1, 2, 4, 8), 40, 60, rounds=20),
                               rounds=1, iterations=1)
    benchmark.extra_info.update({"cost_curve": curve})
    report(curve, "tiny pair, fp32")


@pytest.mark.realmodel
def test_batched_verify_cost_real(benchmark):
    if not is_fetched(CLOUD_ALIAS):
        pytest.skip(f"real cloud not fetched: run `specbench models fetch {CLOUD_ALIAS}`")
    cloud = load_model(CLOUD_ALIAS, "bfloat16", log=lambda message: None)
    torch.set_num_threads(1)  # one core, as `specbench serve --cores 1` runs
    curve = benchmark.pedantic(lambda: cost_curve(cloud.backend, (1, 2, 4, 8, 16), 120, 50000, rounds=6),
                               rounds=1, iterations=1)
    benchmark.extra_info.update({"cost_curve": curve})
    report(curve, "Qwen2.5-Coder-1.5B, bf16, 1 thread")
