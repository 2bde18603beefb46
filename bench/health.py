"""Text health and quality of one output: the numbers seed 003's authors watched by hand
(punctuation density, content n-gram repeats, immediately repeated characters) plus chrF against a
reference and token agreement with a reference run. Pure functions on strings and token lists.
"""
from __future__ import annotations

import re
from typing import Sequence

from sacrebleu.metrics import CHRF

from specdec.constraints_zh import (
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


def punct_band_distance(density: float) -> float:
    """0 inside the healthy band (seed 003: 10–25 % of characters), else the distance to its nearest
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
