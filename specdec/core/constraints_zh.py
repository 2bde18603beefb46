"""The `zh` decoding profile: constraints for one short Chinese sentence, against "字字逗" (a comma
every character or two), short loops ("真想 真想", "音色中，音色中，音色中") and early or late stops.
Decoding token ids inside the loop would cost a tokenizer call per step; here each id is decoded
once, at build time, into per-token tables, so a call is a scan over `generated` plus a few tensor ops.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from specdec.core.processors import Constraints, StopRule
from specdec.core.text import COMMA_LIKE, PUNCTUATION, SENTENCE_END, cjk_content, is_cjk
from specdec.errors import ConfigError

# Only the full-width `。` is discouraged early in a sentence; ASCII '.' is left alone.
PERIOD_MARKS = frozenset("。")

_NEVER = 1 << 30  # a gate requirement no history can meet


@dataclass(frozen=True)
class ZhParams:
    """The profile's numbers, tuned by hand on one-sentence speaker descriptions."""

    comma_min_chars: int = 4  # comma-like marks only after >= 4 content chars since the last mark
    period_min_chars: int = 8  # `。` discouraged before 8 content chars in the sentence
    period_logit_shift: float = -8.0  # `logits[。] -= 8.0`
    repetition_penalty: float = 1.22  # 1.2–1.25 in the hand-tuned original; CJK content tokens only
    min_new_tokens: int = 16  # one sentence of at least 16 tokens, then stop at its end

    def __post_init__(self) -> None:
        if self.repetition_penalty <= 0 or min(self.comma_min_chars, self.period_min_chars, self.min_new_tokens) < 0:
            raise ConfigError(f"zh profile: need repetition_penalty > 0 and counts >= 0, got {self}")


def _gate(text: str, marks: frozenset[str], resets: frozenset[str], need: int) -> tuple[int, int, bool]:
    """For a gate "a mark needs >= `need` content chars since the last reset":
    (req, tail, anchored) where the token is allowed iff history_count >= req; `tail` is its
    content chars after its last reset (all of them if it has none); `anchored` says it has one.
    A mark after an in-token reset only depends on the token itself (req 0 or never)."""
    if marks.isdisjoint(text) and resets.isdisjoint(text):
        return 0, len(cjk_content(text)), False
    count, anchored, req = 0, False, 0
    for ch in text:
        if ch in marks:
            req = (req if count >= need else _NEVER) if anchored else max(req, need - count)
        if ch in resets:
            count, anchored = 0, True
        elif is_cjk(ch):
            count += 1
    return req, count, anchored


@dataclass(frozen=True, eq=False)
class _GateTable:
    ids: torch.Tensor  # [G] int64: the tokens carrying a gated mark (a few hundred of V)
    req: torch.Tensor  # [G] int64
    tail: tuple[int, ...]  # [V]
    anchored: tuple[bool, ...]  # [V]

    @classmethod
    def build(cls, texts: Sequence[str], marks, resets, need: int, device) -> _GateTable:
        rows = [_gate(t, marks, resets, need) for t in texts]
        gated = [(i, r) for i, (r, _, _) in enumerate(rows) if r > 0]
        ids = torch.tensor([i for i, _ in gated], dtype=torch.int64, device=device)
        req = torch.tensor([r for _, r in gated], dtype=torch.int64, device=device)
        return cls(ids, req, tuple(c for _, c, _ in rows), tuple(a for _, _, a in rows))

    def violators(self, generated: Sequence[int]) -> torch.Tensor:
        """Ids of the tokens whose mark would come too early after `generated`."""
        n = 0  # content chars since the last reset in the generated text
        for t in reversed(generated):
            n += self.tail[t]
            if self.anchored[t]:
                break
        return self.ids[self.req > n]


def _index(keys: Sequence[str], device) -> dict[str, torch.Tensor]:
    """key -> ids of the tokens with that key ('' = none)."""
    groups: dict[str, list[int]] = {}
    for tid, key in enumerate(keys):
        if key:
            groups.setdefault(key, []).append(tid)
    return {k: torch.tensor(v, dtype=torch.int64, device=device) for k, v in groups.items()}


@dataclass(frozen=True, eq=False)
class ZhTokenTable:
    """Per-token classes, decoded once per tokenizer."""

    content: tuple[str, ...]  # CJK content chars of each token
    last_char: tuple[str, ...]  # last non-whitespace char ('' if none)
    by_first_char: dict[str, torch.Tensor]  # CJK char -> tokens whose text starts with it
    by_first_content: dict[str, torch.Tensor]  # CJK char -> tokens whose first content char it is
    is_content_token: torch.Tensor  # [V] bool: non-whitespace chars all CJK content
    comma: _GateTable  # comma-like marks, reset by any punctuation
    period: _GateTable  # `。`, reset by a sentence end
    sentence_end_ids: frozenset[int]  # text (trailing whitespace aside) ends a sentence

    @classmethod
    def build(cls, tokenizer: Any, vocab_size: int, params: ZhParams, device="cpu") -> ZhTokenTable:
        n = min(vocab_size, len(tokenizer))  # model heads are often padded past the tokenizer
        texts = tokenizer.batch_decode([[i] for i in range(n)], clean_up_tokenization_spaces=False)
        texts = list(texts) + [""] * (vocab_size - n)
        # A byte-level BPE piece of a character decodes to '\ufffd': its characters are unknown,
        # so the whole token counts as non-CJK.
        texts = ["".join(ch for ch in t if not is_cjk(ch)) if "\ufffd" in t else t for t in texts]
        stripped = [t.strip() for t in texts]
        content = tuple(cjk_content(t) for t in texts)
        return cls(
            content=content,
            last_char=tuple(s[-1:] for s in stripped),
            by_first_char=_index([s[:1] if s[:1] and is_cjk(s[0]) else "" for s in stripped], device),
            by_first_content=_index([c[:1] for c in content], device),
            is_content_token=torch.tensor([bool(s) and len(c) == len(s) for s, c in zip(stripped, content)], device=device),
            comma=_GateTable.build(texts, COMMA_LIKE, PUNCTUATION, params.comma_min_chars, device),
            period=_GateTable.build(texts, PERIOD_MARKS, SENTENCE_END, params.period_min_chars, device),
            sentence_end_ids=frozenset(i for i, s in enumerate(stripped) if s[-1:] in SENTENCE_END),
        )


def _ban(logits: torch.Tensor, ids: list[torch.Tensor]) -> torch.Tensor:
    ids = [i for i in ids if i.numel()]
    return logits.index_fill(0, torch.cat(ids), float("-inf")) if ids else logits


@dataclass(frozen=True, eq=False)
class NoImmediateRepeat:
    """Rule 1 (紧邻同字, no immediately repeated character): after a CJK content char c, ban tokens starting with c.
    Whitespace is skipped on both sides so "真 真" is caught too."""

    table: ZhTokenTable

    def __call__(self, generated: Sequence[int], logits: torch.Tensor) -> torch.Tensor:
        last = next((self.table.last_char[t] for t in reversed(generated) if self.table.last_char[t]), "")
        ids = self.table.by_first_char.get(last)
        return _ban(logits, [ids] if ids is not None else [])


@dataclass(frozen=True, eq=False)
class ContentTrigramBan:
    """Rule 2 (去标点 3-gram, no repeated content trigram): on the CJK content history ...a b, ban tokens whose first
    content char c would repeat a trigram (a, b, c). Punctuation is stripped, so
    "音色中，音色中，" bans "音" and the loop "音色中，音色中，音色中" cannot close."""

    table: ZhTokenTable

    def __call__(self, generated: Sequence[int], logits: torch.Tensor) -> torch.Tensor:
        text = "".join(self.table.content[t] for t in generated)
        if len(text) < 3:
            return logits
        a, b = text[-2], text[-1]
        banned = {text[i + 2] for i in range(len(text) - 2) if text[i] == a and text[i + 1] == b}
        index = self.table.by_first_content
        return _ban(logits, [index[c] for c in banned if c in index])


@dataclass(frozen=True, eq=False)
class CommaGate:
    """Rule 3 (against 字字逗, a comma every character or two): a comma-like mark needs >= comma_min_chars content chars since
    the last punctuation mark; chars inside the candidate token before its mark count too."""

    table: ZhTokenTable

    def __call__(self, generated: Sequence[int], logits: torch.Tensor) -> torch.Tensor:
        return _ban(logits, [self.table.comma.violators(generated)])


@dataclass(frozen=True, eq=False)
class EarlyPeriodPenalty:
    """Rule 4 (no premature full stop): `。` shifted by period_logit_shift before period_min_chars content
    chars since the start / the last sentence end. A penalty, not a ban: a short sentence may end."""

    table: ZhTokenTable
    shift: float

    def __call__(self, generated: Sequence[int], logits: torch.Tensor) -> torch.Tensor:
        ids = self.table.period.violators(generated)
        if ids.numel() == 0:
            return logits
        out = logits.clone()
        out[ids] += self.shift
        return out


@dataclass(frozen=True, eq=False)
class ContentRepetitionPenalty:
    """Rule 5 (repetition penalty on content only): HF/CTRL repetition penalty on generated CJK content tokens only;
    penalising punctuation made the model fight the gates with substitute marks."""

    table: ZhTokenTable
    penalty: float

    def __call__(self, generated: Sequence[int], logits: torch.Tensor) -> torch.Tensor:
        ids = torch.tensor(sorted(set(generated)), dtype=torch.int64, device=logits.device)
        ids = ids[self.table.is_content_token[ids]]
        if ids.numel() == 0:
            return logits
        seen = logits[ids]
        out = logits.clone()
        out[ids] = torch.where(seen > 0, seen / self.penalty, seen * self.penalty)
        return out


@dataclass(frozen=True, eq=False)
class SuppressEarlyEos:
    """Rule 6 (no early end): EOS banned until it would be token number min_new_tokens, matching
    `StopRule.stops`, which counts the token itself."""

    eos_ids: torch.Tensor  # [E] int64
    min_new_tokens: int

    def __call__(self, generated: Sequence[int], logits: torch.Tensor) -> torch.Tensor:
        if len(generated) + 1 >= self.min_new_tokens or self.eos_ids.numel() == 0:
            return logits
        return logits.index_fill(0, self.eos_ids, float("-inf"))


def zh_profile(
    tokenizer: Any, eos_ids: Iterable[int], vocab_size: int, params: ZhParams = ZhParams(), device="cpu"
) -> Constraints:
    """The `zh` profile. `tokenizer` needs `batch_decode` and `len`; it is only used here, once.
    `device`: where the logits will live. Repetition penalty first, on the model's own logits
    (as in HF), then the bans and the `。` shift."""
    table = ZhTokenTable.build(tokenizer, vocab_size, params, device)
    eos = frozenset(int(i) for i in eos_ids)
    processors = (
        ContentRepetitionPenalty(table, params.repetition_penalty),
        SuppressEarlyEos(torch.tensor(sorted(eos), dtype=torch.int64, device=device), params.min_new_tokens),
        NoImmediateRepeat(table),
        ContentTrigramBan(table),
        CommaGate(table),
        EarlyPeriodPenalty(table, params.period_logit_shift),
    )
    stop = StopRule(eos, table.sentence_end_ids - eos, params.min_new_tokens)
    return Constraints(processors=processors, stop=stop)
