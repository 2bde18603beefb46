"""Benchmarks of the engine's modes (edge, cloud, spec) and of Hugging Face's assisted generation
on the same pair and k (the peer baseline). One round = one pass over the workload's prompts;
the engine's metrics of the last round go into `extra_info`.

    pytest bench --benchmark-only                      # tiny pair, plus the real pair if fetched
    pytest bench --benchmark-only -m "not realmodel"   # tiny pair only (CI)
"""
import warnings

import pytest

from bench.measure.workload import HF_ASSISTED, HF_ASSISTED_DEFAULTS, MODES, Pair, mode_metrics
from specdec.settings import Mode

TINY_ROUNDS, REAL_ROUNDS = 5, 2


def bench_mode(benchmark, pair: Pair, mode: str, rounds: int) -> dict:
    outputs = benchmark.pedantic(pair.run, args=(mode,), rounds=rounds, warmup_rounds=1, iterations=1)
    metrics = mode_metrics(outputs)
    w = pair.workload
    info = {"mode": mode, "suite": w.suite, "dtype": w.dtype, "k": w.k, "policy": w.policy,
            "entropy_threshold": w.entropy_threshold, "prompts": len(w.prompts), "max_new_tokens": w.max_new_tokens,
            "threads": w.threads, **metrics,
            "tokens_per_s_median": metrics["new_tokens"] / benchmark.stats.stats.median}
    # Greedy decoding is lossless: every verifying mode must reproduce the cloud's own tokens.
    if mode in (Mode.SPEC, HF_ASSISTED, HF_ASSISTED_DEFAULTS):
        cloud = [o.tokens for o in reference(pair, Mode.CLOUD)]
        info["equals_cloud"] = [o.tokens for o in outputs] == cloud
    if mode in (HF_ASSISTED, HF_ASSISTED_DEFAULTS):
        info["equals_engine_spec"] = [o.tokens for o in outputs] == [o.tokens for o in reference(pair, Mode.SPEC)]
    benchmark.extra_info.update(info)
    return info


_REFERENCES: dict[tuple[int, str], list] = {}


def reference(pair: Pair, mode: str) -> list:
    """One untimed pass of `mode`, cached per pair."""
    key = (id(pair), mode)
    if key not in _REFERENCES:
        _REFERENCES[key] = pair.run(mode)
    return _REFERENCES[key]


@pytest.mark.parametrize("mode", MODES)
def test_tiny(benchmark, tiny_pair, mode):
    info = bench_mode(benchmark, tiny_pair, mode, TINY_ROUNDS)
    assert info.get("equals_cloud", True) and info.get("equals_engine_spec", True), info  # fp32: exact


@pytest.mark.realmodel
@pytest.mark.parametrize("mode", MODES)
def test_real(benchmark, real_pair, mode):
    info = bench_mode(benchmark, real_pair, mode, REAL_ROUNDS)
    if not (info.get("equals_cloud", True) and info.get("equals_engine_spec", True)):
        # bf16: a k+1-token verify forward and step-by-step decoding round differently, so a
        # near-tie argmax may flip; recorded in extra_info, not a failure.
        warnings.warn(f"{mode}: greedy output differs from the reference (bf16 rounding?): {info}",
                      stacklevel=1)  # the test itself is the place to point at, not pytest's caller
