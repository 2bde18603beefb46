"""Text health and quality of one output: the numbers people checked by hand on Chinese speaker
descriptions (punctuation density, content n-gram repeats, immediately repeated characters) plus chrF against a
reference and token agreement with a reference run, and WER/CER against a reference transcript.
Pure functions on strings and token lists.
"""
from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Sequence

import jiwer
from sacrebleu.metrics import CHRF

from specdec.core.text import (
    PUNCT_DENSITY_ABNORMAL,
    PUNCT_DENSITY_HEALTHY,
    cjk_content,
    is_cjk,
    punctuation_density,
)

# chrF (Popović 2015, WMT): character 6-grams, beta=2, whitespace ignored (sacrebleu's defaults);
# character n-grams need no Chinese word segmentation.
_CHRF = CHRF()
_WORD_RE = re.compile(r"\w+")
# Languages written without spaces between words: scored by CER, since WER would count a whole
# sentence as one word. Everything else is scored by WER.
CHARACTER_LANGUAGES = frozenset({"zh", "zh-cn", "zh-tw", "cmn", "chinese", "mandarin", "yue", "cantonese", "ja", "japanese"})
_APOSTROPHES = "'\u2019"


def punct_band_distance(density: float) -> float:
    """0 inside the healthy band (10–25 % of characters, `PUNCT_DENSITY_HEALTHY`), else the distance to its nearest
    edge, in density units (0.40 -> 0.15): one "how far from healthy" axis for Pareto plots."""
    low, high = PUNCT_DENSITY_HEALTHY
    return max(low - density, density - high, 0.0)


def content_units(text: str) -> list[str]:
    """The punctuation-stripped content of `text` as a list of units: its CJK characters when they
    are at least half of its letters and digits (Chinese has no spaces to split words on), else
    its lowercase words (`\\w+` runs, so code identifiers count as words)."""
    cjk = cjk_content(text)
    alnum = sum(ch.isalnum() for ch in text)  # CJK ideographs are alnum too
    if cjk and 2 * len(cjk) >= alnum:
        return list(cjk)
    return _WORD_RE.findall(text.lower())


def ngram_repeat_rate(text: str, n: int) -> float:
    """Fraction of the content n-grams of `text` (over `content_units`) that repeat an n-gram seen
    at an earlier position: (number of n-grams - number of distinct n-grams) / number of n-grams.
    0.0 when there are no n-grams. "音色中，音色中，音色中" -> units 音色中音色中音色中, seven 3-grams of
    which three are distinct: 4/7."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    units = content_units(text)
    grams = [tuple(units[i : i + n]) for i in range(len(units) - n + 1)]
    return (len(grams) - len(set(grams))) / len(grams) if grams else 0.0


def immediate_repeats(text: str) -> int:
    """Number of CJK characters equal to the non-whitespace character right before them
    ("真真想" -> 1, "真 真" -> 1, "真，真" -> 0): what the zh profile's NoImmediateRepeat bans."""
    chars = [ch for ch in text if not ch.isspace()]
    return sum(is_cjk(b) and a == b for a, b in zip(chars, chars[1:]))


def chrf(hypothesis: str, reference: str) -> float:
    """Sentence-level chrF of `hypothesis` against one `reference`, 0–100 (sacrebleu)."""
    return _CHRF.sentence_score(hypothesis, [reference]).score


def common_prefix_len(tokens: Sequence[int], reference_tokens: Sequence[int]) -> int:
    """Length of the longest common prefix of two token-id sequences."""
    n = 0
    for a, b in zip(tokens, reference_tokens):
        if a != b:
            break
        n += 1
    return n


def token_match_rate(tokens: Sequence[int], reference_tokens: Sequence[int]) -> float:
    """Fraction of positions, over the longer sequence, where the two prefix-aligned sequences hold
    the same id; positions past the shorter end count as mismatches. Two empty sequences agree:
    1.0. Lossless speculative decoding under greedy decoding must give 1.0 against the target."""
    longer = max(len(tokens), len(reference_tokens))
    if longer == 0:
        return 1.0
    return sum(a == b for a, b in zip(tokens, reference_tokens)) / longer


def text_health(text: str) -> dict:
    """All health numbers of one output, flat, for a results record or a DataFrame row."""
    density = punctuation_density(text)
    return {
        "punct_density": density,
        "punct_band_distance": punct_band_distance(density),
        "repeat_2gram": ngram_repeat_rate(text, 2),
        "repeat_3gram": ngram_repeat_rate(text, 3),
        "immediate_repeats": immediate_repeats(text),
        "abnormal_punct": density > PUNCT_DENSITY_ABNORMAL,
    }


def normalize_transcript(text: str) -> str:
    """The text WER/CER compare, so that only the words count: NFKC (full-width letters, digits and
    punctuation become their plain forms, so "，" == ","), lower case, apostrophes dropped
    ("don't" -> "dont"), every other punctuation or symbol character (Unicode P* and S*) replaced by a
    space ("well-kept" -> "well kept"), whitespace collapsed. Numbers are not spelled out: "3" and
    "three" differ, and "三" and "3" differ."""
    text = unicodedata.normalize("NFKC", text).lower()
    text = "".join("" if ch in _APOSTROPHES else " " if unicodedata.category(ch)[0] in "PS" else ch for ch in text)
    return " ".join(text.split())


def wer(hypothesis: str, reference: str) -> float:
    """Word error rate (substitutions + deletions + insertions) / reference words, on
    `normalize_transcript` of both (jiwer). Can exceed 1 when the hypothesis adds words; NaN when
    the reference has no words (the rate is undefined)."""
    reference, hypothesis = normalize_transcript(reference), normalize_transcript(hypothesis)
    if not reference:
        return math.nan
    return float(jiwer.wer(reference=reference, hypothesis=hypothesis))


def cer(hypothesis: str, reference: str) -> float:
    """Character error rate over `normalize_transcript` of both with all whitespace removed (Chinese
    has none, and a model's stray spaces are not errors of content). NaN for an empty reference."""
    reference = normalize_transcript(reference).replace(" ", "")
    hypothesis = normalize_transcript(hypothesis).replace(" ", "")
    if not reference:
        return math.nan
    return float(jiwer.cer(reference=reference, hypothesis=hypothesis))


def scored_by_characters(reference: str, language: str | None = None) -> bool:
    """CER for languages in CHARACTER_LANGUAGES; without a language, CER when CJK characters are at
    least half of the reference's content (as `content_units` decides), else WER."""
    if language:
        return language.strip().lower() in CHARACTER_LANGUAGES
    cjk = cjk_content(reference)
    return bool(cjk) and 2 * len(cjk) >= sum(ch.isalnum() for ch in reference)


def error_rates(hypothesis: str, reference: str | None, language: str | None = None) -> dict:
    """{"wer": ..., "cer": ...} for one output: the one that fits the language is set, the other is
    NaN (both NaN without a reference), so per-point means skip what does not apply."""
    rates = {"wer": math.nan, "cer": math.nan}
    if reference is None:
        return rates
    if scored_by_characters(reference, language):
        rates["cer"] = cer(hypothesis, reference)
    else:
        rates["wer"] = wer(hypothesis, reference)
    return rates
