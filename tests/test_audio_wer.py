"""WER/CER against references on real English and Chinese strings, which one applies to which
language, and the per-point means in the sweep summary."""
from __future__ import annotations

import math

import pytest

from bench.derive.health import cer, error_rates, normalize_transcript, scored_by_characters, wer
from bench.derive.summary import load_rows, summarize

FOX = "The quick brown fox jumps over the lazy dog."
PARK = "今天天气很好，我们去公园散步吧。"


@pytest.mark.parametrize(
    "text,normalized",
    [
        ("The Quick, brown FOX!", "the quick brown fox"),
        ("Don’t stop — it's well-kept.", "dont stop its well kept"),
        ("今天天气很好，我们去公园散步吧。", "今天天气很好 我们去公园散步吧"),
        ("ＡＢＣ，１２３", "abc 123"),  # full-width forms (NFKC)
        ("  many   spaces\n\tand lines ", "many spaces and lines"),
    ],
)
def test_normalize_transcript(text, normalized):
    assert normalize_transcript(text) == normalized


def test_wer_on_english_sentences():
    assert wer(FOX, FOX) == 0.0
    assert wer("the quick brown fox jumps over the lazy dog", FOX) == 0.0  # case and punctuation ignored
    # jumped (sub) + a (sub) of 9 reference words
    assert wer("The quick brown fox jumped over a lazy dog.", FOX) == pytest.approx(2 / 9)
    assert wer("quick brown fox", FOX) == pytest.approx(6 / 9)  # six deletions
    assert wer("yes yes yes yes", "yes") == 3.0  # insertions: WER is not capped at 1
    assert wer("", FOX) == 1.0
    assert math.isnan(wer("anything", " ... "))  # no reference words: undefined


def test_cer_on_chinese_sentences():
    assert cer(PARK, PARK) == 0.0
    assert cer("今天 天气 很好 ，我们去公园散步吧", PARK) == 0.0  # spaces and punctuation are not content
    # 很 -> 不 (sub), 吧 dropped (del) over the 14 content characters
    assert cer("今天天气不好，我们去公园散步。", PARK) == pytest.approx(2 / 14)
    assert cer("请在会议开始之前把报告发给我", "请在会议开始之前把报告发给我。") == 0.0
    assert cer("", PARK) == 1.0


def test_the_language_picks_cer_or_wer():
    assert scored_by_characters(PARK, "zh") and scored_by_characters(PARK, "Chinese")
    assert not scored_by_characters(FOX, "en")
    assert scored_by_characters(PARK) and not scored_by_characters(FOX)  # guessed from the reference
    assert not scored_by_characters("We used Qwen 模型 today", None)  # mostly English words
    assert error_rates("今天天气不好。", "今天天气很好。", "zh") == {"wer": pytest.approx(math.nan, nan_ok=True), "cer": 1 / 6}
    rates = error_rates("the quick brown fox", FOX, "en")
    assert rates["wer"] == pytest.approx(5 / 9) and math.isnan(rates["cer"])
    assert all(math.isnan(v) for v in error_rates("text", None).values())


def _row(mode, pid, text, prompts="samples", **extra):
    base = dict(id=pid, mode=mode, dtype="float32", prompts=prompts, policy=None, k=None, entropy_threshold=None,
                accept_threshold=None, verifier=None, status="ok", text=text, tokens=[1, 2, 3], new_tokens=3,
                latency_s=1.0, ttft_s=0.1, tpot_s=0.01, num_draft_tokens=0, num_accepted_tokens=0, cloud_calls=0,
                cycles=3, edge_s=0.0, cloud_s=0.0, overhead_s=0.0, punct_density=0.1, peak_rss_bytes=1)
    return {**base, **extra}


def test_summary_means_wer_and_cer_over_rows_with_a_reference():
    rows = [
        _row("cloud", "en-01", FOX, reference=FOX, language="en"),  # WER 0
        _row("cloud", "en-02", "the quick brown fox jumped over a lazy dog", reference=FOX, language="en"),  # 2/9
        _row("cloud", "zh-01", "今天天气不好，我们去公园散步。", reference=PARK, language="zh"),  # CER 2/14
        _row("cloud", "free", "no reference here"),  # counts in neither mean
        _row("cloud", "bad", "", status="failed", reference=FOX, error="sample 'bad': audio bad.wav not found"),
        _row("edge", "en-01", FOX, prompts="plain"),  # a point without references
    ]
    frame = load_rows(rows)
    assert "bad" not in set(frame["id"])  # failed rows are not scored
    summary = summarize(rows).set_index(["mode", "prompts"])
    cloud = summary.loc[("cloud", "samples")]
    assert cloud["wer"] == pytest.approx((0 + 2 / 9) / 2) and cloud["cer"] == pytest.approx(2 / 14)
    assert cloud["n_prompts"] == 4 and cloud["chrf_vs_cloud"] == 100.0  # existing columns unchanged
    edge = summary.loc[("edge", "plain")]
    assert math.isnan(edge["wer"]) and math.isnan(edge["cer"])


def test_summary_without_any_reference_column_still_has_the_columns():
    summary = summarize([_row("cloud", "a", FOX), _row("edge", "a", FOX)])
    assert {"wer", "cer"} <= set(summary.columns) and summary["wer"].isna().all()
