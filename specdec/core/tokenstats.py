"""Per-token text statistics computed once per tokenizer, so the decoding loop never decodes."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec.core.text import PUNCTUATION


@dataclass(frozen=True, eq=False)
class PunctuationTable:
    punct_chars: torch.Tensor  # [V] punctuation characters in each token's text
    visible_chars: torch.Tensor  # [V] non-whitespace characters

    @classmethod
    def build(cls, tokenizer, vocab_size: int) -> PunctuationTable:
        n = min(vocab_size, len(tokenizer))
        texts = tokenizer.batch_decode([[i] for i in range(n)], clean_up_tokenization_spaces=False)
        texts += [""] * (vocab_size - n)
        punct = torch.tensor([sum(ch in PUNCTUATION for ch in t) for t in texts])
        visible = torch.tensor([sum(not ch.isspace() for ch in t) for t in texts])
        return cls(punct, visible)

    def density(self, tokens: list[int]) -> float:
        """Character-level punctuation density of the tokens' text (`specdec.core.text.punctuation_density`
        from per-token counts), for the escalation trigger `--punct-trigger`."""
        index = torch.tensor(tokens, dtype=torch.long)
        visible = int(self.visible_chars[index].sum())
        return int(self.punct_chars[index].sum()) / visible if visible else 0.0
