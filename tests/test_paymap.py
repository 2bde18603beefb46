"""Where speculation pays: the region function (bench/derive/regions.py) on hand-computed winners, the
closed-form boundaries against the model's own crossings, and the report's section
(bench/read/report/paymap.py) on synthetic results folders written with the code's record writer."""
from __future__ import annotations

import math
from dataclasses import replace

import pytest

from bench.derive.costmodel import Acceptance, CostInputs, Link, cloud_only, colocated, drafting_ahead, sequential
from bench.derive.regions import (
    LOSSLESS,
    WAYS,
    ahead_colocated_rtt_bound_s,
    alpha_of,
    at,
    fastest,
    rate_grid,
    rates,
    split_cloud_rtt_bound_s,
    winners,
)
from bench.read.report import build_report
from bench.read.report.inputs import load_inputs
from bench.read.report.pareto import point_labels
from bench.read.report.paymap import build_panels
from tests.test_costmodel import synthetic, write_folder

T_D, A, B, T_O = 0.01, 0.02, 0.005, 0.001  # edge step, verify a + b·T, verify overhead (seconds)


def hand(**extra) -> CostInputs:
    """k = 2: co-located cycle 2·t_d + o + V(3) = 0.056 s; cloud-only 0.026 s per token; edge-only 0.01 s."""
    return CostInputs(draft_step_s=T_D, verify_a_s=A, verify_b_s_per_token=B, verify_overhead_s=T_O,
                      acceptance=Acceptance.geometric(0.5, 2), **extra)


def test_the_region_function_on_both_sides_of_each_boundary():
    x = hand()
    # α = 0.8: E = 1 + 0.8 + 0.64 = 2.44. Drafting ahead keeps its 2 tokens with π = 0.8^3 = 0.512;
    # RTT 5 ms: wait 0.041 s fits 3 steps, cycle (2 − 2π)·t_d + 0.041 = 0.05076 s; sequential 0.061 s.
    found = rates(x, 0.8, (2,), 0.005)
    assert found["split"] == pytest.approx(2.44 / 0.05076)  # 48.1 tok/s
    assert found["co-located"] == pytest.approx(2.44 / 0.056)  # 43.6
    assert found["cloud-only"] == pytest.approx(1 / 0.026)  # 38.5
    assert found["edge-only"] == pytest.approx(1 / 0.01)  # 100: the edge alone is faster than all
    assert fastest(x, 0.8, (2,), 0.005, LOSSLESS) == "split"
    assert fastest(x, 0.8, (2,), 0.005, WAYS) == "edge-only"
    # RTT 20 ms: split's cycle 0.06576 s (37.1 tok/s) loses to co-located
    assert fastest(x, 0.8, (2,), 0.020, LOSSLESS) == "co-located"
    # co-located = cloud-only where E = 0.056 / 0.026 = 2.154, α = 0.685: 0.67 gives E 2.119, 0.70 gives 2.19
    assert fastest(x, 0.67, (2,), 0.020, LOSSLESS) == "cloud-only"
    assert fastest(x, 0.70, (2,), 0.020, LOSSLESS) == "co-located"
    # the grid says what the function says, cell by cell
    grid = rate_grid(x, [0.005, 0.020], [0.6, 0.8], (2,), LOSSLESS)  # α = 0.6: split 34.6, co-located 35.0 tok/s
    assert [[LOSSLESS[i] for i in row] for row in winners(grid, LOSSLESS)] == [
        ["cloud-only", "cloud-only"], ["split", "co-located"]]


def test_the_best_k_wins_a_cell():
    x = hand()
    assert rates(x, 0.9, (2, 4), 0.0, ("co-located",))["co-located"] == pytest.approx(
        max(colocated(at(x, 0.9, k)).tokens_per_s for k in (2, 4)))


def test_split_vs_cloud_closed_form_is_the_models_crossing():
    x = hand(link=Link(0.0, 1e6, 2e6, 0.003), up_bytes_per_call=200, down_bytes_per_call=80)
    alpha, k = 0.9, 4
    rtt_s = split_cloud_rtt_bound_s(x, alpha, k)
    # E·t_v − k·t_d − o − V(5) − transfers − protocol = 4.0951·0.026 − 0.086 − 0.0016 − 0.00032 − 0.003
    assert rtt_s == pytest.approx(4.0951 * 0.026 - 0.086 - 0.0016 - 0.00032 - 0.003)
    plain = cloud_only(x).tokens_per_s
    assert sequential(at(x, alpha, k, rtt_s)).tokens_per_s == pytest.approx(plain, rel=1e-9)
    nearer, farther = sequential(at(x, alpha, k, rtt_s - 0.001)), sequential(at(x, alpha, k, rtt_s + 0.001))
    assert nearer.tokens_per_s > plain > farther.tokens_per_s
    # the model pays the edge's prefill once per generation: its crossing is E·prefill / N further left
    paid = replace(x, edge_prefill_extra_s=0.04, output_tokens=64.0)
    moved_s = rtt_s - 4.0951 * 0.04 / 64
    assert sequential(at(paid, alpha, k, moved_s)).tokens_per_s == pytest.approx(cloud_only(paid).tokens_per_s, rel=1e-6)
    assert split_cloud_rtt_bound_s(x, 0.1, k) < 0  # at low acceptance split never beats cloud-only


def test_drafting_ahead_vs_co_located_closed_form_is_the_models_crossing():
    x = hand()
    # a = 2 ahead, π = 0.512: L* = k·t_d' − (k − π·a)·t_d = 0.02 − 0.00976
    rtt_s = ahead_colocated_rtt_bound_s(x, 0.8, 2)
    assert rtt_s == pytest.approx(0.01024)
    near = colocated(at(x, 0.8, 2)).tokens_per_s
    assert drafting_ahead(at(x, 0.8, 2, rtt_s)).tokens_per_s == pytest.approx(near, rel=1e-9)
    assert drafting_ahead(at(x, 0.8, 2, rtt_s - 0.001)).tokens_per_s > near
    # shared cores: the ahead steps outlast such a short round trip and slow the server by more
    assert math.isnan(ahead_colocated_rtt_bound_s(replace(x, cores_shared=True), 0.8, 2))
    # a faster edge than the cloud's cores for drafting moves it right by k·(t_d' − t_d)
    slower = replace(x, colocated_draft_step_s=0.015)
    assert ahead_colocated_rtt_bound_s(slower, 0.8, 2) == pytest.approx(0.01024 + 2 * 0.005)


def test_alpha_of_inverts_the_textbook_distribution():
    assert alpha_of(Acceptance.geometric(0.7, 4)) == pytest.approx(0.7, abs=1e-9)
    assert alpha_of(Acceptance.geometric(0.0, 3)) == pytest.approx(0.0, abs=1e-9)
    never = Acceptance.geometric(0.5, 2)
    never = Acceptance(tuple(replace(o, escalated=False) for o in never.outcomes if o.weight))
    assert alpha_of(never) is None


def _html(tmp_path, records) -> tuple[str, object]:
    if not (tmp_path / "r").exists():  # a test that built the folder already: appending would measure every row twice
        write_folder(tmp_path / "r", records)
    index = build_report(tmp_path / "r", tmp_path / "out")
    return index.read_text(encoding="utf-8"), tmp_path / "out" / "figures"


def test_a_report_gets_the_section_with_its_figures(tmp_path):
    html, figures = _html(tmp_path, synthetic(split=True))
    assert 'id="pays"' in html and "Where speculation pays" in html
    assert (figures / "where_speculation_pays.png").stat().st_size > 0
    assert (figures / "predicted_vs_measured.png").stat().st_size > 0
    assert "median |error| 0.0%" in html  # the synthetic timeline is exactly the model's
    assert "torch → torch" in html and "RTT 20 ms" in html and "in the " in html
    assert "the model agrees." in html or "the model says" in html


def test_a_folder_without_split_points_gets_a_map_without_split(tmp_path):
    records = synthetic()
    write_folder(tmp_path / "r", records)
    inputs = load_inputs(tmp_path / "r")
    panels, hints = build_panels(inputs.ok_rows, inputs.summary, point_labels(inputs.summary))
    assert not hints and len(panels) == 1 and panels[0].ways == ("co-located", "cloud-only")
    assert {p.split for p in panels[0].placed} == {False} and all(p.rtt_s == 0 for p in panels[0].placed)
    html, figures = _html(tmp_path, records)
    assert (figures / "where_speculation_pays.png").is_file() and "co-located, α" in html


def test_a_folder_without_a_cloud_only_baseline_gets_one_line(tmp_path):
    html, figures = _html(tmp_path, [r for r in synthetic() if r["mode"] != "cloud"])
    assert html.count('class="warn pays-hint"') == 1
    assert "no cloud-only baseline" in html and "rerun the sweep with --mode edge,cloud,spec" in html
    assert not (figures / "where_speculation_pays.png").exists()


def test_a_folder_without_spec_points_has_no_section(tmp_path):
    html, _ = _html(tmp_path, [r for r in synthetic() if r["mode"] != "spec"])
    assert "Where speculation pays" not in html and 'id="pays"' not in html


def test_a_faster_cloud_only_in_another_runtime_is_named_on_its_panel(tmp_path):
    """The map's contest holds the pairing's own cloud-only; a cloud-only measured faster in another runtime
    (here twice as fast) is named on the panel and cross-hatched where it beats every lossless way."""
    records = synthetic()
    assert build_panels(records, *_summary_and_labels(tmp_path / "before", records))[0][0].faster_cloud is None
    faster = [{**r, "cloud_runtime": "llamacpp", "latency_s": r["latency_s"] / 2} for r in records if r["mode"] == "cloud"]
    summary, labels = _summary_and_labels(tmp_path / "after", records + faster)
    (panel,), hints = build_panels(records + faster, summary, labels)
    own = summary[(summary["mode"] == "cloud") & (summary["cloud_runtime"] == "torch")]["tokens_per_s"].iloc[0]
    name, rate = panel.faster_cloud
    assert not hints and name == "cloud-only in llamacpp" and rate == pytest.approx(2 * own)
    (tmp_path / "report").mkdir()
    html, figures = _html(tmp_path / "report", records + faster)
    assert "plain decoding in another runtime, measured faster" in html and (figures / "where_speculation_pays.png").is_file()


def _summary_and_labels(folder, records):
    write_folder(folder, records)
    inputs = load_inputs(folder)
    return inputs.summary, point_labels(inputs.summary)


def test_draft_free_points_are_not_placed_on_a_drafting_models_map(tmp_path):
    """The map's axes are a drafting model's acceptance and RTT: prompt lookup's points (no edge model,
    t_d = 0) stay off it, and a folder with only those and no edge-only decoding still gets its report."""
    from tests.test_costmodel import N_PROMPTS, draft_free

    records = synthetic() + [draft_free(i) for i in range(N_PROMPTS)]
    write_folder(tmp_path / "r", records)
    inputs = load_inputs(tmp_path / "r")
    panels, _ = build_panels(inputs.ok_rows, inputs.summary, point_labels(inputs.summary))
    assert [len(p.placed) for p in panels] == [2]  # k = 2 and 4 of the model drafter, not the lookup point
    html, _ = _html(tmp_path, records)
    assert 'id="pays"' in html
    only = [r for r in records if r["mode"] != "edge" and not (r["mode"] == "spec" and r.get("drafter") in (None, "model"))]
    (tmp_path / "only").mkdir()
    html, _ = _html(tmp_path / "only", only)  # once divided by the lookup's t_d = 0 here
    assert 'id="points"' in html and 'id="pays"' in html
