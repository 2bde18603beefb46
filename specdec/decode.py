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
from specdec.cloud import Cloud, CloudLink, Verdict, as_cloud
from specdec.config import DecodeConfig, SpecConfig
from specdec.drafter import Drafter, block_size
from specdec.drafting import make_schedule, make_stop
from specdec.gate import should_escalate
from specdec.overlap import OverlapGovernor
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
    overlap: bool | str = False,
    governor: OverlapGovernor | None = None,
) -> Generation:
    """Edge drafts, the gate escalates uncertain blocks, the cloud verifies them in one forward.
    `cloud` is a backend in this process or a remote cloud (`specdec.remote.RemoteCloud`).
    on_cloud_loss: "fail" raises CloudLost; "edge" finishes the generation edge-only (degraded,
    see `specdec.cloud.CloudLink`). overlap: while a block is verified remotely, draft the next one
    (see `specdec.drafter`); "auto": only while `governor` (specdec/overlap.py; a fresh one if None)
    finds that it pays."""
    spec.check_decoding(decode)
    start = time.perf_counter()
    generator = torch.Generator().manual_seed(decode.seed)
    cloud = as_cloud(cloud)
    vocab = min(edge.vocab_size, cloud.vocab_size)  # compare over the shared ids only
    seq = AcceptedSequence(prompt.input_ids, decode.max_new_tokens)
    edge_session = Session(edge, prompt)
    if overlap == "auto":
        governor = governor or OverlapGovernor(spec.k)
    drafter = Drafter(edge_session, vocab, constraints, decode.temperature, generator, spec.draft_topn,
                      make_stop(spec.draft_stop), bool(overlap), governor if overlap == "auto" else None)
    timed = False  # the generation's first verify also opens the server's session: not a cycle's time
    link = CloudLink(cloud, (prompt, spec, decode, constraints, vocab, generator), on_cloud_loss)
    schedule = make_schedule(spec.k_schedule, spec.k)
    counters, cycles = Counters(accepted_per_position=[0] * spec.k), []
    ttft_s, stopped_by = 0.0, "max_new_tokens"

    try:
        while seq.remaining and stopped_by != "stop_token":
            base, t_start_s = seq.length, time.perf_counter() - start
            edge_before, cloud_before = edge_session.compute_s, link.compute_s
            # draft
            draft_tokens, draft_probs = drafter.draft(seq, block_size(schedule.k, seq.remaining))
            draft_list = draft_tokens.tolist()
            stop_at = first_stop(draft_list, len(seq.generated), constraints)
            if stop_at is not None:  # the block ends at its stop token; nothing after it is verified
                n = stop_at + 1
                draft_tokens, draft_probs, draft_list = draft_tokens[:n], draft_probs[:n], draft_list[:n]
            n = len(draft_list)
            # gate
            entropies = entropy_nats(draft_probs)
            density = punct_density(draft_list) if punct_density and spec.punct_trigger is not None else None
            escalate = not link.lost and should_escalate(entropies, density, spec)
            cycle = Cycle(draft_list, entropies.tolist(), escalate, accepted=n, t_start_s=t_start_s)

            # verify
            if cycle.escalated:
                room = seq.remaining - n - 1 if stop_at is None else 0  # after this block and its bonus
                verdict = link.verify(lambda session: drafter.verify(session, seq, draft_tokens, draft_probs,
                                                                     schedule.k, room))
                if drafter.sent_at is not None:
                    cycle.t_sent_s = drafter.sent_at - start
                if verdict is None:  # the cloud is lost: keep the draft, unverified (edge-only from now on)
                    cycle.escalated = False
                    cycle.ahead_guess = drafter.guess  # what was drafted ahead is dropped with the verdict
                    cycle.ahead_kept, cycle.ahead_wasted = drafter.settle(False, None)
                else:
                    cycle.t_reply_s = time.perf_counter() - start
                    cycle.ahead_guess, cycle.edge_wait_s = drafter.guess, drafter.wait_s
                    cycle.ahead_chosen = drafter.ahead_chosen
                    record_verdict(cycle, verdict)
                    schedule.update(n, verdict.accepted)
                    # The bonus is free only if there is room for it and the block did not end generation.
                    if verdict.accepted < n or (n < seq.remaining and stop_at is None):
                        cycle.extra_token = verdict.next_token
                        cycle.extra_kind = "correction" if verdict.accepted < n else "bonus"
                    bonus = cycle.extra_token if cycle.extra_kind == "bonus" else None
                    if drafter.governor is not None:
                        drafter.governor.observe(drafter.guess is not None, drafter.verify_s if timed else None,
                                                 drafter.step_s, n, verdict.accepted, drafter.guess, bonus)
                    timed = True
                    cycle.ahead_kept, cycle.ahead_wasted = drafter.settle(verdict.accepted == n, bonus)

            # accept
            emitted = draft_list[: cycle.accepted] + ([cycle.extra_token] if cycle.extra_kind else [])
            if first_stop(emitted, len(seq.generated), constraints) is not None:
                stopped_by = "stop_token"
            seq.extend(emitted)
            # rollback
            if not drafter.holds_ahead:  # kept ahead tokens sit past the accepted sequence: nothing to crop
                # The cache keeps one accepted token unseen, the next draft's first feed: after a
                # cloud loss with drafting ahead it had fed the whole block (and the guess after it).
                edge_session.rollback(min(edge_session.length, base + cycle.accepted, seq.length - 1), seq)
            if cycle.escalated:
                link.rollback(base + cycle.accepted, seq)
            cycle.edge_s = edge_session.compute_s - edge_before
            cycle.cloud_s = link.compute_s - cloud_before if cycle.escalated else 0.0
            counters.add(cycle)
            cycles.append(cycle)
            ttft_s = ttft_s or time.perf_counter() - start
    finally:
        link.close()

    return Generation(
        tokens=seq.generated, counters=counters, cycles=cycles, prompt_tokens=seq.prompt_len, prefill_s=edge_session.prefill_s,
        ttft_s=ttft_s, decode_s=time.perf_counter() - start, edge_s=edge_session.compute_s,
        cloud_s=sum(c.cloud_s for c in cycles), stopped_by=stopped_by, degraded=link.lost,
        features_bytes=sum(t.numel() * t.element_size() for t in prompt.features.values()),
    )


def record_verdict(cycle: Cycle, verdict: Verdict) -> None:
    cycle.accepted = verdict.accepted
    cycle.cloud_tokens_in, cycle.sent_features = verdict.tokens_in, verdict.sent_features
    cycle.wire_up_bytes, cycle.wire_down_bytes = verdict.wire_up_bytes, verdict.wire_down_bytes
    cycle.wait_s, cycle.server_queue_s = verdict.wait_s, verdict.server_queue_s
