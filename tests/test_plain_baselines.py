"""Honest baselines on synthetic results: a point's speed-ups are against the plain decoding of its
own runtimes, and against the fastest cloud-only measured on its prompts (`speedup_vs_fastest_cloud`,
named by `fastest_cloud`); the report names that fastest plain decoding and says plainly when no
speculative point beats it, or how many do."""
from __future__ import annotations

import html
import json
from pathlib import Path

import pytest

from bench.derive.summary import summarize, terminal_table
from bench.read.report import build_report
from bench.read.report.plots import speedup_panels

SPEC = dict(policy="greedy", k=4, entropy_threshold=0.0, accept_threshold=0.1, verifier="cached",
            num_draft_tokens=8, num_accepted_tokens=6, cloud_calls=2, cycles=2, num_drafts=2,
            accepted_per_position=[2, 2, 1, 1])


def row(mode: str, pid: str, latency_s: float, edge_runtime: str | None = "torch", cloud_runtime: str | None = "torch",
        **extra) -> dict:
    """One ok record of 8 new tokens, its runtimes blank where its mode does not run the role."""
    base = dict(id=pid, mode=mode, dtype="float32", prompts="p", policy=None, k=None, entropy_threshold=None,
                accept_threshold=None, verifier=None, status="ok", text="the cat sat on the mat.", tokens=[1, 2, 3],
                new_tokens=8, latency_s=latency_s, ttft_s=0.1, tpot_s=0.01, num_draft_tokens=0, num_accepted_tokens=0,
                cloud_calls=0, cycles=8, num_drafts=0, accepted_per_position=[], edge_s=0.0, cloud_s=0.0, overhead_s=0.0,
                punct_density=0.1, peak_rss_bytes=1,
                edge_runtime=None if mode == "cloud" else edge_runtime,
                cloud_runtime=None if mode == "edge" else cloud_runtime)
    return {**base, **extra}


def two_cloud_runtimes() -> list[dict]:
    """Per prompt: cloud-only in torch (8 tok/s at a: 1 s) and in llama.cpp (4x as fast); edge-only in
    torch; spec with a torch edge verifying in torch (2x torch's cloud-only) and in llama.cpp (1.5x
    llama.cpp's). The llama.cpp cloud alone beats every spec point. Prompt b is a little slower, so
    the intervals have two prompts to pair."""
    rows = []
    for pid, scale in (("a", 1.0), ("b", 1.25)):
        rows += [row("cloud", pid, 1.0 * scale), row("cloud", pid, 0.25 * scale, cloud_runtime="llamacpp"),
                 row("edge", pid, 0.5 * scale),
                 row("spec", pid, 0.5 * scale, **SPEC), row("spec", pid, 0.25 / 1.5 * scale, cloud_runtime="llamacpp", **SPEC)]
    return rows


def by_runtimes(summary, mode: str, cloud_runtime: str):
    match = summary[(summary["mode"] == mode) & (summary["cloud_runtime"] == cloud_runtime)]
    assert len(match) == 1
    return match.iloc[0]


def test_a_point_is_compared_with_the_plain_decoding_of_its_own_runtime():
    summary = summarize(two_cloud_runtimes())
    torch_spec, llama_spec = by_runtimes(summary, "spec", "torch"), by_runtimes(summary, "spec", "llamacpp")
    assert torch_spec["speedup_vs_cloud"] == pytest.approx(2.0)  # against torch's cloud-only, not llama.cpp's
    assert llama_spec["speedup_vs_cloud"] == pytest.approx(1.5)  # against llama.cpp's, not torch's (6x)
    assert (llama_spec["speedup_vs_cloud_ci_low"], llama_spec["speedup_vs_cloud_ci_high"]) == pytest.approx((1.5, 1.5))
    assert torch_spec["speedup_vs_edge"] == pytest.approx(1.0) and llama_spec["speedup_vs_edge"] == pytest.approx(3.0)


def test_the_fastest_cloud_only_is_named_and_every_point_is_measured_against_it():
    summary = summarize(two_cloud_runtimes())
    assert set(summary["fastest_cloud"]) == {"llamacpp"}
    torch_spec, llama_spec = by_runtimes(summary, "spec", "torch"), by_runtimes(summary, "spec", "llamacpp")
    assert torch_spec["speedup_vs_fastest_cloud"] == pytest.approx(0.5)
    assert llama_spec["speedup_vs_fastest_cloud"] == pytest.approx(1.5)
    assert by_runtimes(summary, "cloud", "torch")["speedup_vs_fastest_cloud"] == pytest.approx(0.25)
    low, high = torch_spec["speedup_vs_fastest_cloud_ci_low"], torch_spec["speedup_vs_fastest_cloud_ci_high"]
    assert (low, high) == pytest.approx((0.5, 0.5))  # paired per prompt with the llama.cpp cloud's own runs
    table = terminal_table(summary)
    header = table.splitlines()[0].split()
    assert {"speedup_vs_fastest_cloud", "cloud_runtime", "fastest_cloud"} <= set(header)


def test_without_runtime_fields_the_old_matching_holds():
    """Results written before runtimes existed: one cloud-only per dtype and prompts, matched as before."""
    rows = [{k: v for k, v in r.items() if not k.endswith("_runtime")} for r in two_cloud_runtimes()
            if r.get("cloud_runtime") != "llamacpp"]
    summary = summarize(rows)
    spec = summary[summary["mode"] == "spec"].iloc[0]
    assert spec["speedup_vs_cloud"] == pytest.approx(2.0) == spec["speedup_vs_fastest_cloud"]
    assert spec["fastest_cloud"] == "torch float32"


def report_text(tmp_path: Path, rows: list[dict]) -> str:
    folder = tmp_path / "results"
    folder.mkdir()
    (folder / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    page = build_report(folder, tmp_path / "report").read_text(encoding="utf-8")
    return html.unescape(" ".join(page.split()))


def test_the_report_says_plainly_when_no_speculative_point_beats_the_fastest_plain_decoding(tmp_path):
    rows = [r for r in two_cloud_runtimes() if not (r["mode"] == "spec" and r["cloud_runtime"] == "llamacpp")]
    text = report_text(tmp_path, rows)
    assert "the fastest plain decoding measured is cloud-only in llamacpp, 28.4 tok/s" in text
    assert "No speculative point that verified its drafts beats it: the fastest" in text
    assert "runs at 0.50× [0.50–0.50] its speed" in text
    assert "× fastest cloud" in text  # the points table's column


def test_the_report_counts_the_speculative_points_that_beat_it(tmp_path):
    text = report_text(tmp_path, two_cloud_runtimes())
    assert ("1 of 2 speculative points that verified their drafts are faster on these prompts, 1 of them with the whole "
            "95 % interval above 1") in text
    assert "runs at 1.50×" in text
    assert "Lossless (the verifier's own text): 1 of 2 faster, 1 with the whole interval above 1" in text
    assert "No speculative point" not in text and "never called the cloud" not in text


def test_a_point_that_never_called_the_cloud_is_the_edges_own_text_not_a_win(tmp_path):
    """A gate that sent no block ran the drafter alone: fast, but its text is the edge model's. The verdict names it
    apart instead of counting it among the speculative points that beat plain decoding."""
    gated = dict(SPEC, entropy_threshold=3.0, cloud_calls=0, num_accepted_tokens=0)
    rows = [r for r in two_cloud_runtimes() if not (r["mode"] == "spec" and r["cloud_runtime"] == "llamacpp")]
    rows += [row("spec", pid, 0.1 * scale, cloud_runtime="llamacpp", **gated) for pid, scale in (("a", 1.0), ("b", 1.25))]
    text = report_text(tmp_path, rows)
    assert "No speculative point that verified its drafts beats it: the fastest" in text
    assert "1 more point never called the cloud: the edge's own text, not verified speculation" in text
    assert "at 2.50×)" in text


def test_the_speed_up_figure_measures_every_point_against_the_fastest_cloud_only():
    """A speculative point faster than its own runtime's cloud-only but slower than another runtime's is
    drawn below 1, beside that slower cloud-only point; the fastest cloud-only is the baseline, not a point."""
    summary = summarize(two_cloud_runtimes())
    ((prompts, (base, points)),) = speedup_panels(summary).items()
    assert base["mode"] == "cloud" and base["tokens_per_s"] == summary[summary["mode"] == "cloud"]["tokens_per_s"].max()
    assert base.name not in points.index and "cloud" in set(points["mode"])  # the slower cloud-only is drawn
    assert list(points["speedup_vs_fastest_cloud"]) == sorted(points["speedup_vs_fastest_cloud"])
    for _, point in points.iterrows():
        assert point["speedup_vs_fastest_cloud"] == pytest.approx(point["tokens_per_s"] / base["tokens_per_s"])
    torch_spec = by_runtimes(points, "spec", "torch")
    assert torch_spec["speedup_vs_fastest_cloud"] < 1 < torch_spec["speedup_vs_cloud"]  # 0.5x, though 2x its own


def test_heat_maps_give_each_cloud_runtime_its_own_row():
    """Two spec points at the same (threshold, k) in two cloud runtimes are two cells, not one overwritten."""
    from bench.read.report.plots import _facets

    spec = summarize(two_cloud_runtimes())
    facets = _facets(spec[spec["mode"] == "spec"])
    assert sorted(name for name, _ in facets) == ["cloud_runtime=llamacpp", "cloud_runtime=torch"]
    assert all(len(group) == 1 for _, group in facets)
