"""The per-pairing figure (bench/read/report/pairings.py) on synthetic results: every speculative point
against the fastest plain decoding measured on its prompts, whichever model and runtime that is, beside its
cloud calls per token; a folder without a plain decoding gets a one-line reason instead of a figure."""
from __future__ import annotations

import html
import json
from pathlib import Path

import pytest

from bench.derive.summary import summarize
from bench.read.report import build_report
from bench.read.report.pairings import NO_PLAIN, NO_SPEC, plot_vs_fastest_plain
from bench.read.report.pareto import point_labels

SPEC = dict(policy="greedy", k=4, entropy_threshold=0.0, accept_threshold=0.1, verifier="cached",
            num_draft_tokens=8, num_accepted_tokens=6, cloud_calls=2, cycles=2, num_drafts=2,
            accepted_per_position=[2, 2, 1, 1])


def row(mode: str, pid: str, latency_s: float, edge_runtime: str = "torch", cloud_runtime: str = "torch",
        prompts: str = "p", **extra) -> dict:
    """One ok record of 8 new tokens; a role's runtime is blank where the mode does not run it."""
    base = dict(id=pid, mode=mode, dtype="float32", prompts=prompts, status="ok", text="the cat sat on the mat.",
                tokens=[1, 2, 3], new_tokens=8, latency_s=latency_s, ttft_s=0.1, tpot_s=0.01, num_draft_tokens=0,
                num_accepted_tokens=0, cloud_calls=0, cycles=8, num_drafts=0, accepted_per_position=[], edge_s=0.0,
                cloud_s=0.0, overhead_s=0.0, peak_rss_bytes=1,
                edge_runtime=None if mode == "cloud" else edge_runtime,
                cloud_runtime=None if mode == "edge" else cloud_runtime)
    return {**base, **extra}


def two_pairings() -> list[dict]:
    """Per prompt (b 25 % slower than a, so intervals have two prompts to pair): cloud-only in torch (8 tok/s
    at a) and llama.cpp (32), edge-only in torch (16) and llama.cpp (64 at a, 56.9 pooled: the fastest plain
    decoding of all); spec torch -> torch at 16 tok/s, and llamacpp -> llamacpp split (48) with its co-located
    twin (40)."""
    rows = []
    for pid, scale in (("a", 1.0), ("b", 1.25)):
        rows += [row("cloud", pid, 1.0 * scale), row("cloud", pid, 0.25 * scale, cloud_runtime="llamacpp"),
                 row("edge", pid, 0.5 * scale), row("edge", pid, 0.125 * scale, edge_runtime="llamacpp"),
                 row("spec", pid, 0.5 * scale, **SPEC),
                 row("spec", pid, 8 / 48 * scale, edge_runtime="llamacpp", cloud_runtime="llamacpp",
                     deployment="split", **SPEC),
                 row("spec", pid, 0.2 * scale, edge_runtime="llamacpp", cloud_runtime="llamacpp",
                     deployment="colocated", **SPEC)]
    return rows


def write_folder(tmp_path: Path, rows: list[dict]) -> Path:
    folder = tmp_path / "results"
    folder.mkdir()
    (folder / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return folder


def page_text(index: Path) -> str:
    return html.unescape(" ".join(index.read_text(encoding="utf-8").split()))


def test_every_spec_point_is_measured_against_the_fastest_plain_decoding_of_the_verifiers_model(tmp_path):
    """The edge model alone is faster here (edge-only in llamacpp), but it writes another model's text:
    a reference line, never the baseline."""
    summary = summarize(two_pairings())
    spec = summary[summary["mode"] == "spec"]
    assert set(spec["fastest_plain"]) == {"cloud-only in llamacpp"}  # the fastest cloud-only, not the faster edge-only
    assert sorted(spec["speedup_vs_fastest_plain"]) == pytest.approx([0.5, 1.25, 1.5])
    assert list(spec["speedup_vs_fastest_cloud"]) == pytest.approx(list(spec["speedup_vs_fastest_plain"]))
    lows, highs = spec["speedup_vs_fastest_plain_ci_low"], spec["speedup_vs_fastest_plain_ci_high"]
    assert list(lows) == pytest.approx(list(spec["speedup_vs_fastest_plain"]))  # paired: b's slowness cancels
    assert list(highs) == pytest.approx(list(spec["speedup_vs_fastest_plain"]))
    assert list(spec["cloud_calls_per_token"]) == pytest.approx([0.25] * 3)  # 2 calls for 8 tokens
    assert spec["cloud_calls_per_token_ci_low"].notna().all()

    figure = plot_vs_fastest_plain(summary, point_labels(summary), tmp_path / "figure.png")
    assert figure.path is not None and figure.path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert figure.baselines == {"p": "cloud-only in llamacpp, 28.4 tok/s"}
    assert "vs cloud-only in llamacpp, 28.4 tok/s" in figure.caption and not figure.left_out


def test_the_report_shows_it_for_a_folder_with_one_pairing(tmp_path):
    rows = [r for r in two_pairings() if r["mode"] != "spec" or r["edge_runtime"] == "torch"]
    index = build_report(write_folder(tmp_path, rows), tmp_path / "report")
    text = page_text(index)
    assert (tmp_path / "report" / "figures" / "speedup_vs_fastest_plain.png").is_file()
    assert 'id="fig-vs_fastest_plain"' in text
    assert "Speed-up over the fastest plain decoding (vs cloud-only in llamacpp, 28.4 tok/s)" in text


def test_a_prompt_set_without_plain_decoding_is_named_as_left_out(tmp_path):
    rows = two_pairings() + [row("spec", pid, 0.5, prompts="q", **SPEC) for pid in ("a", "b")]
    summary = summarize(rows)
    figure = plot_vs_fastest_plain(summary, point_labels(summary), tmp_path / "figure.png")
    assert figure.path is not None and figure.left_out == ("q",)
    assert "left out, with no plain decoding measured: q" in figure.caption


@pytest.mark.parametrize("modes, reason", [(("spec",), NO_PLAIN), (("cloud", "edge"), NO_SPEC)])
def test_without_plain_decoding_or_spec_points_the_figure_is_skipped_with_one_line(tmp_path, modes, reason):
    rows = [r for r in two_pairings() if r["mode"] in modes]
    summary = summarize(rows)
    figure = plot_vs_fastest_plain(summary, point_labels(summary), tmp_path / "figure.png")
    assert figure.path is None and figure.reason == reason and not (tmp_path / "figure.png").exists()
    text = page_text(build_report(write_folder(tmp_path, rows), tmp_path / "report"))
    assert f"Speed-up over the fastest plain decoding, per runtime pairing: {reason}" in text
    assert not (tmp_path / "report" / "figures" / "speedup_vs_fastest_plain.png").exists()


def test_a_big_sweeps_row_draws_its_front_and_its_fastest_and_says_so(tmp_path):
    """Twenty spec points of one pairing: the row draws those no other beats on both speed-up and calls per
    token, and the four fastest; the caption says how many of how many."""
    from bench.read.report.pairings import FASTEST_KEPT, drawn_points

    rows = []
    for pid, scale in (("a", 1.0), ("b", 1.25)):
        rows += [row("cloud", pid, 1.0 * scale), row("edge", pid, 0.5 * scale)]
        for i in range(20):  # faster points make more cloud calls, except the dominated odd ones
            calls = 2 + i // 2 if i % 2 == 0 else 12
            rows.append(row("spec", pid, (1.0 - 0.03 * i) * scale, **{**SPEC, "cloud_calls": calls, "k": i + 1}))
    summary = summarize(rows)
    spec = summary[summary["mode"] == "spec"]
    drawn = drawn_points(spec)
    fastest = set(spec["speedup_vs_fastest_plain"].nlargest(FASTEST_KEPT).index)
    assert fastest <= set(drawn.index) and len(drawn) < len(spec)
    for i in set(spec.index) - set(drawn.index):  # each point left out is beaten on both axes by one drawn
        assert ((drawn["speedup_vs_fastest_plain"] >= spec.at[i, "speedup_vs_fastest_plain"])
                & (drawn["cloud_calls_per_token"] <= spec.at[i, "cloud_calls_per_token"])).any()
    figure = plot_vs_fastest_plain(summary, point_labels(summary), tmp_path / "figure.png")
    assert figure.trimmed == {"torch → torch · p": (len(drawn), 20)}
    assert f"torch → torch · p: {len(drawn)} of 20 points drawn" in figure.caption
    assert drawn_points(spec.head(5)).equals(spec.head(5))  # a small row is drawn whole


def test_a_trimmed_row_keeps_each_drawn_split_points_co_located_twin():
    from bench.read.report.pairings import drawn_points

    rows = []
    for pid, scale in (("a", 1.0), ("b", 1.25)):
        rows += [row("cloud", pid, 1.0 * scale), row("edge", pid, 0.5 * scale)]
        for i in range(8):  # the twins are slower at the same calls: never on the front themselves
            setting = {**SPEC, "cloud_calls": 2 + i, "k": i + 1, "edge_runtime": "llamacpp"}
            rows.append(row("spec", pid, (0.4 + 0.03 * i) * scale, deployment="split", link="none", overlap=True, **setting))
            rows.append(row("spec", pid, (0.6 + 0.03 * i) * scale, deployment="colocated", **setting))
    spec = summarize(rows)
    spec = spec[spec["mode"] == "spec"]
    drawn = drawn_points(spec)
    split_k = set(drawn.loc[drawn["deployment"] == "split", "k"])
    assert len(drawn) < len(spec) and split_k
    assert set(drawn.loc[drawn["deployment"] == "colocated", "k"]) == split_k  # every drawn split point's twin, no other
