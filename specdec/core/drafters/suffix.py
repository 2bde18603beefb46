"""Suffix decoding (Oliaro et al. 2024, "SuffixDecoding"; vLLM's `suffix` method): no model. The accepted
sequence's longest suffix is matched in two corpora kept apart, and the tokens that followed its occurrences,
counted, propose a tree (or a chain) scored by their frequency:

    per session: this request's prompt and its output so far (what summaries, edits and RAG answers copy)
    global:      earlier requests' outputs on this engine, the newest `global_tokens` of them (what a workload
                 keeps repeating across requests: a template, an agent's tool calls, a language's idioms)

    for each corpus:
        m, ends = the longest suffix (at most max_depth tokens) occurring earlier with a token after it
        every occurrence's continuation (up to k tokens) joins a trie; a node's score is its path's share of the
        occurrences (SuffixDecoding's frequency score: count(path) / occurrences)
        nodes: best first by score, each at least min_percent/100, at most spec_factor * m (the match's
               length sizes the speculation: a long match is trusted further) and tree_nodes (a chain: k)
    propose the corpus whose nodes score more in all (the expected tokens a greedy verify keeps)

Each corpus is searched as a token array (`longest_match`, vectorised), never as n-gram tables: memory is the
tokens themselves, and the global corpus is bounded by `global_tokens`, its oldest outputs dropped first.

With `by_cost=1` the proposal is also sized by the verifier's cost curve: of the best-first nodes it sends the first
n that maximise (1 + calibration · Σ scores) / t_block(n + 1 rows), in plain steps (specdec/core/payoff.py's
`best_prefix`), and none (a plain step of the cloud) when no n beats a step. The calibration is what verdicts kept
over what the scores predicted, kept across the engine's requests: frequency scores over a handful of occurrences
are confident, and the cost of a row is the machine's, so both are measured rather than assumed. A block withheld
still teaches the calibration once the plain steps decide its tokens.
"""
from __future__ import annotations

import itertools
import time
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np
import torch

from specdec.core.drafters.interface import (
    DraftContext,
    DrafterOption,
    DraftFree,
    DraftNote,
    Proposal,
    plain_step,
    register_drafter,
)
from specdec.core.history import History
from specdec.core.payoff import best_prefix, steps_at
from specdec.core.running import RunningMean
from specdec.core.session import AcceptedSequence
from specdec.core.tree import TokenTree
from specdec.core.verdict import Verdict

SEPARATOR = -1  # between two outputs in the global corpus: no match or continuation crosses it
MAX_DEPTH = 24  # vLLM's suffix_decoding_max_tree_depth: the longest suffix matched
MAX_OCCURRENCES = 256  # the newest occurrences counted (a one-token suffix can recur thousands of times)
OPTIONS = {"max_depth": DrafterOption(MAX_DEPTH, 1, "the longest suffix matched, in tokens"),
           "tree_nodes": DrafterOption(0, 0, "propose a token tree of this many nodes at most (0: a chain of up to k)"),
           "min_percent": DrafterOption(10, 1, "a node's least score, in percent of the occurrences (vLLM: 10)"),
           "spec_factor": DrafterOption(1, 0, "nodes at most this many times the match's length (0: no such bound)"),
           "global_tokens": DrafterOption(1 << 16, 0, "earlier outputs' tokens kept for the global corpus (0: none)"),
           "by_cost": DrafterOption(0, 0, "1: size each proposal by the verifier's measured cost curve")}


def longest_match(corpus: np.ndarray, pattern: np.ndarray, max_len: int) -> tuple[int, np.ndarray]:
    """(m, ends): the longest suffix of `pattern`, at most `max_len` tokens, that occurs in `corpus` with a token after
    it, and the position of each occurrence's last token, oldest first; (0, []) when not even its last token does."""
    if not len(pattern) or len(corpus) < 2:
        return 0, np.zeros(0, dtype=np.int64)
    ends = np.flatnonzero(corpus[:-1] == pattern[-1])
    ends = ends[corpus[ends + 1] != SEPARATOR]
    length = 1 if len(ends) else 0
    while len(ends) and length < min(max_len, len(pattern)):
        back = ends - length
        keep = ends[(back >= 0) & (corpus[np.maximum(back, 0)] == pattern[-1 - length])]
        if not len(keep):
            break
        ends, length = keep, length + 1
    return length, ends


@dataclass(frozen=True)
class Candidates:
    """Continuations of a match, best first: each a path of tokens (its parent's path one shorter, listed before it)
    with its score (the share of the occurrences that continue so)."""

    paths: tuple[tuple[int, ...], ...] = ()
    scores: tuple[float, ...] = ()

    @property
    def score(self) -> float:
        """The tokens a greedy verify is expected to keep of them all, by their frequencies."""
        return sum(self.scores)

    def first(self, n: int) -> Candidates:
        return Candidates(self.paths[:n], self.scores[:n])

    def chain(self) -> Candidates:
        """The best path only: from the root, each time the best child (a chain's proposal)."""
        keep: list[int] = []
        node: tuple[int, ...] = ()
        while (child := next((i for i, path in enumerate(self.paths)
                              if len(path) == len(node) + 1 and path[:-1] == node), None)) is not None:
            keep.append(child)
            node = self.paths[child]
        return Candidates(tuple(self.paths[i] for i in keep), tuple(self.scores[i] for i in keep))

    def tree(self) -> TokenTree:
        index = {path: i for i, path in enumerate(self.paths)}
        return TokenTree(torch.tensor([path[-1] for path in self.paths], dtype=torch.long),
                         tuple(index[path[:-1]] if len(path) > 1 else -1 for path in self.paths))


def continuations(corpus: np.ndarray, ends: np.ndarray, depth: int, min_score: float) -> list[tuple[tuple[int, ...], float, int]]:
    """Every path of up to `depth` tokens that follows at least `min_score` of the occurrences ending at `ends`, with
    its score and its newest occurrence's end (a tie's tiebreak: the newest, as prompt lookup prefers)."""
    ends = ends[-MAX_OCCURRENCES:]
    total = len(ends)
    if not total or depth < 1:
        return []
    if total == 1:  # one occurrence (a long match, most often): its continuation, every node certain
        end = int(ends[0])
        run = corpus[end + 1 : end + 1 + depth].tolist()
        run = run[: run.index(SEPARATOR)] if SEPARATOR in run else run
        return [(tuple(run[: n + 1]), 1.0, end) for n in range(len(run))]
    offsets = ends[:, None] + 1 + np.arange(depth)[None, :]
    table = np.where(offsets < len(corpus), corpus[np.minimum(offsets, len(corpus) - 1)], SEPARATOR)
    table = np.where(np.cumsum(table == SEPARATOR, axis=1) > 0, SEPARATOR, table)  # a continuation stops at a separator
    found = []
    for level in range(depth):
        rows = table[:, level] != SEPARATOR
        if not rows.any():
            break
        paths, inverse, counts = np.unique(table[rows, : level + 1], axis=0, return_inverse=True, return_counts=True)
        newest = np.full(len(paths), -1, dtype=np.int64)
        np.maximum.at(newest, inverse.reshape(-1), ends[rows])
        kept = [(tuple(int(t) for t in path), float(count / total), int(end))
                for path, count, end in zip(paths, counts, newest) if count / total >= min_score]
        if not kept:
            break
        found += kept
    return found


def candidates(corpus: np.ndarray, pattern: np.ndarray, settings: SuffixSettings, k: int) -> Candidates:
    """The best-first nodes `corpus` proposes after `pattern` (module docstring)."""
    match, ends = longest_match(corpus, pattern, settings.max_depth)
    found = continuations(corpus, ends, k, settings.min_percent / 100)
    budget = max(k, settings.tree_nodes) if settings.tree_nodes else k
    if settings.spec_factor:
        budget = min(budget, settings.spec_factor * match)
    # best first: a higher score, then a shorter path (a parent ties its only child and must come first), then newer
    found.sort(key=lambda item: (-item[1], len(item[0]), -item[2]))
    best = Candidates(tuple(path for path, _, _ in found), tuple(score for _, score, _ in found))
    return (best if settings.tree_nodes else best.chain()).first(budget)


@dataclass(frozen=True)
class SuffixSettings:
    """The drafter's options, each defaulting to OPTIONS' default."""

    max_depth: int = OPTIONS["max_depth"].default
    tree_nodes: int = OPTIONS["tree_nodes"].default
    min_percent: int = OPTIONS["min_percent"].default
    spec_factor: int = OPTIONS["spec_factor"].default
    global_tokens: int = OPTIONS["global_tokens"].default
    by_cost: int = OPTIONS["by_cost"].default


@dataclass
class Outputs:
    """The global corpus: the engine's outputs, newest last, at most `budget` tokens (the oldest dropped first; the
    one still growing is kept whole). Each generation's drafter updates its own part as its output grows."""

    budget: int
    parts: OrderedDict[int, np.ndarray] = field(default_factory=OrderedDict)
    keys: itertools.count = field(default_factory=itertools.count)
    total: int = 0  # tokens in `parts`
    # (the part left out, the other parts separated) until another part changes: a session's own output grows every
    # cycle, the others not while it decodes, so its corpus is joined once a generation, not once a cycle
    joined: tuple[int, np.ndarray] | None = None

    def new_key(self) -> int:
        return next(self.keys)

    def put(self, key: int, tokens: np.ndarray) -> None:
        self.total += len(tokens) - len(self.parts.get(key, ()))
        self.parts[key] = tokens
        if self.joined is not None and self.joined[0] != key:
            self.joined = None
        while self.total > self.budget and len(self.parts) > 1 and (oldest := next(iter(self.parts))) != key:
            self.total -= len(self.parts.pop(oldest))
            self.joined = None

    def corpus(self, leave_out: int) -> np.ndarray:
        """Every output but `leave_out`'s (the session's own output is its own corpus), separated."""
        if self.joined is None or self.joined[0] != leave_out:
            parts = [part for key, part in self.parts.items() if key != leave_out and len(part)]
            separated = list(itertools.chain.from_iterable((part, np.array([SEPARATOR])) for part in parts))
            flat = np.concatenate(separated[:-1]).astype(np.int64, copy=False) if parts else np.zeros(0, dtype=np.int64)
            self.joined = (leave_out, flat)
        return self.joined[1]


@dataclass
class SuffixRecord:
    """What the drafter keeps across an engine's requests (History.own)."""

    outputs: Outputs
    kept_per_score: RunningMean = field(default_factory=RunningMean)  # Σ tokens kept / Σ scores of what proposed them

    def calibration(self) -> float:
        mean = self.kept_per_score.mean
        return 1.0 if mean is None else mean


@register_drafter("suffix", options=OPTIONS)
class SuffixDrafter(DraftFree):
    name = "suffix"

    def __init__(self, context: DraftContext) -> None:
        super().__init__()
        self.settings = SuffixSettings(**{key: context.options[key] for key in OPTIONS if key in context.options})
        self.history: History = context.history
        self.record = self.history.own(self.name, lambda: SuffixRecord(Outputs(self.settings.global_tokens)))
        self.record.outputs.budget = self.settings.global_tokens
        self.key = self.record.outputs.new_key()
        self.proposes_trees = self.settings.tree_nodes > 0
        self.sent = Candidates()  # the nodes last proposed
        self.withheld: list[tuple[int, Candidates]] = []  # (position, nodes) not sent, until steps decide them

    def propose(self, seq: AcceptedSequence, k: int) -> Proposal:
        start = time.perf_counter()
        ids = seq.ids.numpy()
        pattern = ids[-self.settings.max_depth :]
        best = candidates(ids, pattern, self.settings, k)
        if self.settings.global_tokens:
            other = candidates(self.record.outputs.corpus(self.key), pattern, self.settings, k)
            best = other if other.score > best.score else best
        chosen = best
        if self.settings.by_cost and best.paths:
            steps = self.history.verify.block_steps(self.history.block_steps_prior)
            chosen = best.first(best_prefix(best.scores, self.record.calibration(), lambda rows: steps_at(steps, rows)))
            if not chosen.paths:  # a plain step: its tokens will say what the nodes were worth
                self.withheld.append((seq.length, best))
        self.sent = chosen
        self.compute_s += time.perf_counter() - start
        if not chosen.paths:  # withheld by the cost rule: a plain step; nothing matched: an empty block, as lookup's
            return plain_step(seq) if best.paths else Proposal(seq.ids[:0], None, seq.length, self.name)
        tree = chosen.tree()
        return Proposal(tree.tokens, None, seq.length, self.name, tree=None if tree.is_chain else tree)

    def rollback(self, seq: AcceptedSequence, proposal: Proposal, verdict: Verdict | None) -> DraftNote:
        """Learn the verify's cost, then what `remember` keeps."""
        if verdict is not None:
            self.history.verify.observe_verify(proposal.verified_as, len(proposal), verdict)
        self.remember(seq, proposal, verdict)
        return DraftNote()

    def remember(self, seq: AcceptedSequence, proposal: Proposal, verdict: Verdict | None) -> None:
        """What the scores were worth (after its own proposals); the output so far joins the global corpus, whoever
        proposed the cycle's block (the hybrid drafter's model blocks too)."""
        start = time.perf_counter()
        if verdict is not None and len(proposal) and proposal.drafter == self.name:
            self.record.kept_per_score.add(verdict.accepted, self.sent.score)
        self.read_withheld(seq)
        if self.settings.global_tokens:
            self.record.outputs.put(self.key, seq.ids[seq.prompt_len :].numpy().copy())
        self.compute_s += time.perf_counter() - start

    def read_withheld(self, seq: AcceptedSequence) -> None:
        """Nodes withheld at position p: once the accepted sequence decides them, a greedy verify would have kept the
        longest of their paths that the decided tokens follow."""
        pending = []
        for position, nodes in self.withheld:
            decided = tuple(seq.ids[position : position + max(map(len, nodes.paths))].tolist())
            kept = max((len(path) for path in nodes.paths if decided[: len(path)] == path), default=0)
            longer = [path for path in nodes.paths if len(path) > len(decided) and path[: len(decided)] == decided]
            if longer and kept == len(decided):
                pending.append((position, nodes))  # the steps have not reached its end yet
            else:
                self.record.kept_per_score.add(kept, nodes.score)
        self.withheld = pending
