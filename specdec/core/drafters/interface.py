"""What a drafter is: anything that proposes the next tokens of the accepted sequence.

    proposal = drafter.propose(seq, k)            # draft: up to k tokens after seq
    drafter.meanwhile(seq, proposal, in_flight)   # while a remote cloud verifies it (drafting ahead)
    note = drafter.rollback(seq, proposal, verdict)   # seq now holds what was kept: drop the rest

A model drafter (model.py) draws each token from a distribution and reports it, so the escalation
gate can read its entropy and speculative sampling its probability. A draft-free drafter (prompt
lookup, an n-gram cache) has no distribution: `Proposal.probs` is None, the gate always escalates
it, and speculative sampling treats each token as drawn from a point mass (accept with probability
cloud_probs(d_i); on rejection resample from cloud_probs with d_i removed), which stays lossless.

A drafter file registers itself (`@register_drafter("name")`) and the package imports every module
beside it, so a new drafter is one file. Its factory takes a `DraftContext`; the settings of its own it
declares (`options`) reach it there, filled from SpecConfig.drafter_options (`--drafter-options
max_ngram=2`), and any other is refused in one line.

A proposal without tokens is a plain step of the cloud (`plain_step`). On a cloud held in two runtimes
each proposal names where it is verified (`Route`, chosen by the `Router` in DraftContext.router).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Protocol

import torch

from specdec.backends.base import Backend
from specdec.backends.prompt import Prompt
from specdec.core.block_length import DraftStop
from specdec.core.history import History
from specdec.core.processors import Constraints
from specdec.core.session import AcceptedSequence
from specdec.core.tree import TokenTree
from specdec.core.verdict import InFlight, Route, Verdict
from specdec.errors import ConfigError


@dataclass(frozen=True)
class Proposal:
    """A draft block d_0..d_{n-1} proposed after the accepted sequence's first `base` tokens."""

    tokens: torch.Tensor  # [n] int64
    probs: torch.Tensor | None  # [n, V]: what each d_i was drawn from; None: draft-free (a point mass)
    base: int  # seq.length when it was proposed
    drafter: str  # the registered name of what made it (a plain step: its route's name)
    route: Route | None = None  # where a cloud held in two runtimes verifies it; None: the cloud has one
    tree: TokenTree | None = None  # the tokens are a tree's nodes (specdec/core/tree.py); None: a chain

    def __len__(self) -> int:
        return self.tokens.numel()

    @property
    def depth(self) -> int:
        """The most draft tokens a verdict can keep: a chain's length, a tree's depth."""
        return self.tree.depth if self.tree is not None else len(self)

    def kept(self, verdict: Verdict) -> list[int]:
        """The draft tokens `verdict` keeps: a chain's first `accepted`, a tree's accepted path."""
        tokens = self.tokens.tolist()
        return [tokens[node] for node in verdict.path] if self.tree is not None else tokens[: verdict.accepted]

    def corrected(self, verdict: Verdict) -> bool:
        """Whether the cloud's token replaces a draft token (a correction) rather than following the last (a bonus)."""
        return not self.tree.ends_at(verdict.path) if self.tree is not None else verdict.accepted < len(self)

    @property
    def verified_as(self) -> Route:
        """Its route; on a cloud of one runtime, a block, or a plain step when empty."""
        return self.route or (Route.BLOCK if len(self) else Route.STEP)

    def first_branch(self) -> Proposal:
        """A tree's first branch as a chain (a stop token inside the tree, a cloud lost: what a chain would do)."""
        if self.tree is None:
            return self
        return Proposal(self.tokens[self.tree.leaf_paths()[0]], None, self.base, self.drafter, self.route)

    def cut(self, n: int) -> Proposal:
        """The first n tokens (a stop token ends the block)."""
        probs = None if self.probs is None else self.probs[:n]
        return Proposal(self.tokens[:n], probs, self.base, self.drafter, self.route)


def plain_step(seq: AcceptedSequence, route: Route | None = None) -> Proposal:
    """No draft: the cycle is a plain step of the cloud (with `route` STAY, in the blocks' runtime)."""
    return Proposal(seq.ids[:0], None, seq.length, (route or Route.STEP).value, route)


def kept_when_decided(seq: AcceptedSequence, position: int, tokens: list[int]) -> int | None:
    """How many of `tokens`, proposed at `position` and not sent (or not all sent), a greedy verify would have kept,
    once the accepted sequence has decided them (all of them, or up to the first it did not keep); None until then."""
    decided = seq.ids[position : position + len(tokens)].tolist()
    matched = next((i for i, (a, b) in enumerate(zip(decided, tokens)) if a != b), len(decided))
    return matched if matched < len(decided) or len(decided) == len(tokens) else None


@dataclass(frozen=True)
class DraftNote:
    """What a cycle's drafting did beyond its block, for the trace (specdec.core.trace.Cycle's fields
    of the same names). Drafting ahead fills it; a sequential drafter returns it empty."""

    ahead_chosen: bool = False  # drafted ahead during this verify (true) or waited for it
    ahead_guess: int | None = None  # the bonus token the edge guessed and drafted after
    ahead_kept: int = 0  # tokens drafted ahead that became the next block's
    ahead_wasted: int = 0  # ... and those dropped
    edge_wait_s: float = 0.0  # the edge idle after drafting ahead, waiting for the verdict


class Drafter(Protocol):
    # What the loop reads of a drafter (an attribute or a property: DraftAhead passes its drafter's on).
    @property
    def name(self) -> str: ...

    @property
    def compute_s(self) -> float:
        """Seconds spent proposing in this generation (a model drafter: its forwards)."""
        ...

    @property
    def proposes_trees(self) -> bool:
        """Its proposals may be token trees (Proposal.tree), which only a cloud that accepts trees verifies."""
        ...

    @property
    def prefill_s(self) -> float:
        """The first proposal's share of compute_s that read the prompt (0 for draft-free drafters)."""
        ...

    def propose(self, seq: AcceptedSequence, k: int) -> Proposal:
        """Up to k (>= 1) tokens after `seq`; fewer if the drafter has no more to propose, none if it has none."""
        ...

    def meanwhile(self, seq: AcceptedSequence, proposal: Proposal, in_flight: InFlight, next_n: int) -> None:
        """Called while `proposal` is being verified; `next_n`: how many tokens the next block may hold
        (0: this one ends the generation). Most drafters do nothing; drafting ahead drafts here."""
        ...

    def rollback(self, seq: AcceptedSequence, proposal: Proposal, verdict: Verdict | None) -> DraftNote:
        """`seq` now holds the tokens kept from `proposal` (all of them when `verdict` is None: not
        verified) and the cloud's token: drop any state built past them."""
        ...


class Router(Protocol):
    """Where each cycle of one request runs on a cloud held in two runtimes (specdec/core/two_runtime.py)."""

    def route(self, seq: AcceptedSequence, drafted: int, tau_hat: float) -> Route:
        """The route of the next cycle, whose proposer has `drafted` tokens (tau_hat: its tokens per verify)."""
        ...

    def observe(self, proposal: Proposal, verdict: Verdict) -> None:
        """The verify of `proposal` came back: learn what it cost, and which runtime holds what."""
        ...


@dataclass(frozen=True)
class DraftContext:
    """What a drafter may be built from, for one generation."""

    prompt: Prompt
    vocab: int  # token ids the edge and the cloud share
    constraints: Constraints
    temperature: float
    generator: torch.Generator
    edge: Backend | None = None  # the edge model, for drafters that run one
    topn: int | None = None  # draw from the top-N of a distribution (speculative sampling over a small upload)
    stop_rule: DraftStop | None = None  # ends a model drafter's block early
    options: dict[str, int] = field(default_factory=dict)  # the drafter's own settings (`drafter_options`)
    history: History = field(default_factory=History)  # what the engine's earlier requests measured
    router: Router | None = None  # the cloud is held in two runtimes: where each cycle runs (two_runtime.py)


@dataclass(frozen=True)
class DrafterOption:
    """A setting a drafter takes (SpecConfig.drafter_options NAME=VALUE): an integer."""

    default: int
    minimum: int
    help: str


DRAFTERS: dict[str, Callable[[DraftContext], Drafter]] = {}  # --drafter name -> factory
NEEDS_MODEL: set[str] = set()  # drafters that run the edge model
DRAFTS_AHEAD: set[str] = set()  # drafters that can draft the next block while a remote verify is in flight
# Drafters that weigh a two-runtime cloud's switches (they ask DraftContext.router): only they may run on
# one. Another drafter's first plain step after a block would feed the whole prompt to the second runtime.
WEIGHS_RUNTIMES: set[str] = set()
OPTIONS: dict[str, dict[str, DrafterOption]] = {}  # drafter name -> the settings it takes


def register_drafter(name: str, *, needs_model: bool = False, drafts_ahead: bool = False,
                     weighs_runtimes: bool = False, options: dict[str, DrafterOption] | None = None) -> Callable:
    """Decorator: file a drafter factory (or class taking a DraftContext) under `name`."""

    def register(factory):
        if name in DRAFTERS:
            raise ValueError(f"two drafters are registered as {name!r}: rename one")
        DRAFTERS[name] = factory
        OPTIONS[name] = dict(options or {})
        for flag, names in ((needs_model, NEEDS_MODEL), (drafts_ahead, DRAFTS_AHEAD), (weighs_runtimes, WEIGHS_RUNTIMES)):
            if flag:
                names.add(name)
        return factory

    return register


def drafter_options(name: str, text: str) -> dict[str, int]:
    """`text` (NAME=VALUE[,NAME=VALUE]) as the settings drafter `name` takes, the rest at their defaults;
    an unknown drafter takes none (make_drafter names it)."""
    takes, values = OPTIONS.get(name, {}), {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, equals, value = (part.strip() for part in item.partition("="))
        if not equals or not key:
            raise ConfigError(f"drafter option {item!r} is not NAME=VALUE (e.g. max_ngram=2)")
        if key not in takes:
            offered = f"it takes {', '.join(sorted(takes))}" if takes else "it takes none"
            raise ConfigError(f"drafter {name!r} takes no option {key!r}: {offered}")
        if key in values:
            raise ConfigError(f"drafter option {key!r} is given twice: keep one")
        try:
            values[key] = int(value)
        except ValueError:
            raise ConfigError(f"drafter option {key} must be an integer, got {value!r}") from None
        if values[key] < takes[key].minimum:
            raise ConfigError(f"drafter option {key} of {name!r} must be >= {takes[key].minimum}, got {values[key]}")
    return {key: values.get(key, option.default) for key, option in takes.items()}


def describe_options() -> str:
    """Every registered drafter's settings, for the help of --drafter-options."""
    return "; ".join(f"{name}: " + ", ".join(f"{key} ({option.help}; default {option.default}, >= {option.minimum})"
                                             for key, option in takes.items())
                     for name, takes in OPTIONS.items() if takes)


def make_drafter(name: str, context: DraftContext, options: str = "") -> Drafter:
    """Drafter `name` for one generation, with its `options` (NAME=VALUE,...); a combination that cannot
    work is refused in one line."""
    if name not in DRAFTERS:
        raise ConfigError(f"unknown drafter {name!r}: use one of {', '.join(sorted(DRAFTERS))}")
    if name in NEEDS_MODEL and context.edge is None:
        raise ConfigError(f"drafter {name!r} runs an edge model: name one with --edge")
    if context.router is not None and name not in WEIGHS_RUNTIMES:
        raise ConfigError(f"a cloud held in two runtimes needs a drafter that weighs switching between them "
                          f"({', '.join(sorted(WEIGHS_RUNTIMES))}); {name!r} would feed the whole prompt to each")
    return DRAFTERS[name](replace(context, options=drafter_options(name, options)))


class DraftFree:
    """A base for drafters that run no model: nothing to do while verifying, nothing to roll back
    unless they keep their own state (then override `rollback`)."""

    name = "draft-free"
    prefill_s = 0.0
    proposes_trees = False

    def __init__(self) -> None:
        self.compute_s = 0.0

    def meanwhile(self, seq: AcceptedSequence, proposal: Proposal, in_flight: InFlight, next_n: int) -> None:
        """A draft-free drafter has nothing to run while the cloud verifies."""

    def rollback(self, seq: AcceptedSequence, proposal: Proposal, verdict: Verdict | None) -> DraftNote:
        return DraftNote()
