"""The cloud's half of a cycle behind one interface, whether the cloud runs in this process or
behind a verifier server (`specdec.remote`):

    cloud = LocalCloud(backend)                                   # or RemoteCloud(url)
    session = cloud.open(prompt, spec, decode, constraints, vocab, generator)   # one per generation
    verdict = session.verify(seq, draft_tokens, draft_probs)      # logits -> processors -> policy
    session.rollback(length, seq); session.close()

Names: a `CloudSession` is one generation's conversation with the cloud (verdicts); a verifier
(`specdec.core.verifier`, picked by `--verifier`) is the forward inside it that computes the cloud logits.

The acceptance policy runs where the cloud logits are: a remote verify returns the accepted count
and the next token, never [k+1, V] logits (151,936 floats per position on the real pair).
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Protocol, runtime_checkable

import torch

from specdec.backends.base import Backend
from specdec.backends.prompt import Prompt
from specdec.core.config import DecodeConfig, SpecConfig
from specdec.core.policies import make_policy, needs_probs
from specdec.core.processors import Constraints
from specdec.core.sampling import distribution
from specdec.core.session import AcceptedSequence
from specdec.core.tree import TokenTree, greedy_path
from specdec.core.verdict import CloudLost, InFlight, Route, Verdict
from specdec.core.verifier import CachedVerifier, make_verifier
from specdec.errors import SpecdecError
from specdec.settings import OnCloudLoss


class CloudSession(Protocol):
    """One generation's verdicts from the cloud: opened on the first escalation, closed at the end."""

    @property
    def compute_s(self) -> float:
        """Cloud seconds inside model forwards for this generation."""
        ...

    @property
    def round_trip_s(self) -> float | None:
        """Expected send -> verdict time (remote only; None: nothing to overlap with)."""
        ...

    def verify(self, seq: AcceptedSequence, draft_tokens: torch.Tensor, draft_probs: torch.Tensor | None) -> Verdict: ...

    # draft_probs None: a draft-free proposal (a point mass per token, see specdec/core/drafters/interface.py).

    def rollback(self, length: int, seq: AcceptedSequence) -> None: ...

    def close(self) -> None: ...


@runtime_checkable
class SplitSession(CloudSession, Protocol):
    """A remote session: it also splits `verify` in three, so the edge can draft while it waits."""

    def send(self, seq: AcceptedSequence, draft_tokens: torch.Tensor, draft_probs: torch.Tensor | None,
             tree: TokenTree | None = None) -> None: ...

    def ready(self) -> bool:
        """Has the verdict arrived? Never blocks."""
        ...

    def receive(self) -> Verdict: ...


class Cloud(Protocol):
    @property
    def vocab_size(self) -> int: ...

    @property
    def accepts_audio(self) -> bool: ...

    @property
    def accepts_trees(self) -> bool:
        """Verifies token trees (LocalCloudSession.verify_tree, or a server whose runtime does); a two-runtime cloud
        verifies chains."""
        ...

    def open(self, prompt: Prompt, spec: SpecConfig, decode: DecodeConfig, constraints: Constraints, vocab: int,
             generator: torch.Generator) -> CloudSession: ...


def process_rows(logits: torch.Tensor, history: list[int], block: list[int], constraints: Constraints) -> torch.Tensor:
    """Row i of [n+1, V] is the distribution after history + block[:i]."""
    return process_prefixed(logits, [history + block[:i] for i in range(logits.shape[0])], constraints)


def process_prefixed(logits: torch.Tensor, prefixes: list[list[int]], constraints: Constraints) -> torch.Tensor:
    """Row i of logits is the distribution after prefixes[i] (a tree's rows follow their paths)."""
    if not constraints.processors:
        return logits
    return torch.stack([constraints.apply(prefix, row) for prefix, row in zip(prefixes, logits)])


class LocalCloudSession:
    """One explicit cloud forward per block ([n+1, V] logits), the decoding constraints on each
    row, temperature once, then the acceptance policy. The server runs this same class."""

    def __init__(self, backend: Backend, prompt: Prompt, spec: SpecConfig, decode: DecodeConfig,
                 constraints: Constraints, vocab: int, generator: torch.Generator) -> None:
        self.verifier = make_verifier(spec.verifier, backend, prompt)
        self.policy = make_policy(spec.policy, spec.accept_threshold)
        self.needs_probs = needs_probs(spec.policy)
        self.decode, self.constraints, self.vocab, self.generator = decode, constraints, vocab, generator
        self.round_trip_s = None  # in process there is nothing to overlap with

    @property
    def compute_s(self) -> float:
        return self.verifier.compute_s

    def verify(self, seq: AcceptedSequence, draft_tokens: torch.Tensor, draft_probs: torch.Tensor | None) -> Verdict:
        return self.decide(seq, draft_tokens, draft_probs, self.verifier.logits(seq, draft_tokens))

    def verify_tree(self, seq: AcceptedSequence, tree: TokenTree) -> Verdict:
        """A token tree's verdict, greedy (speculative_decode refuses trees under another policy or sampling): the
        walk down the cloud's argmax (specdec/core/tree.py), the accepted path committed to the cloud's cache."""
        verifier = self.verifier
        assert isinstance(verifier, CachedVerifier)  # check_trees: a tree goes to a cached verifier only
        return self.decide_tree(seq, tree, verifier.tree_logits(seq, tree))

    def decide_tree(self, seq: AcceptedSequence, tree: TokenTree, logits: torch.Tensor) -> Verdict:
        """A tree's verdict from its logits [1 + nodes, V] (computed here or by a server's batch), the kept path
        committed to the cache (the caller's rollback then crops past it)."""
        verifier = self.verifier
        assert isinstance(verifier, CachedVerifier)
        logits = process_prefixed(logits[:, : self.vocab], tree.prefixes(seq.generated), self.constraints)
        self.check_allowed(logits)
        path, next_token = greedy_path(tree, logits)
        verifier.commit_path(tree, path)
        return Verdict(len(path), next_token, verifier.last_tokens_in, verifier.last_sent_features,
                       path=tuple(path))

    def decide(self, seq: AcceptedSequence, draft_tokens: torch.Tensor, draft_probs: torch.Tensor | None,
               logits: torch.Tensor) -> Verdict:
        """The verdict on a block from its cloud logits [n+1, V] (computed alone or in a shared forward)."""
        cloud_logits = logits[:, : self.vocab]  # [n+1, V], on the cloud's device
        if self.decode.do_sample:  # drawn with the session's host generator: one seed, one stream, on any device
            cloud_logits = cloud_logits.cpu()
            draft_probs = None if draft_probs is None else draft_probs.cpu()
        cloud_logits = process_rows(cloud_logits, seq.generated, draft_tokens.tolist(), self.constraints)
        draft_tokens = draft_tokens.to(cloud_logits.device, non_blocking=True)  # [n], beside the logits
        self.check_allowed(cloud_logits)
        cloud_probs = None  # greedy verification reads the logits alone, as plain greedy decoding does:
        if self.decode.do_sample or self.needs_probs:  # no softmax over V per step
            cloud_probs = distribution(cloud_logits, self.decode.temperature)
            if not bool(torch.isfinite(cloud_probs).all()):
                raise SpecdecError(f"the cloud distribution is not finite at temperature {self.decode.temperature:g}")
        accepted, next_token = self.policy(
            draft_tokens, draft_probs, cloud_logits, cloud_probs, self.decode.do_sample, self.generator
        )
        return Verdict(accepted, int(next_token), self.verifier.last_tokens_in, self.verifier.last_sent_features)

    def check_allowed(self, logits: torch.Tensor) -> None:
        """Only a processor masks logits (e.g. vocab 1 under a profile that masks that token): a row with no token
        left is one line, not a draw from nothing."""
        if self.constraints.processors and bool(torch.isneginf(logits).all(-1).any()):
            raise SpecdecError(f"the constraints allow no token of this session's vocabulary ({self.vocab}): "
                               "widen vocab or use other constraints")

    def rollback(self, length: int, seq: AcceptedSequence) -> None:
        self.verifier.rollback(length, seq)

    def close(self) -> None:
        """Nothing to release: the cache goes with this object."""


@dataclass
class LocalCloud:
    """The cloud model in this process."""

    backend: Backend

    @property
    def vocab_size(self) -> int:
        return self.backend.vocab_size

    @property
    def accepts_audio(self) -> bool:
        return self.backend.accepts_audio

    @property
    def accepts_trees(self) -> bool:
        return self.backend.accepts_trees

    def open(self, prompt: Prompt, spec: SpecConfig, decode: DecodeConfig, constraints: Constraints, vocab: int,
             generator: torch.Generator) -> LocalCloudSession:
        return LocalCloudSession(self.backend, prompt, spec, decode, constraints, vocab, generator)


def as_cloud(cloud: Backend | Cloud) -> Cloud:
    """A backend is a cloud in this process; anything with `open` already is a cloud."""
    return cloud if hasattr(cloud, "open") else LocalCloud(cloud)


class CloudLink:
    """The cloud as one generation sees it. The session opens on the first verify (a block never
    escalated costs the cloud nothing) and closes with `close`. A lost cloud (`CloudLost`) fails the
    generation; `EdgeFallbackLink` goes on edge-only instead."""

    lost = False

    def __init__(self, cloud: Cloud, opening: tuple) -> None:
        self.cloud, self.opening = cloud, opening  # opening: cloud.open's arguments
        self.session: CloudSession | None = None

    @property
    def compute_s(self) -> float:
        return self.session.compute_s if self.session is not None else 0.0

    def send(self, seq: AcceptedSequence, draft_tokens: torch.Tensor, draft_probs: torch.Tensor | None,
             route: Route | None = None, tree: TokenTree | None = None) -> InFlight:
        """Send a block for its verdict; the verdict records when it left and when it was read. `route`: where
        a cloud held in two runtimes (in process, specdec/core/two_runtime.py) verifies it; `tree`: the tokens
        are its nodes (only to a cloud that accepts trees: speculative_decode checks)."""
        session = self.session = self.session or self.cloud.open(*self.opening)
        sent_at = time.perf_counter()

        def stamped(verdict: Verdict) -> Verdict:
            verdict.sent_at, verdict.read_at = sent_at, time.perf_counter()
            return verdict

        round_trip_s = session.round_trip_s
        if tree is not None and round_trip_s is None:  # in process: the one local session whose cloud takes trees
            assert isinstance(session, LocalCloudSession)
            verdict = stamped(session.verify_tree(seq, tree))
            return InFlight(lambda: verdict)
        if round_trip_s is None:  # in process: decided now
            routed = () if route is None else (route,)
            verdict = stamped(session.verify(seq, draft_tokens, draft_probs, *routed))
            return InFlight(lambda: verdict)
        assert isinstance(session, SplitSession)  # a round trip to overlap with: a remote session, which splits verify
        session.send(seq, draft_tokens, draft_probs, tree)
        return InFlight(lambda: stamped(session.receive()), session.ready, sent_at + round_trip_s)

    def rollback(self, length: int, seq: AcceptedSequence) -> None:
        if self.session is not None:
            self.session.rollback(length, seq)

    def close(self) -> None:
        if self.session is not None:
            self.session.close()
        self.session = None


class EdgeFallbackLink(CloudLink):
    """on_cloud_loss "edge": a lost cloud closes the session and answers None from then on; the
    generation goes on edge-only (degraded), its draft blocks kept unverified."""

    def send(self, seq: AcceptedSequence, draft_tokens: torch.Tensor, draft_probs: torch.Tensor | None,
             route: Route | None = None, tree: TokenTree | None = None) -> InFlight:
        if self.lost:
            return InFlight(lambda: None)
        try:
            in_flight = super().send(seq, draft_tokens, draft_probs, route, tree)
        except CloudLost:
            return self.lose()
        return replace(in_flight, receive=lambda: self.guarded(in_flight.receive))

    def guarded(self, receive: Callable[[], Verdict | None]) -> Verdict | None:
        try:
            return receive()
        except CloudLost:
            self.lose()
            return None

    def lose(self) -> InFlight:
        self.lost = True
        self.close()
        return InFlight(lambda: None)


def open_link(cloud: Cloud, opening: tuple, on_loss: OnCloudLoss = OnCloudLoss.FAIL) -> CloudLink:
    """on_loss: FAIL raises CloudLost, EDGE goes on edge-only."""
    return EdgeFallbackLink(cloud, opening) if on_loss == OnCloudLoss.EDGE else CloudLink(cloud, opening)
