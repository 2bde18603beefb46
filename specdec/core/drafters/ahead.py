"""Drafting ahead: a model drafter that keeps drafting while a remote cloud verifies its block
(SpecEdge's proactive drafting; AMUSD runs draft and verify concurrently). Split deployment only:
in process there is no round trip to fill.

Once a block d_0..d_{n-1} is sent, the edge guesses the cloud's bonus token g (its own choice after
d_{n-1}: argmax when greedy, a draw when sampling) and drafts a_0, a_1, ... after it until the reply
comes. If the cloud accepts the whole block and its bonus is g, the prefix the a_i were drafted on is
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
default) asks specdec/core/overlap.py before every verify whether drafting ahead has paid in this run.
"""
from __future__ import annotations

import time

import torch

from specdec.core.drafters.interface import DraftNote, Proposal
from specdec.core.drafters.model import Drawn, ModelDrafter, proposal_of
from specdec.core.overlap import OverlapGovernor
from specdec.core.session import AcceptedSequence
from specdec.core.verdict import InFlight, Verdict


class DraftAhead:
    """Wraps a `ModelDrafter`. governor: `overlap = "auto"` (asked before every remote verify);
    None: draft ahead on every remote verify (`overlap = true`)."""

    def __init__(self, drafter: ModelDrafter, governor: OverlapGovernor | None = None) -> None:
        self.drafter, self.governor, self.name = drafter, governor, drafter.name
        self.proposes_trees = False  # a model drafter's chains
        self.guess: int | None = None  # the bonus token the ahead tokens were drafted after
        self.ahead: list[Drawn] = []  # drafted after the guess
        self.ahead_stopped = False  # the stop rule ended the ahead block
        self.chosen = False  # this cycle drafted ahead (or tried to)
        self.idle_from = 0.0  # time.perf_counter() when drafting ahead gave way to waiting
        self.verifies = 0  # the first verify also opens the server's session: not a cycle's time

    @property
    def compute_s(self) -> float:
        return self.drafter.compute_s

    @property
    def prefill_s(self) -> float:
        return self.drafter.prefill_s

    def propose(self, seq: AcceptedSequence, k: int) -> Proposal:
        """Up to k tokens, starting from those drafted ahead when they were kept."""
        drafted, stopped = self.ahead, self.ahead_stopped
        self.ahead, self.ahead_stopped, self.guess = [], False, None
        return proposal_of(self.drafter.extend(seq, k, drafted, stopped)[:k], seq.length, self.name)

    def meanwhile(self, seq: AcceptedSequence, proposal: Proposal, in_flight: InFlight, next_n: int) -> None:
        """While the block is verified remotely: guess the bonus, then draft up to next_n tokens
        after it (the next block's size), stopping as soon as the reply is in (checked between forwards) or the next
        forward would end after the verdict's expected arrival."""
        deadline = in_flight.deadline  # None: a verify in process, nothing to overlap with
        self.chosen = next_n >= 1 and deadline is not None and (self.governor is None or self.governor.choose())
        if self.chosen and deadline is not None and self.fits(deadline):
            block = proposal.tokens.tolist()
            history = seq.generated + block
            guess, _, _ = self.drafter.step(torch.tensor(block[-1:]), history)
            self.guess = int(guess)
            history.append(self.guess)
            feed = guess.view(1)
            while (len(self.ahead) < next_n and not self.ahead_stopped and not in_flight.ready()
                   and self.fits(deadline)):
                token, dist, self.ahead_stopped = self.drafter.step(feed, history)
                self.ahead.append((token, dist))
                history.append(int(token))
                feed = token.view(1)
        self.idle_from = time.perf_counter()

    def fits(self, deadline: float) -> bool:
        """Would one more forward end by `deadline` (a time.perf_counter() value)?"""
        step_s = self.drafter.step_s
        return step_s is not None and time.perf_counter() + step_s <= deadline

    def rollback(self, seq: AcceptedSequence, proposal: Proposal, verdict: Verdict | None) -> DraftNote:
        """Keep the ahead tokens if the cloud took the whole block and its bonus is the guess; tell
        the governor how this verify went."""
        n, guess = len(proposal), self.guess
        whole = verdict is not None and verdict.accepted == n
        bonus = seq.generated[-1] if whole and seq.length == proposal.base + n + 1 else None
        if verdict is not None and self.governor is not None:
            verify_s = verdict.read_at - verdict.sent_at if self.verifies else None
            self.governor.observe(guess is not None, verify_s, self.drafter.step_s, n, verdict.accepted, guess, bonus)
        self.verifies += verdict is not None
        kept = len(self.ahead) if guess is not None and whole and bonus == guess else 0
        wasted = len(self.ahead) - kept if guess is not None else 0
        if kept:
            self.guess = None  # the ahead tokens sit past the accepted sequence: nothing to crop
        else:
            self.ahead, self.ahead_stopped, self.guess = [], False, None
            self.drafter.rollback(seq, proposal, verdict)
        wait_s = verdict.read_at - self.idle_from if verdict is not None and self.chosen else 0.0
        return DraftNote(ahead_chosen=self.chosen and verdict is not None, ahead_guess=guess, ahead_kept=kept,
                         ahead_wasted=wasted, edge_wait_s=wait_s)
