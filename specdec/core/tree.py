"""A token tree: several draft continuations verified in one block (SpecInfer, Medusa, EAGLE-2's trees; here
from prompt lookup's several matches).

    tree = TokenTree.from_branches([[5, 6, 7], [5, 9], [8]], budget=5)
    # nodes 0:5  1:6  2:7  3:9  4:8     parents (-1, 0, 1, 0, -1): -1 hangs a node from the root, the last
    #                                    accepted token; a node's parent comes before it
    logits = backend.forward_tree(state, unseen, tree)   # [1 + n, V]: row 0 the root's, row 1 + i node i's
    path, next_token = greedy_path(tree, logits)        # the nodes kept, root to leaf, and the cloud's token
    backend.commit_path(state, tree, path)              # the path's keys and values into place

Exact by the chain's rule: a node's row is the step that would follow its path, bit for bit, so a greedy walk
keeps exactly the tokens the verifier's own greedy decoding would produce (a lossless policy stays lossless). A
node sits at position (the root's) + its depth and sees the cached prefix and its own ancestors only.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import torch

from specdec.errors import InputError


@dataclass(frozen=True)
class TokenTree:
    """Nodes in an order where each parent precedes its children; `parents[i]` is -1 for a child of the root."""

    tokens: torch.Tensor  # [n] int64
    parents: tuple[int, ...]

    def __post_init__(self) -> None:
        if self.tokens.dim() != 1 or self.tokens.numel() != len(self.parents):
            raise InputError(f"a token tree needs one parent per token: {self.tokens.numel()} tokens, "
                             f"{len(self.parents)} parents")
        if any(not -1 <= parent < i for i, parent in enumerate(self.parents)):
            raise InputError(f"a token tree's parents must each come before their child (or be -1, the root): "
                             f"{list(self.parents)}")
        siblings = [(parent, int(token)) for parent, token in zip(self.parents, self.tokens.tolist())]
        if len(set(siblings)) != len(siblings):
            raise InputError("a token tree holds the same token twice under one parent: merge the branches")

    @classmethod
    def chain(cls, tokens: torch.Tensor) -> TokenTree:
        return cls(tokens, tuple(range(-1, tokens.numel() - 1)))

    @classmethod
    def from_branches(cls, branches: Sequence[Sequence[int]], budget: int) -> TokenTree:
        """Continuations merged into a trie (a shared prefix is one path), at most `budget` nodes, taken branch by
        branch in the order given: the first branch is kept whole (up to the budget), the next adds its new nodes."""
        tokens: list[int] = []
        parents: list[int] = []
        children: dict[tuple[int, int], int] = {}  # (parent, token) -> node
        for branch in branches:
            parent = -1
            for token in branch:
                node = children.get((parent, int(token)))
                if node is None:
                    if len(tokens) == budget:
                        break
                    node = children[(parent, int(token))] = len(tokens)
                    tokens.append(int(token))
                    parents.append(parent)
                parent = node
        return cls(torch.tensor(tokens, dtype=torch.long), tuple(parents))

    @property
    def size(self) -> int:
        return len(self.parents)

    @cached_property
    def depths(self) -> tuple[int, ...]:
        """A child of the root is at depth 1."""
        depth: list[int] = []
        for parent in self.parents:
            depth.append(1 if parent < 0 else depth[parent] + 1)
        return tuple(depth)

    @cached_property
    def ancestry(self) -> torch.Tensor:
        """[n, n] bool: row i is True at node i's ancestors and at i itself (what node i attends among the nodes)."""
        rows: list[list[bool]] = []
        for i, parent in enumerate(self.parents):
            row = list(rows[parent]) if parent >= 0 else [False] * self.size
            row[i] = True
            rows.append(row)
        return torch.tensor(rows, dtype=torch.bool).reshape(self.size, self.size)

    @property
    def depth(self) -> int:
        return max(self.depths, default=0)

    @property
    def is_chain(self) -> bool:
        return self.parents == tuple(range(-1, self.size - 1))

    def children(self, node: int) -> list[int]:
        """Node `node`'s children (-1: the root's), in node order."""
        return [i for i, parent in enumerate(self.parents) if parent == node]

    def path(self, node: int) -> list[int]:
        """The nodes from the root's child down to `node`."""
        nodes = []
        while node >= 0:
            nodes.append(node)
            node = self.parents[node]
        return nodes[::-1]

    def leaf_paths(self) -> list[list[int]]:
        """Every root-to-leaf path, leaves in node order: together they hold every node."""
        inner = set(self.parents)
        return [self.path(node) for node in range(self.size) if node not in inner]

    def prefixes(self, history: list[int]) -> list[list[int]]:
        """What each logits row follows: row 0 the root (`history`), row 1 + i node i's path."""
        tokens = self.tokens.tolist()
        return [history] + [history + [tokens[j] for j in self.path(i)] for i in range(self.size)]

    def ends_at(self, path: Sequence[int]) -> bool:
        """Whether `path` ends where the tree has no more nodes (the cloud's token is then a bonus, not a correction)."""
        return not self.children(path[-1] if path else -1)


def greedy_path(tree: TokenTree, logits: torch.Tensor) -> tuple[list[int], int]:
    """The greedy walk: from the root, step to the child whose token is the cloud's argmax at the current row, while
    there is one -> (the nodes kept, the cloud's argmax after them). The tokens kept are those the cloud's greedy
    decoding gives, and the last is the correction (a child missed) or the bonus (a leaf reached)."""
    argmax = logits.argmax(-1).tolist()  # [1 + n]: the cycle's one host read
    tokens = tree.tokens.tolist()
    path: list[int] = []
    node = -1
    while True:
        want = argmax[node + 1]
        child = next((c for c in tree.children(node) if tokens[c] == want), None)
        if child is None:
            return path, want
        path.append(child)
        node = child
