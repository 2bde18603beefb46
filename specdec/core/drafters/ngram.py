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

With `tree_nodes` > 0 the counts propose a token tree instead (SuffixDecoding's tree, Oliaro et al. 2024): a
node's score is the product of its path's frequencies (count / the context's total, at the longest suffix
counted `min_count` times), and the tree grows best first from the top `TREE_WIDTH` continuations of each node,
up to `tree_nodes` nodes and k deep: a confident context grows one long branch, an uncertain one several short.
"""
from __future__ import annotations

import heapq
import time
from collections import Counter, defaultdict

import torch

from specdec.core.drafters.interface import DraftContext, DrafterOption, DraftFree, DraftNote, Proposal, register_drafter
from specdec.core.session import AcceptedSequence
from specdec.core.tree import TokenTree
from specdec.core.verdict import Verdict

MAX_NGRAM = 4
MIN_COUNT = 1
TREE_WIDTH = 3  # continuations of a node considered for the tree
OPTIONS = {"max_ngram": DrafterOption(MAX_NGRAM, 1, "the longest context counted, in tokens"),
           "min_count": DrafterOption(MIN_COUNT, 1, "times a continuation must have been seen to be drafted"),
           "tree_nodes": DrafterOption(0, 0, "propose a token tree of this many nodes at most, best first (0: a chain)")}


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

    def candidates(self, context: list[int], min_count: int, width: int) -> list[tuple[int, float]]:
        """The `width` most frequent tokens after the longest suffix of `context` whose most frequent continuation
        was seen at least min_count times, each with its share of that suffix's counts (as `continuation` picks)."""
        for n in range(min(self.max_ngram, len(context)), 0, -1):
            counts = self.next.get(tuple(context[-n:]))
            if counts and counts.most_common(1)[0][1] >= min_count:
                total = sum(counts.values())
                return [(token, count / total) for token, count in counts.most_common(width) if count >= min_count]
        return []

    def tree(self, context: list[int], depth: int, nodes: int, min_count: int) -> TokenTree:
        """Best first by path probability: up to `nodes` nodes, `depth` deep (parents always before children)."""
        tokens: list[int] = []
        parents: list[int] = []
        frontier: list[tuple[float, int, int, int, list[int]]] = []  # (-score, order, token, parent, path tokens)
        order = 0

        def grow(parent: int, path: list[int], score: float) -> None:
            nonlocal order
            if len(path) < depth:
                for token, share in self.candidates(context + path, min_count, TREE_WIDTH):
                    heapq.heappush(frontier, (-score * share, order, token, parent, path))
                    order += 1

        grow(-1, [], 1.0)
        while frontier and len(tokens) < nodes:
            score, _, token, parent, path = heapq.heappop(frontier)
            tokens.append(token)
            parents.append(parent)
            grow(len(tokens) - 1, path + [token], -score)
        return TokenTree(torch.tensor(tokens, dtype=torch.long), tuple(parents))


@register_drafter("ngram", options=OPTIONS)
class NgramCache(DraftFree):
    name = "ngram"

    def __init__(self, context: DraftContext) -> None:
        super().__init__()
        max_ngram = context.options.get("max_ngram", MAX_NGRAM)
        self.min_count = context.options.get("min_count", MIN_COUNT)
        self.table = context.history.own(self.name, lambda: NgramTable(max_ngram))
        self.counted = 0  # accepted tokens of this generation already in the table
        self.tree_nodes = context.options.get("tree_nodes", 0)
        self.proposes_trees = self.tree_nodes > 0

    def propose(self, seq: AcceptedSequence, k: int) -> Proposal:
        start = time.perf_counter()
        self.count(seq)  # the prompt, on the first block
        context, draft = seq.ids[-self.table.max_ngram :].tolist(), list[int]()
        if self.tree_nodes:
            tree = self.table.tree(context, k, max(k, self.tree_nodes), self.min_count)
            self.compute_s += time.perf_counter() - start
            return Proposal(tree.tokens, None, seq.length, self.name, tree=None if tree.is_chain else tree)
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
