"""Character classes of output text and its punctuation density: one definition shared by the
`zh` decoding profile (specdec/core/constraints_zh.py), the punctuation escalation trigger
(specdec/core/tokenstats.py) and the harness's text-health numbers (bench/derive/health.py)."""
from __future__ import annotations

import re

# Comma-like marks; ASCII ',' counts as '，' so a model cannot dodge a comma rule with the
# half-width variant.
COMMA_LIKE = frozenset("，、：:,")
# Marks that end a sentence, full- and half-width.
SENTENCE_END = frozenset("。！？.!?")
# Every mark counted as punctuation: the two classes above plus the remaining common Chinese and
# ASCII marks.
PUNCTUATION = COMMA_LIKE | SENTENCE_END | frozenset("；;…—～~·“”‘’「」『』《》〈〉（）()【】\"'")

# Character-level punctuation density of a healthy one-sentence Chinese description: 10–25 % of
# its characters; above 40 % it reads as "a comma after every character or two".
PUNCT_DENSITY_HEALTHY = (0.10, 0.25)
PUNCT_DENSITY_ABNORMAL = 0.4

# Unified ideographs (+ extension A), compatibility ideographs, extensions B–G.
_CJK_RE = re.compile("[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0003134f]")


def is_cjk(ch: str) -> bool:
    """`ch` (one character) is a CJK content character: an ideograph (wider than the common
    U+4E00–U+9FFF block, so rare characters count too)."""
    return _CJK_RE.fullmatch(ch) is not None


def cjk_content(text: str) -> str:
    """The CJK content characters of `text`, punctuation and everything else stripped."""
    return "".join(_CJK_RE.findall(text))


def punctuation_density(text: str) -> float:
    """Punctuation characters / non-whitespace characters (0.0 if empty). Characters, not token
    ids: id counts vary with the vocabulary and full/half-width variants."""
    chars = [ch for ch in text if not ch.isspace()]
    return sum(ch in PUNCTUATION for ch in chars) / len(chars) if chars else 0.0
