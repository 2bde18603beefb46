"""The decoding loops: plain autoregressive (edge-only or cloud-only baselines) and speculative.

One speculative cycle (L = accepted length before it):
  draft     edge feeds its unseen accepted tokens as one block (the whole prompt in the first
            cycle), then k-1 draft tokens one by one
  gate      block uncertainty (nats) >= entropy_threshold -> escalate to the cloud
  verify    one cloud forward over [unseen accepted, d_0..d_{k-1}] -> logits [k+1, V]
  accept    policy -> `accepted` draft tokens + a correction (or the free bonus token)
  rollback  both caches cropped to L + accepted: exactly the accepted prefix they were built from
"""
from __future__ import annotations

import time
from typing import Callable

import torch

from specdec.backends.base import Backend, Prompt
from specdec.cloud import Cloud, CloudLost, Verdict, Verifier, as_cloud
from specdec.config import DecodeConfig, SpecConfig
from specdec.drafter import Drafter
from specdec.drafting import make_schedule, make_stop
from specdec.gate import should_escalate
from specdec.processors import Constraints
from specdec.sampling import choose, distribution, entropy_nats
from specdec.session import AcceptedSequence, Session
from specdec.trace import Counters, Cycle, Generation

NO_CONSTRAINTS = Constraints()


def first_stop(tokens: list[int], n_before: int, constraints: Constraints) -> int | None:
    """Index of the first token in `tokens` that ends generation, given n_before tokens so far."""
    for i, token in enumerate(tokens):
        if constraints.stop.stops(token, n_before + i + 1):
            return i
    return None


def block_size(k: int, remaining: int) -> int:
    """Draft tokens for the next block. Near the budget, leave one slot for the cloud's correction
    or bonus token (as HF's assisted generation does): drafting the token the bonus supplies
    anyway costs an edge step for nothing."""
    return max(1, min(k, remaining - 1))


def draft(
    edge: Session, seq: AcceptedSequence, n: int, vocab: int, constraints: Constraints,
    temperature: float, generator: torch.Generator, topn: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """n tokens on the edge cache -> (tokens [n], draft_probs [n, V]: what each was drawn from)."""
    return Drafter(edge, vocab, constraints, temperature, generator, topn).draft(seq, n)


@torch.inference_mode()
def autoregressive_decode(
    backend: Backend, prompt: Prompt, decode: DecodeConfig, constraints: Constraints = NO_CONSTRAINTS,
    role: str = "cloud",
) -> Generation:
    """Plain decoding on one model: the edge-only and cloud-only baselines."""
    start = time.perf_counter()
    generator = torch.Generator().manual_seed(decode.seed)
    seq = AcceptedSequence(prompt.input_ids, decode.max_new_tokens)
    session = Session(backend, prompt)
    ttft_s, stopped_by = 0.0, "max_new_tokens"
    while seq.remaining:
        logits = session.feed(session.unseen(seq), keep=1)[-1]
        logits = constraints.apply(seq.generated, logits)
        probs = distribution(logits, decode.temperature) if decode.do_sample else None
        token = int(choose(logits, probs, decode.do_sample, generator))
        seq.extend([token])
        session.rollback(session.length, seq)  # no-op, but trims sliding-window layers
        ttft_s = ttft_s or time.perf_counter() - start
        if constraints.stop.stops(token, len(seq.generated)):
            stopped_by = "stop_token"
            break
    counters = Counters(cycles=len(seq.generated))
    compute = {f"{role}_s": session.compute_s}
    return Generation(
        tokens=seq.generated, counters=counters, prompt_tokens=seq.prompt_len, prefill_s=session.prefill_s,
        ttft_s=ttft_s, decode_s=time.perf_counter() - start, stopped_by=stopped_by, **compute,
    )


@torch.inference_mode()
def speculative_decode(
    edge: Backend, cloud: Backend | Cloud, prompt: Prompt, spec: SpecConfig, decode: DecodeConfig,
    constraints: Constraints = NO_CONSTRAINTS,
    punct_density: Callable[[list[int]], float] | None = None,
    on_cloud_loss: str = "fail",
    overlap: bool = False,
) -> Generation:
    """Edge drafts, the gate escalates uncertain blocks, the cloud verifies them in one forward.
    `cloud` is a backend in this process or a remote cloud (`specdec.remote.RemoteCloud`).
    on_cloud_loss: "fail" raises CloudLost; "edge" finishes the generation edge-only (degraded).
    overlap: while a block is verified remotely, draft the next one (see `specdec.drafter`)."""
    spec.check_decoding(decode)
    start = time.perf_counter()
    generator = torch.Generator().manual_seed(decode.seed)
    cloud = as_cloud(cloud)
    vocab = min(edge.vocab_size, cloud.vocab_size)  # compare over the shared ids only
    seq = AcceptedSequence(prompt.input_ids, decode.max_new_tokens)
    edge_session = Session(edge, prompt)
    drafter = Drafter(edge_session, vocab, constraints, decode.temperature, generator, spec.draft_topn,
                      make_stop(spec.draft_stop))
    schedule = make_schedule(spec.k_schedule, spec.k)
    verifier = None  # opened on the first escalation: a block never escalated costs the cloud nothing
    counters, cycles = Counters(accepted_per_position=[0] * spec.k), []
    ttft_s, stopped_by, degraded = 0.0, "max_new_tokens", False
    round_trip_s = None  # expected send -> verdict time; no drafting ahead until one was measured

    try:
        while seq.remaining and stopped_by != "stop_token":
            base, t_start_s = seq.length, time.perf_counter() - start
            edge_before, cloud_before = edge_session.compute_s, verifier.compute_s if verifier else 0.0
            draft_tokens, draft_probs = drafter.draft(seq, block_size(schedule.k, seq.remaining))
            draft_list = draft_tokens.tolist()
            stop_at = first_stop(draft_list, len(seq.generated), constraints)
            if stop_at is not None:  # the block ends at its stop token; nothing after it is verified
                n = stop_at + 1
                draft_tokens, draft_probs, draft_list = draft_tokens[:n], draft_probs[:n], draft_list[:n]
            n = len(draft_list)
            entropies = entropy_nats(draft_probs)
            density = punct_density(draft_list) if punct_density and spec.punct_trigger is not None else None
            escalate = not degraded and should_escalate(entropies, density, spec)
            cycle = Cycle(draft_list, entropies.tolist(), escalate, accepted=n, t_start_s=t_start_s)

            if cycle.escalated:
                # Room after this block for its bonus and at least one more draft token.
                ahead = block_size(schedule.k, seq.remaining - n - 1) if overlap and stop_at is None and \
                    seq.remaining - n > 1 else 0
                try:
                    verifier = verifier or cloud.open(prompt, spec, decode, constraints, vocab, generator)
                    round_trip_s = round_trip_s or verifier.round_trip_hint_s
                    verdict = verify(verifier, drafter, seq, draft_tokens, draft_probs, ahead, cycle, start, round_trip_s)
                except CloudLost:
                    if on_cloud_loss != "edge":
                        raise
                    degraded, cycle.escalated = True, False  # keep the draft, unverified; no more calls
                    drafter.settle(False, None)
                    if verifier is not None:
                        verifier.close()
                    verifier = None
                else:
                    record_verdict(cycle, verdict)
                    if verdict.wait_s:  # the round trips so far predict the next one (EMA, alpha 0.5)
                        round_trip_s = verdict.wait_s if round_trip_s is None else 0.5 * (round_trip_s + verdict.wait_s)
                    schedule.update(n, verdict.accepted)
                    # The bonus is free only if there is room for it and the block did not end generation.
                    if verdict.accepted < n or (n < seq.remaining and stop_at is None):
                        cycle.extra_token = verdict.next_token
                        cycle.extra_kind = "correction" if verdict.accepted < n else "bonus"
                    cycle.ahead_kept, cycle.ahead_wasted = drafter.settle(
                        verdict.accepted == n, cycle.extra_token if cycle.extra_kind == "bonus" else None)

            emitted = draft_list[: cycle.accepted] + ([cycle.extra_token] if cycle.extra_kind else [])
            if first_stop(emitted, len(seq.generated), constraints) is not None:
                stopped_by = "stop_token"
            seq.extend(emitted)
            if not drafter.holds_ahead:  # kept ahead tokens sit past the accepted sequence: nothing to crop
                # The cache keeps one accepted token unseen, the next draft's first feed: after a
                # cloud loss with drafting ahead it had fed the whole block (and the guess after it).
                edge_session.rollback(min(edge_session.length, base + cycle.accepted, seq.length - 1), seq)
            if cycle.escalated:
                verifier.rollback(base + cycle.accepted, seq)
            cycle.edge_s = edge_session.compute_s - edge_before
            cycle.cloud_s = verifier.compute_s - cloud_before if cycle.escalated else 0.0
            counters.add(cycle)
            cycles.append(cycle)
            ttft_s = ttft_s or time.perf_counter() - start
    finally:
        if verifier is not None:
            verifier.close()

    return Generation(
        tokens=seq.generated, counters=counters, cycles=cycles, prompt_tokens=seq.prompt_len, prefill_s=edge_session.prefill_s,
        ttft_s=ttft_s, decode_s=time.perf_counter() - start, edge_s=edge_session.compute_s,
        cloud_s=sum(c.cloud_s for c in cycles), stopped_by=stopped_by, degraded=degraded,
        features_bytes=sum(t.numel() * t.element_size() for t in prompt.features.values()),
    )


def verify(verifier: Verifier, drafter: Drafter, seq: AcceptedSequence, draft_tokens: torch.Tensor,
           draft_probs: torch.Tensor, ahead: int, cycle: Cycle, start: float, round_trip_s: float | None) -> Verdict:
    """One verify call; with `ahead` > 0 and a round trip measured before, draft up to that many
    tokens of the next block meanwhile, within the expected round trip."""
    sent = time.perf_counter()
    cycle.t_sent_s = sent - start
    if not ahead or round_trip_s is None:
        verdict = verifier.verify(seq, draft_tokens, draft_probs)
    else:
        verifier.send(seq, draft_tokens, draft_probs)
        drafter.draft_ahead(seq, cycle.draft_tokens, ahead, verifier.ready, deadline=sent + round_trip_s)
        cycle.ahead_guess = drafter.guess
        waiting = time.perf_counter()
        verdict = verifier.receive()
        cycle.edge_wait_s = time.perf_counter() - waiting
    cycle.t_reply_s = time.perf_counter() - start
    return verdict


def record_verdict(cycle: Cycle, verdict: Verdict) -> None:
    cycle.accepted = verdict.accepted
    cycle.cloud_tokens_in, cycle.sent_features = verdict.tokens_in, verdict.sent_features
    cycle.wire_up_bytes, cycle.wire_down_bytes = verdict.wire_up_bytes, verdict.wire_down_bytes
    cycle.wait_s, cycle.server_queue_s = verdict.wait_s, verdict.server_queue_s
