"""An n-gram cache (llama.cpp's `ngram-cache`; suffix decoding, Oliaro et al. 2024): no model. Every
n-gram (n <= max_ngram) of the prompts and accepted outputs an engine has seen counts the tokens that
followed it; a block is built greedily from those counts:

    repeat up to k times:
        context = the longest suffix (n = max_ngram .. 1) of seq + draft seen before, with a
                  continuation counted at least `min_count` times
        append its most frequent continuation
    no such suffix: stop (an empty block is the cloud's own next token)

Unlike prompt lookup (one occurrence, this request only) the counts carry across the generations of
one engine (`DraftContext.history`): what a prompt set keeps repeating (code idioms, a template's
boilerplate, a language's function words) is drafted even when this request never said it.
"""
from __future__ import annotations

import time
from collections import Counter, defaultdict

import torch

from specdec.core.drafters.interface import DraftContext, DrafterOption, DraftFree, DraftNote, Proposal, register_drafter
from specdec.core.session import AcceptedSequence
from specdec.core.verdict import Verdict

MAX_NGRAM = 4
MIN_COUNT = 1
OPTIONS = {"max_ngram": DrafterOption(MAX_NGRAM, 1, "the longest context counted, in tokens"),
           "min_count": DrafterOption(MIN_COUNT, 1, "times a continuation must have been seen to be drafted")}


class NgramTable:
    """n-gram (tuple of ids) -> Counter of the ids that followed it, for n = 1 .. max_ngram."""

    def __init__(self, max_ngram: int = MAX_NGRAM) -> None:
        self.max_ngram = max_ngram
        self.next: dict[tuple[int, ...], Counter] = defaultdict(Counter)

    def add(self, ids: list[int], start: int = 0) -> None:
        """Count the continuation of every n-gram that ends before position i, for i >= start."""
        for i in range(max(start, 1), len(ids)):
            for n in range(1, min(self.max_ngram, i) + 1):
                self.next[tuple(ids[i - n : i])][ids[i]] += 1

    def continuation(self, context: list[int], min_count: int) -> int | None:
        """The most frequent token after the longest suffix of `context` seen at least min_count times."""
        for n in range(min(self.max_ngram, len(context)), 0, -1):
            counts = self.next.get(tuple(context[-n:]))
            if counts:
                token, count = counts.most_common(1)[0]
                if count >= min_count:
                    return token
        return None


@register_drafter("ngram", options=OPTIONS)
class NgramCache(DraftFree):
    name = "ngram"

    def __init__(self, context: DraftContext) -> None:
        super().__init__()
        max_ngram = context.options.get("max_ngram", MAX_NGRAM)
        self.min_count = context.options.get("min_count", MIN_COUNT)
        self.table = context.history.own(self.name, lambda: NgramTable(max_ngram))
        self.counted = 0  # accepted tokens of this generation already in the table

    def propose(self, seq: AcceptedSequence, k: int) -> Proposal:
        start = time.perf_counter()
        self.count(seq)  # the prompt, on the first block
        context, draft = seq.ids[-self.table.max_ngram :].tolist(), list[int]()
        while len(draft) < k and (token := self.table.continuation(context + draft, self.min_count)) is not None:
            draft.append(token)
        self.compute_s += time.perf_counter() - start
        return Proposal(torch.tensor(draft, dtype=torch.long), None, seq.length, self.name)

    def count(self, seq: AcceptedSequence) -> None:
        """Add the accepted tokens not counted yet (only accepted tokens are ever counted)."""
        if self.counted < seq.length:
            ids = seq.ids.tolist()
            self.table.add(ids, self.counted)
            self.counted = len(ids)

    def rollback(self, seq: AcceptedSequence, proposal: Proposal, verdict: Verdict | None) -> DraftNote:
        """Nothing to crop; what the cycle accepted joins the table."""
        start = time.perf_counter()
        self.count(seq)
        self.compute_s += time.perf_counter() - start
        return DraftNote()
