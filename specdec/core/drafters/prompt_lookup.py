"""Prompt lookup (Saxena 2023, "Prompt Lookup Decoding"; HF's `prompt_lookup_num_tokens`, Spec-Bench's
PLD): no model. The last n tokens of the accepted sequence are searched for earlier in it (prompt and
generation); the tokens that followed the match are the draft.

    for n = max_ngram .. min_ngram:             longest suffix first: the most specific context
        i = the last j < L - n with ids[j : j+n] == ids[L-n : L]
        if found: propose ids[i+n : i+n+k]
    no match: an empty proposal (the cloud's own next token, as plain decoding)

Among several matches the newest wins (HF takes the oldest): output that copies a span of its input
copies it in order, and the newest occurrence is where the copy stands. Summaries, edits and
retrieval answers copy spans of their input, so this pays there and nowhere else.

With `branches` > 1 the other matches' continuations join as branches of a token tree (specdec/core/tree.py):
the chain above first, whole, then each further match (longest suffix first, newest first) adds the nodes it does
not share, up to `tree_nodes` in all. Verified in one block where the cloud accepts trees (the kernels), greedily:
the tree holds the chain, so it keeps at least the chain's tokens, and its text is the cloud's own all the same.
"""
from __future__ import annotations

import time

import torch

from specdec.core.drafters.interface import DraftContext, DrafterOption, DraftFree, Proposal, register_drafter
from specdec.core.session import AcceptedSequence
from specdec.core.tree import TokenTree

MAX_NGRAM = 3  # Spec-Bench's PLD and HF's default search the last 3 (HF: max_matching_ngram_size 2) tokens
MIN_NGRAM = 1
TREE_NODES = 8  # a verify block of 9 rows: about one step where the kernels are flat (docs/runtimes.md)
OPTIONS = {"max_ngram": DrafterOption(MAX_NGRAM, MIN_NGRAM, "the longest suffix searched for, in tokens"),
           "branches": DrafterOption(1, 1, "matches proposed at once, as a token tree (1: a chain)"),
           "tree_nodes": DrafterOption(TREE_NODES, 1, "a tree's nodes at most (at least k)")}


def lookup(ids: torch.Tensor, k: int, max_ngram: int = MAX_NGRAM, min_ngram: int = MIN_NGRAM) -> torch.Tensor:
    """ids [L] -> up to k tokens that followed the newest earlier occurrence of its longest matching
    suffix (n from max_ngram down to min_ngram); empty when no suffix recurs."""
    length = ids.numel()
    for n in range(min(max_ngram, length - 1), min_ngram - 1, -1):
        windows = ids[: length - 1].unfold(0, n, 1)  # [L-n, n]: every n-gram that has a token after it
        hits = (windows == ids[length - n :]).all(-1).nonzero()
        if hits.numel():
            start = int(hits[-1]) + n
            return ids[start : start + k]
    return ids[:0]


def continuations(ids: torch.Tensor, k: int, branches: int, max_ngram: int = MAX_NGRAM,
                  min_ngram: int = MIN_NGRAM) -> list[list[int]]:
    """Up to `branches` different continuations of up to k tokens, in lookup's order of preference: longest
    matching suffix first, newest occurrence first (the first is `lookup`'s)."""
    length, found = ids.numel(), []
    for n in range(min(max_ngram, length - 1), min_ngram - 1, -1):
        windows = ids[: length - 1].unfold(0, n, 1)
        for hit in reversed((windows == ids[length - n :]).all(-1).nonzero().flatten().tolist()):
            continuation = ids[hit + n : hit + n + k].tolist()
            if continuation not in found:
                found.append(continuation)
                if len(found) == branches:
                    return found
    return found


@register_drafter("prompt-lookup", options=OPTIONS)
class PromptLookup(DraftFree):
    name = "prompt-lookup"

    def __init__(self, context: DraftContext) -> None:
        super().__init__()
        self.max_ngram = context.options.get("max_ngram", MAX_NGRAM)
        self.branches = context.options.get("branches", 1)
        self.tree_nodes = context.options.get("tree_nodes", TREE_NODES)
        self.proposes_trees = self.branches > 1

    def propose(self, seq: AcceptedSequence, k: int) -> Proposal:
        start = time.perf_counter()
        if self.branches == 1:
            proposal = Proposal(lookup(seq.ids, k, self.max_ngram).clone(), None, seq.length, self.name)
        else:
            tree = TokenTree.from_branches(continuations(seq.ids, k, self.branches, self.max_ngram),
                                           max(k, self.tree_nodes))
            proposal = Proposal(tree.tokens, None, seq.length, self.name, tree=None if tree.is_chain else tree)
        self.compute_s += time.perf_counter() - start
        return proposal
