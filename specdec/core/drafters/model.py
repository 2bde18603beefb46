"""The edge model drafts: one token per forward on its own KV cache, each drawn from the edge's
distribution (argmax when greedy), which the proposal carries for the gate and the policies."""
from __future__ import annotations

import time

import torch

from specdec.core.drafters.interface import DraftContext, DraftNote, Proposal, register_drafter
from specdec.core.running import ema
from specdec.core.sampling import choose, distribution, entropy_nats
from specdec.core.session import AcceptedSequence, Session
from specdec.core.verdict import InFlight, Verdict

Drawn = tuple[torch.Tensor, torch.Tensor]  # (token 0-d, the distribution [V] it was drawn from)


def top_n(probs: torch.Tensor, n: int) -> torch.Tensor:
    """[V] -> the n most likely entries renormalized, zeros elsewhere. Drafting from this (not
    from the full distribution) keeps speculative sampling exact with only n values uploaded."""
    values, index = probs.topk(n)
    return torch.zeros_like(probs).scatter_(-1, index, values / values.sum())


@register_drafter("model", needs_model=True, drafts_ahead=True)
class ModelDrafter:
    """The edge model's session. Its cache holds a prefix of the accepted sequence plus, while
    drafting, its own draft tokens; `rollback` crops it to the part the cycle kept."""

    name = "model"
    proposes_trees = False

    def __init__(self, context: DraftContext) -> None:
        assert context.edge is not None  # make_drafter refuses a needs_model drafter without an edge model
        self.session = Session(context.edge, context.prompt)
        self.vocab, self.constraints, self.generator = context.vocab, context.constraints, context.generator
        self.temperature, self.topn, self.stop_rule = context.temperature, context.topn, context.stop_rule
        self.step_s: float | None = None  # running mean of one drafting forward (EMA, alpha 0.5)

    @property
    def compute_s(self) -> float:
        return self.session.compute_s

    @property
    def prefill_s(self) -> float:
        return self.session.prefill_s

    def step(self, feed: torch.Tensor, history: list[int]) -> tuple[torch.Tensor, torch.Tensor, bool]:
        """Feed a block; draw the next token. -> (token 0-d, dist [V] it was drawn from, stop here?)"""
        start = time.perf_counter()
        logits = self.session.feed(feed, keep=1)[-1, : self.vocab]  # [V], on the edge's device
        if self.constraints.processors:
            logits = self.constraints.apply(history, logits)
        if self.temperature > 0:  # drawn with the host generator: one seed, one stream, on any device
            logits = logits.cpu()
        dist = distribution(logits, self.temperature)
        if self.topn:
            dist = top_n(dist, self.topn)
        token = choose(logits, dist, self.temperature > 0, self.generator)
        stop = self.stop_rule is not None and self.stop_rule(dist, float(entropy_nats(dist)))
        elapsed = time.perf_counter() - start
        self.step_s = ema(self.step_s, elapsed)
        return token, dist, stop

    def extend(self, seq: AcceptedSequence, n: int, drafted: list[Drawn], stopped: bool = False) -> list[Drawn]:
        """Draw tokens after seq + `drafted` until there are n or the stop rule ends the block.
        The cache's unseen accepted tokens go in as ONE forward, never token by token."""
        feed = drafted[-1][0].view(1) if drafted else self.session.unseen(seq)
        # Processors read the tokens so far as ints; without them a device's draft is never read token by token.
        history = seq.generated + [int(token) for token, _ in drafted] if self.constraints.processors else seq.generated
        while len(drafted) < n and not stopped:
            token, dist, stopped = self.step(feed, history)
            drafted.append((token, dist))
            if self.constraints.processors:
                history.append(int(token))
            feed = token.view(1)
        return drafted

    def propose(self, seq: AcceptedSequence, k: int) -> Proposal:
        return proposal_of(self.extend(seq, k, []), seq.length, self.name)

    def meanwhile(self, seq: AcceptedSequence, proposal: Proposal, in_flight: InFlight, next_n: int) -> None:
        """Sequential: the edge waits for the verdict (ahead.py drafts meanwhile)."""

    def rollback(self, seq: AcceptedSequence, proposal: Proposal, verdict: Verdict | None) -> DraftNote:
        """Crop to the accepted prefix the cache was built from, keeping one accepted token unseen
        (the next proposal's first feed). After a lost cloud the cache may have fed the whole
        block, hence the bound by seq.length - 1 too."""
        kept = len(proposal) if verdict is None else verdict.accepted
        self.session.rollback(min(self.session.length, proposal.base + kept, seq.length - 1), seq)
        return DraftNote()


def proposal_of(drafted: list[Drawn], base: int, name: str) -> Proposal:
    """The block's tokens on the host (one read per block), their distributions where the edge computed them."""
    return Proposal(torch.stack([t for t, _ in drafted]).cpu(), torch.stack([d for _, d in drafted]), base, name)
