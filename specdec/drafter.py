"""The edge's drafting: its session, the stop rule that ends a block early, and tokens drafted
ahead while the cloud verifies the previous block (overlap, split deployment only).

Drafting ahead (SpecEdge's proactive drafting; AMUSD runs draft and verify concurrently): once a
block d_0..d_{n-1} is sent, the edge guesses the cloud's bonus token g (its own choice after d_{n-1}:
argmax when greedy, a draw when sampling) and drafts a_0, a_1, ... after it until the reply comes.
If the cloud accepts the whole block and its bonus is g, the prefix the a_i were drafted on is
exactly the accepted sequence, so they are valid drafts of the next block (lossless for greedy and,
drawn from the edge's own distribution on that prefix, for speculative sampling). Otherwise they
are dropped and the edge cache is cropped as after any cycle.

A forward cannot be interrupted, so a verdict that lands mid-forward waits for it: drafting ahead
without a limit made every cycle later by up to one edge step, and with few blocks kept the
overlapped edge was slower than the sequential one (code 0.88x, zh-describe 0.77x on the real pair
over 4g). So the edge only starts a forward that its measured step time says will end before the
verdict's expected arrival (the round trips measured so far in this generation): drafting ahead
then uses time the edge would have spent idle, and costs the critical path nothing but noise.
Where the edge and the server share cores it still slows the verify itself; `overlap = "auto"` (the
default) asks specdec/overlap.py before every verify whether drafting ahead has paid in this run.
"""
from __future__ import annotations

import time
from typing import Callable

import torch

from specdec.cloud import CloudSession, Verdict
from specdec.drafting import DraftStop
from specdec.overlap import OverlapGovernor
from specdec.processors import Constraints
from specdec.sampling import choose, distribution, entropy_nats
from specdec.session import AcceptedSequence, Session


def block_size(k: int, remaining: int) -> int:
    """Draft tokens for the next block. Near the budget, leave one slot for the cloud's correction
    or bonus token (as HF's assisted generation does): drafting the token the bonus supplies
    anyway costs an edge step for nothing."""
    return max(1, min(k, remaining - 1))


def top_n(probs: torch.Tensor, n: int) -> torch.Tensor:
    """[V] -> the n most likely entries renormalized, zeros elsewhere. Drafting from this (not
    from the full distribution) keeps speculative sampling exact with only n values uploaded."""
    values, index = probs.topk(n)
    return torch.zeros_like(probs).scatter_(-1, index, values / values.sum())


class Drafter:
    def __init__(self, session: Session, vocab: int, constraints: Constraints, temperature: float,
                 generator: torch.Generator, topn: int | None = None, stop_rule: DraftStop | None = None,
                 overlap: bool = False, governor: OverlapGovernor | None = None) -> None:
        self.session, self.vocab, self.constraints = session, vocab, constraints
        self.temperature, self.generator, self.topn, self.stop_rule = temperature, generator, topn, stop_rule
        self.overlap = overlap  # draft ahead while a remote session verifies
        self.governor = governor  # overlap "auto": asked before every remote verify (specdec/overlap.py)
        self.ahead_chosen = False  # this cycle's way: draft ahead during the verify, or wait for it
        self.verify_s = 0.0  # this cycle's send -> verdict read
        self.sent_at: float | None = None  # time.perf_counter() when this cycle's verify call began
        self.wait_s = 0.0  # the edge idle after drafting ahead, waiting for the last verdict
        self.guess: int | None = None  # the bonus token the ahead tokens were drafted after
        self.ahead: list[tuple[torch.Tensor, torch.Tensor]] = []  # (token, dist) drafted after the guess
        self.ahead_stopped = False  # the stop rule ended the ahead block
        self.step_s: float | None = None  # running mean of one drafting forward (EMA, alpha 0.5)

    def step(self, feed: torch.Tensor, history: list[int]) -> tuple[torch.Tensor, torch.Tensor, bool]:
        """Feed a block; draw the next token. -> (token 0-d, dist [V] it was drawn from, stop here?)"""
        start = time.perf_counter()
        logits = self.session.feed(feed, keep=1)[-1, : self.vocab]
        if self.constraints.processors:
            logits = self.constraints.apply(history, logits)
        dist = distribution(logits, self.temperature)
        if self.topn:
            dist = top_n(dist, self.topn)
        token = choose(logits, dist, self.temperature > 0, self.generator)
        stop = self.stop_rule is not None and self.stop_rule(dist, float(entropy_nats(dist)))
        elapsed = time.perf_counter() - start
        self.step_s = elapsed if self.step_s is None else 0.5 * (self.step_s + elapsed)
        return token, dist, stop

    def fits(self, deadline: float) -> bool:
        """Would one more forward end by `deadline` (a time.perf_counter() value)?"""
        return self.step_s is not None and time.perf_counter() + self.step_s <= deadline

    def draft(self, seq: AcceptedSequence, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Up to n tokens after the accepted sequence, fewer if the stop rule ends the block ->
        (tokens [m], draft_probs [m, V]). Starts from the tokens drafted ahead, when kept."""
        drafted, stopped = self.ahead, self.ahead_stopped
        self.ahead, self.ahead_stopped, self.guess, self.sent_at = [], False, None, None
        # Unseen accepted tokens go in as ONE forward, never token by token.
        feed = drafted[-1][0].view(1) if drafted else self.session.unseen(seq)
        history = seq.generated + [int(token) for token, _ in drafted]
        while len(drafted) < n and not stopped:
            token, dist, stopped = self.step(feed, history)
            drafted.append((token, dist))
            history.append(int(token))
            feed = token.view(1)
        drafted = drafted[:n]
        return torch.stack([t for t, _ in drafted]), torch.stack([d for _, d in drafted])

    def verify(self, cloud: CloudSession, seq: AcceptedSequence, draft_tokens: torch.Tensor, draft_probs: torch.Tensor,
               next_k: int, room: int) -> Verdict:
        """The block's verdict from `cloud`. With overlap on and a round trip to fill (a remote
        session: `round_trip_s` known), send it, draft up to block_size(next_k, room) tokens of the
        next block until the verdict is expected, then read it. `room`: tokens left after this
        block and its bonus (0 when the block ends the generation)."""
        self.sent_at, self.wait_s = time.perf_counter(), 0.0
        round_trip_s = cloud.round_trip_s
        self.ahead_chosen = (self.overlap and room >= 1 and round_trip_s is not None
                             and (self.governor is None or self.governor.choose()))
        if not self.ahead_chosen:
            verdict = cloud.verify(seq, draft_tokens, draft_probs)
        else:
            cloud.send(seq, draft_tokens, draft_probs)
            self.draft_ahead(seq, draft_tokens.tolist(), block_size(next_k, room), cloud.ready,
                             deadline=self.sent_at + round_trip_s)
            waiting = time.perf_counter()
            verdict = cloud.receive()
            self.wait_s = time.perf_counter() - waiting
        self.verify_s = time.perf_counter() - self.sent_at
        return verdict

    def draft_ahead(self, seq: AcceptedSequence, block: list[int], n: int, reply_ready: Callable[[], bool],
                    deadline: float) -> None:
        """While `block` is being verified: guess the bonus, then draft up to n tokens after it,
        stopping as soon as the reply is in (checked between forwards) or the next forward would
        end after `deadline`, the verdict's expected arrival."""
        if not self.fits(deadline):
            return
        history = seq.generated + block
        guess, _, _ = self.step(torch.tensor(block[-1:]), history)
        self.guess = int(guess)
        history.append(self.guess)
        feed = guess.view(1)
        while len(self.ahead) < n and not self.ahead_stopped and not reply_ready() and self.fits(deadline):
            token, dist, self.ahead_stopped = self.step(feed, history)
            self.ahead.append((token, dist))
            history.append(int(token))
            feed = token.view(1)

    def settle(self, accepted_whole_block: bool, bonus: int | None) -> tuple[int, int]:
        """After the verdict on the block drafted ahead of: keep the ahead tokens if the cloud took
        the whole block and its bonus is the guess. -> (kept, wasted) ahead tokens."""
        if self.guess is None:
            return 0, 0
        if accepted_whole_block and bonus == self.guess:
            self.guess = None
            return len(self.ahead), 0
        wasted = len(self.ahead)
        self.ahead, self.ahead_stopped, self.guess = [], False, None
        return 0, wasted

    @property
    def holds_ahead(self) -> bool:
        """The edge cache runs past the accepted sequence (kept ahead tokens): do not crop it."""
        return bool(self.ahead)
