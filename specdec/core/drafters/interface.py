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
beside it, so a new drafter is one file. Its factory takes a `DraftContext`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol

import torch

from specdec.backends.base import Backend, Prompt
from specdec.core.block_length import DraftStop
from specdec.core.verdict import InFlight, Verdict
from specdec.core.processors import Constraints
from specdec.core.session import AcceptedSequence
from specdec.errors import ConfigError


@dataclass(frozen=True)
class Proposal:
    """A draft block d_0..d_{n-1} proposed after the accepted sequence's first `base` tokens."""

    tokens: torch.Tensor  # [n] int64
    probs: torch.Tensor | None  # [n, V]: what each d_i was drawn from; None: draft-free (a point mass)
    base: int  # seq.length when it was proposed
    drafter: str  # the registered name of what made it

    def __len__(self) -> int:
        return self.tokens.numel()

    def cut(self, n: int) -> Proposal:
        """The first n tokens (a stop token ends the block)."""
        probs = None if self.probs is None else self.probs[:n]
        return Proposal(self.tokens[:n], probs, self.base, self.drafter)


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
    name: str
    compute_s: float  # seconds spent proposing in this generation (a model drafter: its forwards)
    prefill_s: float  # the first proposal's share of it that read the prompt (0 for draft-free drafters)

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
    options: dict = field(default_factory=dict)  # a drafter's own settings by name
    memory: dict = field(default_factory=dict)  # what a drafter keeps across one engine's generations (by drafter name)
    cloud_caches: int = 1  # 2: the cloud is held in two runtimes (plain steps in one, blocks in the other), and
    # switching between them costs the one switched to a catch-up feed (specdec/core/cloud.py TwoRuntimeCloud)


# DraftContext.memory's key for the verify block's assumed cost in plain steps, by tokens fed (Engine.assume_block_costs)
BLOCK_STEPS_PRIOR = "block_steps_prior"
DRAFTERS: dict[str, Callable[[DraftContext], Drafter]] = {}  # --drafter name -> factory
NEEDS_MODEL: set[str] = set()  # drafters that run the edge model
# Drafters that weigh a two-runtime cloud's switches (DraftContext.cloud_caches): only they may run with
# one. Another drafter's first plain step after a block would feed the whole prompt to the second runtime.
WEIGHS_RUNTIMES: set[str] = set()


def register_drafter(name: str, *, needs_model: bool = False, weighs_runtimes: bool = False) -> Callable:
    """Decorator: file a drafter factory (or class taking a DraftContext) under `name`."""

    def register(factory):
        if name in DRAFTERS:
            raise ValueError(f"two drafters are registered as {name!r}: rename one")
        DRAFTERS[name] = factory
        if needs_model:
            NEEDS_MODEL.add(name)
        if weighs_runtimes:
            WEIGHS_RUNTIMES.add(name)
        return factory

    return register


def make_drafter(name: str, context: DraftContext) -> Drafter:
    if name not in DRAFTERS:
        raise ConfigError(f"unknown drafter {name!r}: use one of {', '.join(sorted(DRAFTERS))}")
    if name in NEEDS_MODEL and context.edge is None:
        raise ConfigError(f"drafter {name!r} runs an edge model: name one with --edge")
    return DRAFTERS[name](context)


class DraftFree:
    """A base for drafters that run no model: nothing to do while verifying, nothing to roll back
    unless they keep their own state (then override `rollback`)."""

    name = "draft-free"
    prefill_s = 0.0

    def __init__(self) -> None:
        self.compute_s = 0.0

    def meanwhile(self, seq: AcceptedSequence, proposal: Proposal, in_flight: InFlight, next_n: int) -> None:
        """A draft-free drafter has nothing to run while the cloud verifies."""

    def rollback(self, seq: AcceptedSequence, proposal: Proposal, verdict: Verdict | None) -> DraftNote:
        return DraftNote()
