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

With `by_cost=1` the chain is sized by the verifier's cost curve, where a row costs (an int8 block on AVX2 without
VNNI: 5 rows ~1.8 steps): of the continuation's tokens it sends the first n that maximise
(1 + Σ_{i≤n} P(the first i kept)) / t_block(n + 1 rows), in plain steps (payoff.py's `best_prefix`, as the suffix
drafter's `by_cost`), and none (a plain step) when no n beats a step. P(the first i kept) is the product of how often
the cloud's text kept the i-th token of a continuation whose first i - 1 it kept, counted per match length (a
3-token match is surer than a 1-token one) over the engine's requests, from every continuation found, sent or not:
once the accepted sequence has decided a continuation's tokens, it says how many a greedy verify keeps (under
sampling, an estimate). Before any count a token is an even chance.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from specdec.core.drafters.interface import (
    DraftContext,
    DrafterOption,
    DraftFree,
    DraftNote,
    Proposal,
    kept_when_decided,
    plain_step,
    register_drafter,
)
from specdec.core.history import History
from specdec.core.payoff import best_prefix, steps_at
from specdec.core.session import AcceptedSequence
from specdec.core.tree import TokenTree
from specdec.core.verdict import Verdict
from specdec.errors import ConfigError

MAX_NGRAM = 3  # Spec-Bench's PLD and HF's default search the last 3 (HF: max_matching_ngram_size 2) tokens
MIN_NGRAM = 1
TREE_NODES = 8  # a verify block of 9 rows: about one step where the kernels are flat (docs/runtimes.md)
OPTIONS = {"max_ngram": DrafterOption(MAX_NGRAM, MIN_NGRAM, "the longest suffix searched for, in tokens"),
           "branches": DrafterOption(1, 1, "matches proposed at once, as a token tree (1: a chain)"),
           "tree_nodes": DrafterOption(TREE_NODES, 1, "a tree's nodes at most (at least k)"),
           "by_cost": DrafterOption(0, 0, "1: size each chain by the verifier's measured cost curve")}


def lookup(ids: torch.Tensor, k: int, max_ngram: int = MAX_NGRAM, min_ngram: int = MIN_NGRAM) -> torch.Tensor:
    """ids [L] -> up to k tokens that followed the newest earlier occurrence of its longest matching
    suffix (n from max_ngram down to min_ngram); empty when no suffix recurs."""
    return match(ids, k, max_ngram, min_ngram)[0]


def match(ids: torch.Tensor, k: int, max_ngram: int = MAX_NGRAM, min_ngram: int = MIN_NGRAM) -> tuple[torch.Tensor, int]:
    """`lookup`'s tokens and the length of the suffix that matched (0: none did)."""
    length = ids.numel()
    for n in range(min(max_ngram, length - 1), min_ngram - 1, -1):
        windows = ids[: length - 1].unfold(0, n, 1)  # [L-n, n]: every n-gram that has a token after it
        hits = (windows == ids[length - n :]).all(-1).nonzero()
        if hits.numel():
            start = int(hits[-1]) + n
            return ids[start : start + k], n
    return ids[:0], 0


@dataclass
class KeptCounts:
    """How often the cloud's text kept a continuation's i-th token after keeping its first i - 1, per match length
    (History.own: across an engine's requests). `reached[n][i]`, `kept[n][i]`: i from 0."""

    reached: dict[int, list[int]] = field(default_factory=dict)
    kept: dict[int, list[int]] = field(default_factory=dict)

    def add(self, n: int, length: int, matched: int) -> None:
        """A continuation of `length` tokens after a match of n tokens, of which the first `matched` were kept (the
        next, if any, was not)."""
        reached, kept = self.reached.setdefault(n, []), self.kept.setdefault(n, [])
        for i in range(min(matched + 1, length)):
            if i == len(reached):
                reached.append(0)
                kept.append(0)
            reached[i] += 1
            kept[i] += i < matched

    def scores(self, n: int, length: int) -> list[float]:
        """P(the first i kept) for i = 1..length after a match of n tokens: a running product of (kept + 1) /
        (reached + 2) (an even chance before any count)."""
        reached, kept = self.reached.get(n, []), self.kept.get(n, [])
        out, p = [], 1.0
        for i in range(length):
            p *= ((kept[i] if i < len(kept) else 0) + 1) / ((reached[i] if i < len(reached) else 0) + 2)
            out.append(p)
        return out


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
        self.by_cost = bool(context.options.get("by_cost", 0))
        if self.by_cost and self.branches > 1:
            raise ConfigError("prompt-lookup: by_cost sizes a chain; with branches > 1 it proposes trees: drop one of "
                              "the two (the suffix drafter sizes trees by cost: --drafter suffix)")
        self.proposes_trees = self.branches > 1
        self.history: History = context.history
        self.counts = self.history.own(f"{self.name}:kept", KeptCounts) if self.by_cost else KeptCounts()
        self.found: list[tuple[int, list[int], int]] = []  # (position, continuation, match length) not yet decided

    def propose(self, seq: AcceptedSequence, k: int) -> Proposal:
        start = time.perf_counter()
        if self.by_cost:
            proposal = self.sized(seq, k)
        elif self.branches == 1:
            proposal = Proposal(lookup(seq.ids, k, self.max_ngram).clone(), None, seq.length, self.name)
        else:
            tree = TokenTree.from_branches(continuations(seq.ids, k, self.branches, self.max_ngram),
                                           max(k, self.tree_nodes))
            proposal = Proposal(tree.tokens, None, seq.length, self.name, tree=None if tree.is_chain else tree)
        self.compute_s += time.perf_counter() - start
        return proposal

    def sized(self, seq: AcceptedSequence, k: int) -> Proposal:
        """Lookup's chain cut where the cost curve says (module docstring); a plain step when no length pays."""
        self.read_decided(seq)
        tokens, n = match(seq.ids, k, self.max_ngram)
        if not tokens.numel():
            return Proposal(tokens.clone(), None, seq.length, self.name)
        self.found.append((seq.length, tokens.tolist(), n))
        steps = self.history.verify.block_steps(self.history.block_steps_prior)
        send = best_prefix(self.counts.scores(n, tokens.numel()), 1.0, lambda rows: steps_at(steps, rows))
        return Proposal(tokens[:send].clone(), None, seq.length, self.name) if send else plain_step(seq)

    def rollback(self, seq: AcceptedSequence, proposal: Proposal, verdict: Verdict | None) -> DraftNote:
        """Sized by cost: learn the verify's cost (the curve it reads)."""
        if self.by_cost and verdict is not None:
            self.history.verify.observe_verify(proposal.verified_as, len(proposal), verdict)
        return DraftNote()

    def read_decided(self, seq: AcceptedSequence) -> None:
        """Continuations found at position p: once the accepted sequence has decided their tokens (all of them, or up
        to one it did not keep), count how many a greedy verify keeps."""
        pending = []
        for position, tokens, n in self.found:
            kept = kept_when_decided(seq, position, tokens)
            if kept is None:
                pending.append((position, tokens, n))
            else:
                self.counts.add(n, len(tokens), kept)
        self.found = pending
