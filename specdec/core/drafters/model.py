"""The edge model drafts: one token per forward on its own KV cache, each drawn from the edge's
distribution (argmax when greedy), which the proposal carries for the gate and the policies.

`head_vocab=N` drafts from a smaller vocabulary (FR-Spec, Zhao et al. 2025): the ids below N, the prompt's and the
end-of-text ids; the edge's output head computes only those rows (Backend.with_head_rows: the kernels runtimes).
Lossless all the same: a draft is a proposal the cloud verifies, and under sampling a distribution that is zero
outside the subset is still one the verify rule corrects. It pays where the head is a large part of the edge's
step: the 0.5B's int8 head over 151,936 ids is 136 MB of the ~340 MB kernels-int4 reads a step; over the first
32,768 ids and the prompt's, its step took 9 ms against 12 (2026-11-30, AMD EPYC). In Qwen2's byte-level BPE the
lower ids are the earlier, commoner merges: over 60 Spec-Bench answers of the 1.5B, 90-95 % of their tokens lie
below 32,768, 93-99.7 % counting the prompt's ids, and the 0.5B's drafts matched the 1.5B's tokens within 1-2
points of its whole head's (docs/drafters.md)."""
from __future__ import annotations

import time

import torch

from specdec.core.drafters.interface import DraftContext, DrafterOption, DraftNote, Proposal, register_drafter
from specdec.core.running import ema
from specdec.core.sampling import choose, distribution, entropy_nats
from specdec.core.session import AcceptedSequence, Session
from specdec.core.verdict import InFlight, Verdict

Drawn = tuple[torch.Tensor, torch.Tensor]  # (token 0-d, the distribution [V] it was drawn from)
HEAD_VOCAB = DrafterOption(0, 0, "draft from the ids below this many, the prompt's and the end-of-text ids only; the "
                                 "edge's head computes just those (kernels runtimes; 0: the whole vocabulary)")
OPTIONS = {"head_vocab": HEAD_VOCAB}


def top_n(probs: torch.Tensor, n: int) -> torch.Tensor:
    """[V] -> the n most likely entries renormalized, zeros elsewhere. Drafting from this (not
    from the full distribution) keeps speculative sampling exact with only n values uploaded."""
    values, index = probs.topk(n)
    return torch.zeros_like(probs).scatter_(-1, index, values / values.sum())


def head_rows(context: DraftContext, below: int) -> torch.Tensor:
    """The ids a `head_vocab` drafter may propose: those below `below`, the prompt's, the edge's end-of-text ids,
    all within the vocabulary the edge and the cloud share."""
    assert context.edge is not None
    ids = [torch.arange(min(below, context.vocab)), context.prompt.input_ids.reshape(-1),
           torch.tensor(sorted(context.edge.eos_ids), dtype=torch.long)]
    every = torch.cat(ids)
    return every[(every >= 0) & (every < context.vocab)].unique()


def drafting_edge(context: DraftContext):
    """The edge as the drafter runs it: whole, or its head cut to `head_vocab`'s rows (refused in one line by a
    runtime that computes its whole head)."""
    assert context.edge is not None  # make_drafter refuses a needs_model drafter without an edge model
    below = context.options.get("head_vocab", 0)
    return context.edge.with_head_rows(head_rows(context, below)) if below else context.edge


@register_drafter("model", needs_model=True, drafts_ahead=True, options=OPTIONS)
class ModelDrafter:
    """The edge model's session. Its cache holds a prefix of the accepted sequence plus, while
    drafting, its own draft tokens; `rollback` crops it to the part the cycle kept."""

    name = "model"
    proposes_trees = False

    def __init__(self, context: DraftContext) -> None:
        self.session = Session(drafting_edge(context), context.prompt)
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
