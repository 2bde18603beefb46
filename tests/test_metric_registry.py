"""Which way a metric should move is declared once (bench/core/metric_registry.py) and every reader
takes it from there."""
import pytest

from bench.core.metric_registry import METRICS, Metric, compared, direction, lower_is_better
from bench.derive.gate_verdict import Check
from bench.read.report.pareto import FRONTS
from bench.read.report.recommend import RULES


def test_every_reader_finds_its_metrics():
    for front in FRONTS:
        assert (front.x_lower_is_better, front.y_lower_is_better) == (lower_is_better(front.x), lower_is_better(front.y))
    assert all(isinstance(lower_is_better(rule.objective), bool) for rule in RULES)
    assert [m.name for m in compared()][:5] == ["tokens_per_s", "latency_p50_s", "ttft_p50_s", "speedup_vs_cloud",
                                                "speedup_vs_edge"]
    assert {m.compared for m in compared()} == {"shown", "timing", "deterministic"}


def test_gate_checks_take_their_direction_from_the_registry():
    def check(metric, kind):
        return Check(metric, kind, 1, 1, True, "exact")

    assert check("spec.acceptance_rate", "deterministic").direction == "higher"
    assert check("spec.cloud_calls_per_token", "deterministic").direction == "lower"
    assert check("spec_vs_cloud", "timing").direction == "higher"  # a speed ratio
    assert check("spec.tokens_sha256", "deterministic").direction is None
    assert check("workload.k", "workload").direction is None
    assert direction("edge.punct_density") is None  # healthy inside a band: neither way is better


def test_a_metric_without_a_direction_or_registry_entry_is_refused_where_one_is_needed():
    with pytest.raises(ValueError, match="no better direction"):
        _ = METRICS["punct_density"].lower_is_better
    with pytest.raises(ValueError, match="add it there"):
        lower_is_better("made_up_metric")
    with pytest.raises(ValueError, match="direction must be"):
        Metric("x", "s", "up", "")
