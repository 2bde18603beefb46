"""Text health and quality numbers on real strings: the Chinese failure modes (loops, comma storms), a healthy Chinese
sentence, English and code."""
from __future__ import annotations

import pytest

from bench.derive.health import (
    chrf,
    common_prefix_len,
    content_units,
    immediate_repeats,
    ngram_repeat_rate,
    punct_band_distance,
    text_health,
    token_match_rate,
)

HEALTHY = "说话人语速平缓，情绪稳定，语气温和。"
LOOP = "音色中，音色中，音色中"  # what a stale last token after a rollback produced
SHORT_LOOP = "真想真想"  # what decoding without an n-gram ban produced
STUTTER = "真真想"
COMMA_STORM = "字，字，逗，号，"  # a comma after every character or two


def test_healthy_sentence_is_in_band_without_repeats():
    health = text_health(HEALTHY)
    assert health["punct_density"] == pytest.approx(3 / 18)
    assert health == {
        "punct_density": health["punct_density"],
        "punct_band_distance": 0.0,
        "repeat_2gram": 0.0,
        "repeat_3gram": 0.0,
        "immediate_repeats": 0,
        "abnormal_punct": False,
    }


def test_punctuation_loop_has_high_3gram_repeat():
    # units 音色中音色中音色中: 7 trigrams, 3 distinct; 8 bigrams, 3 distinct
    assert ngram_repeat_rate(LOOP, 3) == pytest.approx(4 / 7)
    assert ngram_repeat_rate(LOOP, 2) == pytest.approx(5 / 8)
    assert text_health(LOOP)["immediate_repeats"] == 0


def test_short_loop_and_stutter():
    assert ngram_repeat_rate(SHORT_LOOP, 2) == pytest.approx(1 / 3)  # 真想 想真 真想
    assert ngram_repeat_rate(SHORT_LOOP, 3) == 0.0  # 真想真 想真想
    assert immediate_repeats(SHORT_LOOP) == 0
    assert immediate_repeats(STUTTER) == 1
    assert immediate_repeats("真 真想") == 1  # whitespace does not hide it
    assert immediate_repeats("真，真想") == 0  # punctuation does
    assert immediate_repeats("好好好") == 2
    assert immediate_repeats("aa bb") == 0  # CJK characters only


def test_comma_storm_is_abnormal():
    health = text_health(COMMA_STORM)
    assert health["punct_density"] == 0.5
    assert health["abnormal_punct"] is True
    assert health["punct_band_distance"] == pytest.approx(0.25)


@pytest.mark.parametrize(
    "density, distance", [(0.0, 0.10), (0.10, 0.0), (0.18, 0.0), (0.25, 0.0), (0.40, 0.15), (1.0, 0.75)]
)
def test_punct_band_distance(density, distance):
    assert punct_band_distance(density) == pytest.approx(distance)


def test_units_are_cjk_chars_or_lowercase_words():
    assert content_units("说话人 OK，很好。") == list("说话人很好")
    assert content_units("The cat saw THE cat.") == ["the", "cat", "saw", "the", "cat"]
    assert content_units("def f(x): return x") == ["def", "f", "x", "return", "x"]
    assert content_units("OK 好 fine") == ["ok", "好", "fine"]  # mostly Latin: words
    assert content_units("，。！") == []


def test_english_and_code_repeats():
    assert ngram_repeat_rate("The cat saw the cat.", 2) == pytest.approx(1 / 4)  # the cat, cat saw, saw the, the cat
    assert ngram_repeat_rate("The quick brown fox jumps over the lazy dog.", 2) == 0.0
    code = "x = x + 1\nx = x + 1\nx = x + 1\n"
    assert ngram_repeat_rate(code, 3) == pytest.approx(4 / 7)  # x x 1 x x 1 x x 1
    assert text_health(code)["immediate_repeats"] == 0


def test_repeat_rate_short_and_bad_n():
    assert ngram_repeat_rate("", 2) == 0.0
    assert ngram_repeat_rate("好", 2) == 0.0
    with pytest.raises(ValueError, match="n must be >= 1"):
        ngram_repeat_rate(HEALTHY, 0)


def test_chrf():
    assert chrf(HEALTHY, HEALTHY) == pytest.approx(100.0)
    assert chrf("abc def", "xyz uvw") == pytest.approx(0.0)
    partial = chrf("说话人语速较快，情绪激动。", HEALTHY)
    assert 10.0 < partial < 90.0
    assert chrf("说话人语速平缓，情绪激动。", HEALTHY) > partial  # more overlap scores higher
    assert chrf("", HEALTHY) == 0.0


def test_token_match_rate_and_prefix():
    assert token_match_rate([], []) == 1.0
    assert token_match_rate([1, 2], []) == 0.0
    assert token_match_rate([1, 2, 3], [1, 2, 3]) == 1.0
    assert token_match_rate([1, 2, 3], [1, 9, 3]) == pytest.approx(2 / 3)
    assert token_match_rate([1, 2], [1, 2, 3, 4]) == 0.5  # over the longer length
    assert token_match_rate([5, 2, 3], [1, 2, 3]) == pytest.approx(2 / 3)  # prefix-aligned, no shift search
    assert common_prefix_len([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix_len([1, 2], [1, 2, 3]) == 2
    assert common_prefix_len([], [1]) == 0
    assert common_prefix_len([7], [1]) == 0
