"""The Spec-Bench table (bench/derive/spec_bench.py) on synthetic records: each cell is the speed-up over
the fastest cloud-only decoding of *its* category with a paired interval, τ counts the cloud's token of
every call, `overall` pools the questions against their own category's baseline, and the report shows
the table and writes spec_bench.csv."""
from __future__ import annotations

import html
import json
import statistics

import pandas as pd
import pytest

from bench.derive.spec_bench import fastest_per_category, spec_bench_table
from bench.derive.summary import summarize
from bench.read.report import build_report
from bench.read.report.cycles import panels, plot_cycles
from specdec.machine import fingerprint

SB = "spec-bench:/q.jsonl:"


def record(mode: str, category: str, qid: int, latency_s: float, **extra) -> dict:
    """10 new tokens per question."""
    base = dict(id=f"{category}-{qid}", mode=mode, dtype="float32", prompts=SB + category, status="ok",
                text="the cat sat on the mat.", tokens=[1, 2], new_tokens=10, latency_s=latency_s, ttft_s=0.1,
                tpot_s=0.01, num_draft_tokens=0, num_accepted_tokens=0, cloud_calls=0, cycles=10, num_drafts=0,
                corrections=0, bonus_tokens=0, accepted_per_position=[], edge_s=0.0, cloud_s=0.0, overhead_s=0.0,
                peak_rss_bytes=1, cloud_runtime="torch" if mode != "edge" else None,
                edge_runtime=None if mode == "cloud" else "torch")
    if mode == "spec":
        base.update(policy="greedy", k=4, entropy_threshold=0.0, accept_threshold=0.1, verifier="cached",
                    draft_stop="none", k_schedule="constant", drafter="prompt-lookup")
    return {**base, **extra}


def rows() -> list[dict]:
    out = []
    for qid, scale in ((1, 1.0), (2, 1.5), (3, 2.0)):
        # summarization: plain int8 1.0 s (the baseline), llama.cpp 2.0 s; lookup 0.5 s: 2x, 4 calls for 10 tokens
        out += [record("cloud", "summarization", qid, 1.0 * scale, cloud_runtime="torch-int8"),
                record("cloud", "summarization", qid, 2.0 * scale, cloud_runtime="llamacpp"),
                record("spec", "summarization", qid, 0.5 * scale, cloud_calls=4, num_draft_tokens=12,
                       num_accepted_tokens=6, corrections=3, bonus_tokens=1),
                # qa: plain llama.cpp is the faster there (0.8 s); lookup 1.6 s: 0.5x, every call one token
                record("cloud", "qa", qid, 1.0 * scale, cloud_runtime="torch-int8"),
                record("cloud", "qa", qid, 0.8 * scale, cloud_runtime="llamacpp"),
                record("spec", "qa", qid, 1.6 * scale, cloud_calls=10, num_draft_tokens=0, num_accepted_tokens=0,
                       corrections=0, bonus_tokens=10),
                record("edge", "qa", qid, 0.1 * scale)]  # the small model alone: fastest, never the baseline
    return out


def test_each_cell_is_over_its_own_categorys_fastest_cloud_decoding():
    records = rows()
    table = spec_bench_table(records, summarize(records)).set_index("method")
    lookup = table.loc["prompt-lookup k=4 greedy · → torch"]
    assert lookup["summarization_speedup"] == pytest.approx(2.0)
    assert lookup["qa_speedup"] == pytest.approx(0.5)  # against llama.cpp there, not int8
    assert lookup["summarization_ci_low"] == pytest.approx(2.0) and lookup["qa_ci_high"] == pytest.approx(0.5)  # paired
    assert lookup["summarization_tau"] == pytest.approx((6 + 3 + 1) / 4) and lookup["qa_tau"] == pytest.approx(1.0)
    # overall: 60 tokens in 13.5 s against each question's own baseline, 60 tokens in 4.5 + 3.6 s
    assert lookup["overall_speedup"] == pytest.approx((4.5 + 3.6) / (2.25 + 7.2))
    assert lookup["overall_tau"] == pytest.approx((18 + 9 + 3 + 30) / (12 + 30))
    assert table.loc["cloud-only in torch-int8", "summarization_speedup"] == pytest.approx(1.0)
    assert table.loc["cloud-only in llamacpp", "qa_speedup"] == pytest.approx(1.0)
    assert not any(m.startswith("edge-only") for m in table.index)  # a reference, not a way to the cloud's text
    assert fastest_per_category(table.reset_index()) == {
        "summarization": "prompt-lookup k=4 greedy · → torch", "qa": "cloud-only in llamacpp",
        "overall": "cloud-only in torch-int8"}  # overall 0.90x (int8 loses 0.8x on qa), lookup 0.86x


def test_no_spec_bench_prompt_set_means_no_table():
    records = [{**r, "prompts": "code"} for r in rows() if r["prompts"].endswith("qa")]
    assert spec_bench_table(records, summarize(records)).empty


def test_the_report_shows_the_table_and_writes_the_csv(tmp_path):
    folder = tmp_path / "results"
    folder.mkdir()
    (folder / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows()), encoding="utf-8")
    index = build_report(folder, tmp_path / "report")
    text = html.unescape(" ".join(index.read_text(encoding="utf-8").split()))
    assert "Spec-Bench: speed-up per task category" in text
    assert "2.00× [2.00–2.00] · τ 2.50" in text
    assert "Fastest way found per category: summarization: prompt-lookup k=4 greedy · → torch; qa: cloud-only in llamacpp" in text
    assert "The same after the first token" in text and "1.00× [1.00–1.00]" in text  # records with no trace: 1 token
    csv = pd.read_csv(tmp_path / "report" / "spec_bench.csv")
    assert list(csv.columns[:1]) == ["method"] and {"overall_speedup", "overall_decode_speedup"} <= set(csv)


def test_the_decoding_cells_leave_the_prompts_prefill_out():
    """Summarization's questions: every way spends 0.9 s before its first token (the prefill); after it,
    plain int8 takes 0.9 s for its 9 more tokens and lookup, whose first cycle emitted 3, 0.1 s for 7."""
    first_block = [{"accepted": 2, "extra_token": 5}]
    records = []
    for qid in (1, 2):
        records += [record("cloud", "summarization", qid, 1.8, ttft_s=0.9, cloud_runtime="torch-int8"),
                    record("cloud", "summarization", qid, 2.7, ttft_s=0.9, cloud_runtime="llamacpp"),
                    record("spec", "summarization", qid, 1.0, ttft_s=0.9, trace=first_block, cloud_calls=3,
                           num_accepted_tokens=4, corrections=3, num_draft_tokens=12)]
    table = spec_bench_table(records, summarize(records)).set_index("method")
    lookup = table.loc["prompt-lookup k=4 greedy · → torch"]
    assert lookup["summarization_speedup"] == pytest.approx(1.8)  # end to end: the prefill dominates
    assert lookup["summarization_decode_speedup"] == pytest.approx((7 / 0.1) / (9 / 0.9))  # 7x once it is out
    assert lookup["overall_decode_speedup"] == pytest.approx(7.0)
    assert table.loc["cloud-only in torch-int8", "summarization_decode_speedup"] == pytest.approx(1.0)
    assert table.loc["cloud-only in llamacpp", "summarization_decode_speedup"] == pytest.approx(0.5)


def test_each_category_carries_its_median_first_token_with_an_interval(tmp_path):
    """Summarization's prompts are long: 2.0-2.4 s before the first token in int8, 4.0-4.8 s in llama.cpp; qa's 0.1 s."""
    records = []
    for qid, ttft in ((1, 2.0), (2, 2.2), (3, 2.4)):
        records += [record("cloud", "summarization", qid, 3.0, ttft_s=ttft, cloud_runtime="torch-int8"),
                    record("cloud", "summarization", qid, 6.0, ttft_s=2 * ttft, cloud_runtime="llamacpp"),
                    record("cloud", "qa", qid, 1.0, ttft_s=0.1, cloud_runtime="torch-int8")]
    table = spec_bench_table(records, summarize(records)).set_index("method")
    int8, llama = table.loc["cloud-only in torch-int8"], table.loc["cloud-only in llamacpp"]
    assert int8["summarization_ttft_s"] == pytest.approx(2.2) and llama["summarization_ttft_s"] == pytest.approx(4.4)
    assert 2.0 <= int8["summarization_ttft_ci_low"] <= 2.2 <= int8["summarization_ttft_ci_high"] <= 2.4
    assert int8["qa_ttft_s"] == pytest.approx(0.1) and llama["qa_ttft_s"] != llama["qa_ttft_s"]  # no qa: NaN
    assert int8["overall_ttft_s"] == pytest.approx(statistics.median([2.0, 2.2, 2.4, 0.1, 0.1, 0.1]))
    summary = summarize(records).set_index("cloud_runtime")
    point = summary[summary["prompts"] == SB + "summarization"].loc["llamacpp"]
    assert point["ttft_p50_s"] == pytest.approx(4.4) and 4.0 <= point["ttft_p50_s_ci_low"] <= 4.4 <= point["ttft_p50_s_ci_high"]
    folder = tmp_path / "results"
    folder.mkdir()
    (folder / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    entry = {"model": "m", "runtime": "torch-int8", "threads": 2, "step_ms": 70.0, "floor_ms": 30.0, "error": None,
             "block_steps": {"2": 1.1, "5": 1.2, "9": 1.5}, "prefill_tokens_per_s": 189.4}
    reason = "a token step: torch-int8 70 ms; first token: torch-int8 prefills the calibration's 800-token prompt at 189 tok/s"
    (folder / "machine.json").write_text(json.dumps({"fingerprint": fingerprint(), "bandwidth_gbs": 30.0,
                                                     "calibration": [entry], "choices": [
                                                         {"role": "plain", "model": "m", "runtimes": ["torch-int8"],
                                                          "reason": reason}]}), encoding="utf-8")
    text = html.unescape(" ".join(build_report(folder, tmp_path / "report").read_text(encoding="utf-8").split()))
    assert "The first token:" in text and "4.40 s [" in text  # the Spec-Bench table's first-token cells
    assert "first token p50 s" in text  # and the point table's column
    assert reason in text and "prefill tok/s" in text and ">189<" in " ".join(build_report(  # the header's calibration
        folder, tmp_path / "report").read_text(encoding="utf-8").split())


def cycle(accepted: int, extra: int | None, t_reply_s: float) -> dict:
    return {"accepted": accepted, "extra_token": extra, "t_reply_s": t_reply_s}


def test_the_per_cycle_timeline_steps_each_cycle_after_the_first_token_of_the_median_question(tmp_path):
    """Three summarization questions with lookup τ 1, 2 and 3: the panel is the τ-2 one; its staircase has
    a corner per cycle after the first (time since the first verdict, tokens emitted so far), and the plain
    line is that question's fastest plain decoding after its first token."""
    records = []
    for qid, kept in ((1, 0), (2, 1), (3, 2)):
        trace = [cycle(0, 7, 0.5)] + [cycle(kept, 7, 0.5 + 0.2 * i) for i in range(1, 4)]  # 3 calls after the first
        records += [record("cloud", "summarization", qid, 2.0, ttft_s=0.5, cloud_runtime="torch-int8"),
                    record("cloud", "summarization", qid, 1.5, ttft_s=0.5, cloud_runtime="llamacpp"),
                    record("spec", "summarization", qid, 1.1, ttft_s=0.5, trace=trace, cloud_calls=4,
                           num_accepted_tokens=3 * kept, corrections=4, num_draft_tokens=16)]
    [panel] = panels(records)
    assert panel["category"] == "summarization" and panel["question"] == "summarization-2"
    assert panel["tau"] == pytest.approx((3 + 4) / 4)
    assert panel["plain"] == ("cloud-only in llamacpp", pytest.approx(1.0), 9.0)  # 1.5 s - 0.5 s, 10 - 1 tokens
    [(label, xs, ys)] = panel["stairs"]
    assert label == "prompt-lookup k=4 greedy · → torch"
    assert xs == pytest.approx([0.0, 0.2, 0.4, 0.6]) and ys == [0.0, 2.0, 4.0, 6.0]
    assert plot_cycles(records, tmp_path / "cycles.png").stat().st_size > 0
    assert panels([{**r, "prompts": "code"} for r in records]) == []  # not a Spec-Bench set: no panel
