"""What a generation returns: tokens, a per-cycle trace and counters.

Counters follow vLLM's spec-decode metrics so numbers compare across tools:
num_drafts = verified blocks, num_draft_tokens = tokens verified, num_accepted_tokens = verified
tokens accepted, accepted_per_position[i] = verified blocks whose position i was accepted.
Acceptance rate = accepted / verified tokens (unverified tokens are not in it).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields


@dataclass(slots=True)  # slots: setting a field that does not exist is an error, not a silent new attribute
class Cycle:
    draft_tokens: list[int]
    entropies_nats: list[float]
    escalated: bool
    accepted: int  # draft tokens kept (all of them when not escalated)
    extra_token: int | None = None  # correction or bonus
    extra_kind: str | None = None  # "correction" | "bonus" | None
    edge_s: float = 0.0
    cloud_s: float = 0.0
    cloud_tokens_in: int = 0  # unseen accepted tokens + draft tokens sent up
    sent_features: bool = False  # the prompt's multimodal features went up with this call
    # Split deployment only (0 in process): what crossed the link and how long the edge waited.
    wire_up_bytes: int = 0
    wire_down_bytes: int = 0
    wait_s: float = 0.0  # send -> the verdict's last byte on the edge's socket: in flight + server queue + compute
    server_queue_s: float = 0.0
    t_start_s: float = 0.0  # since the generation started: drafting began / the block left / the verdict was in
    t_sent_s: float = 0.0
    t_reply_s: float = 0.0
    edge_wait_s: float = 0.0  # overlap: the edge idle after drafting ahead, waiting for the verdict
    ahead_chosen: bool = False  # overlap: this verify's way, draft ahead (true) or wait (on, or auto's rule)
    ahead_guess: int | None = None  # overlap: the bonus token the edge guessed and drafted after
    ahead_kept: int = 0  # overlap: tokens drafted ahead during this verify that became the next block's
    ahead_wasted: int = 0  # ... and those dropped (a rejection, or a bonus other than the guess)
    drafter: str = "model"  # what proposed the block (a registered drafter's name; a hybrid names its part)


@dataclass
class Counters:
    cycles: int = 0
    cloud_calls: int = 0
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    unverified_tokens: int = 0
    corrections: int = 0
    bonus_tokens: int = 0
    overlap_kept_tokens: int = 0
    overlap_wasted_tokens: int = 0

    @property
    def acceptance_rate(self) -> float | None:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else None

    @classmethod
    def of(cls, cycles: list[Cycle], k: int) -> Counters:
        counters = cls(accepted_per_position=[0] * k)
        for cycle in cycles:
            counters.add(cycle)
        return counters

    def add(self, cycle: Cycle) -> None:
        self.cycles += 1
        if cycle.escalated:
            self.cloud_calls += 1
            self.num_drafts += 1
            self.num_draft_tokens += len(cycle.draft_tokens)
            self.num_accepted_tokens += cycle.accepted
            for i in range(cycle.accepted):
                self.accepted_per_position[i] += 1
        else:
            self.unverified_tokens += cycle.accepted
        self.overlap_kept_tokens += cycle.ahead_kept
        self.overlap_wasted_tokens += cycle.ahead_wasted
        self.corrections += cycle.extra_kind == "correction"
        self.bonus_tokens += cycle.extra_kind == "bonus"

    def as_dict(self) -> dict:
        return {**asdict(self), "acceptance_rate": self.acceptance_rate}


@dataclass
class Generation:
    tokens: list[int]  # new token ids, prompt excluded
    counters: Counters
    cycles: list[Cycle] = field(default_factory=list)
    text: str = ""
    prompt_tokens: int = 0
    prompt_ids: list[int] = field(default_factory=list)  # as encoded (set by the engine): what a replay re-sends
    prefill_s: float = 0.0  # first forward of the edge (or the mode's model): prompt + first step
    ttft_s: float = 0.0  # start -> first emitted token
    decode_s: float = 0.0  # start -> last token
    edge_s: float = 0.0  # edge compute inside forwards, prefill included
    cloud_s: float = 0.0  # cloud compute inside forwards, its prefill included
    stopped_by: str = "max_new_tokens"  # or "stop_token"
    features_bytes: int = 0  # size of the prompt's multimodal features (what a first cloud call uploads)
    degraded: bool = False  # the cloud was lost mid-generation and the rest was drafted edge-only
    turns: int = 1  # a conversation's turns answered in it (each after the model's own earlier answers)

    def then(self, later: Generation) -> Generation:
        """This generation followed by a later turn of the same conversation, as one: Spec-Bench times a
        multi-turn question over all its turns. Tokens, cycles and times add up; the text joins the answers."""
        counters = Counters(**{f.name: getattr(self.counters, f.name) + getattr(later.counters, f.name)
                               for f in fields(Counters) if f.name != "accepted_per_position"})
        first, second = self.counters.accepted_per_position, later.counters.accepted_per_position
        counters.accepted_per_position = [a + b for a, b in zip(first, second)] if first and second else first or second
        return Generation(
            tokens=self.tokens + later.tokens, counters=counters, cycles=self.cycles + later.cycles,
            text=f"{self.text}\n\n{later.text}", prompt_tokens=self.prompt_tokens + later.prompt_tokens,
            prompt_ids=self.prompt_ids, prefill_s=self.prefill_s + later.prefill_s, ttft_s=self.ttft_s,
            decode_s=self.decode_s + later.decode_s, edge_s=self.edge_s + later.edge_s, cloud_s=self.cloud_s + later.cloud_s,
            stopped_by=later.stopped_by, features_bytes=self.features_bytes, degraded=self.degraded or later.degraded,
            turns=self.turns + later.turns,
        )

    @property
    def link_s(self) -> float:
        """Seconds the edge waited on the link itself (split deployment): waits minus server time."""
        return sum(c.wait_s - c.cloud_s - c.server_queue_s for c in self.cycles if c.wait_s)

    @property
    def new_tokens(self) -> int:
        return len(self.tokens)
