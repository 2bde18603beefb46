"""The decoding loops: plain autoregressive (edge-only or cloud-only baselines) and speculative.

One speculative cycle (L = accepted length before it):
  draft     the drafter proposes up to k tokens d_0..d_{n-1} after the accepted sequence (a model
            drafter feeds its unseen accepted tokens as one block, then drafts one by one)
  gate      block uncertainty (nats) >= entropy_threshold -> escalate to the cloud (a draft-free
            block has no distribution: always)
  verify    one cloud forward over [unseen accepted, d_0..d_{n-1}] -> logits [n+1, V] -> the policy's
            verdict: `accepted` draft tokens and the next token (a correction, or the free bonus)
  accept    the kept prefix and the cloud's token join the accepted sequence
  rollback  drafter and cloud drop what they built past it: each cache holds exactly the accepted
            prefix it was built from

Drafting ahead is a drafter (specdec/core/drafters/ahead.py) and a lost cloud a link
(specdec/core/cloud.py `EdgeFallbackLink`): the loop below has no branch for either.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from specdec.backends.base import Backend
from specdec.backends.prompt import Prompt
from specdec.core.block_length import block_size, make_schedule, make_stop
from specdec.core.cloud import Cloud, CloudLink, as_cloud, open_link
from specdec.core.config import DecodeConfig, SpecConfig
from specdec.core.drafters import DRAFTS_AHEAD, DraftContext, Drafter, DraftNote, Proposal, make_drafter
from specdec.core.drafters.ahead import DraftAhead
from specdec.core.drafters.model import ModelDrafter
from specdec.core.escalation import should_escalate
from specdec.core.history import History
from specdec.core.overlap import OverlapGovernor
from specdec.core.policies import policies_that, traits
from specdec.core.processors import Constraints
from specdec.core.sampling import choose, distribution, entropy_nats
from specdec.core.session import AcceptedSequence, Session
from specdec.core.trace import Counters, Cycle, Generation
from specdec.core.two_runtime import Router, TwoRuntimeCloud
from specdec.core.verdict import Verdict
from specdec.core.verifier import VERIFIERS, verifies_trees
from specdec.errors import ConfigError
from specdec.settings import OnCloudLoss, Overlap, parse_fields

NO_CONSTRAINTS = Constraints()


@dataclass(frozen=True)
class SpecOptions:
    """What a speculative generation takes beside its models (where it drafts, where the cloud is), its prompt
    (what it decodes) and its SpecConfig and DecodeConfig (how): the decoding constraints, the punctuation
    trigger's density, what a lost cloud does, drafting ahead, and what earlier requests measured."""

    constraints: Constraints = NO_CONSTRAINTS
    punct_density: Callable[[list[int]], float] | None = None  # draft ids -> density, for `spec.punct_trigger`
    on_cloud_loss: OnCloudLoss = OnCloudLoss.FAIL  # fail: raise CloudLost; edge: finish edge-only
    overlap: bool | Overlap = False  # draft ahead while a remote cloud verifies: True, False or auto (build_drafter)
    governor: OverlapGovernor | None = None  # auto's judge (a fresh one if None)
    history: History | None = None  # the engine's earlier requests' measurements (None: a fresh one)

    def __post_init__(self) -> None:
        parse_fields(self)


@torch.inference_mode()
def speculative_decode(edge: Backend | None, cloud: Backend | Cloud, prompt: Prompt, spec: SpecConfig,
                       decode: DecodeConfig, options: SpecOptions = SpecOptions()) -> Generation:
    """The drafter `spec` names proposes, the gate escalates uncertain blocks, the cloud verifies them in one
    forward. `cloud`: a backend in this process, a remote cloud (`specdec.remote.RemoteCloud`) or one held in
    two runtimes (`TwoRuntimeCloud`); `edge`: the model a model drafter runs (None for a draft-free one)."""
    constraints, history = options.constraints, options.history
    spec.check_decoding(decode)
    generator, cloud = torch.Generator().manual_seed(decode.seed), as_cloud(cloud)
    history = History() if history is None else history
    vocab = min(cloud.vocab_size, edge.vocab_size) if edge is not None else cloud.vocab_size  # shared ids only
    router = Router(history) if isinstance(cloud, TwoRuntimeCloud) else None
    context = DraftContext(prompt, vocab, constraints, decode.temperature, generator, edge, spec.draft_topn,
                           make_stop(spec.draft_stop), history=history, router=router)
    drafter = build_drafter(spec, context, options.overlap, options.governor)
    check_trees(drafter, cloud, spec, decode)
    link = open_link(cloud, (prompt, spec, decode, constraints, vocab, generator), options.on_cloud_loss)
    seq = AcceptedSequence(prompt.input_ids, decode.max_new_tokens)
    generation = run_cycles(drafter, link, seq, spec, constraints, options.punct_density)
    generation.features_bytes = sum(t.numel() * t.element_size() for t in prompt.features.values())
    return generation


def check_trees(drafter: Drafter, cloud: Cloud, spec: SpecConfig, decode: DecodeConfig) -> None:
    """A drafter that proposes token trees needs a cloud that verifies them, greedily, with a cache: or one line."""
    if not drafter.proposes_trees:
        return
    if not cloud.accepts_trees:
        raise ConfigError(f"drafter {spec.drafter!r} proposes token trees (branches > 1), which this cloud verifies "
                          "only as chains (the kernels runtimes and torch on a Llama/Qwen decoder verify trees, in "
                          "this process or behind a server; a server's static cache does not): use branches=1")
    if not traits(spec.policy).argmax or decode.do_sample or not verifies_trees(spec.verifier):
        argmax, verifiers = policies_that("argmax"), [name for name in VERIFIERS if verifies_trees(name)]
        raise ConfigError(f"token trees are verified greedily on a cached verifier: use --policy {' or '.join(argmax)}, "
                          f"temperature 0 and --verifier {' or '.join(verifiers)}, or branches=1")


def build_drafter(spec: SpecConfig, context: DraftContext, overlap: bool | Overlap = False,
                  governor: OverlapGovernor | None = None) -> Drafter:
    """The drafter `spec` names with its options, for one generation. overlap True: it drafts ahead while a
    remote cloud verifies (refused for one that cannot); "auto": it does where it can and `governor` (a
    fresh one if None) finds that it pays; False: sequential."""
    drafter = make_drafter(spec.drafter, context, spec.drafter_options)
    if not overlap:
        return drafter
    if spec.drafter not in DRAFTS_AHEAD:
        if overlap is True:
            raise ConfigError(f"drafter {spec.drafter!r} cannot draft ahead (only {', '.join(sorted(DRAFTS_AHEAD))} "
                              "can): use --overlap auto or false")
        return drafter
    assert isinstance(drafter, ModelDrafter)  # the one drafter registered as drafting ahead (DRAFTS_AHEAD)
    return DraftAhead(drafter, (governor or OverlapGovernor(spec.k)) if overlap == Overlap.AUTO else None)


def run_cycles(drafter: Drafter, link: CloudLink, seq: AcceptedSequence, spec: SpecConfig, constraints: Constraints,
               punct_density=None) -> Generation:
    """The cycles until the budget or a stop token: draft, gate, verify, accept, rollback."""
    start, schedule, cycles, stopped, ttft_s = time.perf_counter(), make_schedule(spec.k_schedule, spec.k), [], False, 0.0
    try:
        while seq.remaining and not stopped:
            t_start_s, edge_before, cloud_before = time.perf_counter() - start, drafter.compute_s, link.compute_s
            block, at_stop = draft(drafter, seq, block_size(schedule.k, seq.remaining), constraints)
            entropies = None if block.probs is None else entropy_nats(block.probs)
            density = punct_density(block.tokens.tolist()) if punct_density and spec.punct_trigger is not None else None
            escalate = should_escalate(entropies, density, spec)
            room = 0 if at_stop else seq.remaining - block.depth - 1  # after this block and the cloud's token
            verdict = verify(link, drafter, seq, block, block_size(schedule.k, room) if room >= 1 else 0) if escalate else None
            emitted = accept(block, verdict, bonus_room=not at_stop and block.depth < seq.remaining)
            stopped = first_stop(emitted, len(seq.generated), constraints) is not None
            seq.extend(emitted)
            note = drafter.rollback(seq, block, verdict)
            if verdict is not None:
                link.rollback(block.base + verdict.accepted, seq)
                schedule.update(block.depth, verdict.accepted)
            times = CycleTimes(start, t_start_s, drafter.compute_s - edge_before, link.compute_s - cloud_before)
            cycles.append(trace(block, entropies, verdict, emitted, note, times))
            ttft_s = ttft_s or time.perf_counter() - start
    finally:
        link.close()
    return Generation(
        tokens=seq.generated, counters=Counters.of(cycles, spec.k), cycles=cycles, prompt_tokens=seq.prompt_len,
        prefill_s=drafter.prefill_s, ttft_s=ttft_s, decode_s=time.perf_counter() - start,
        edge_s=drafter.compute_s, cloud_s=sum(c.cloud_s for c in cycles), stopped_by="stop_token" if stopped else
        "max_new_tokens", degraded=link.lost,
    )


def draft(drafter: Drafter, seq: AcceptedSequence, k: int, constraints: Constraints) -> tuple[Proposal, bool]:
    """The drafter's block, cut after a token that ends the generation -> (block, ends at a stop token). A tree
    holding such a token is verified as its first branch, cut the same way."""
    proposal = drafter.propose(seq, k)
    if proposal.tree is not None:
        tree, n_before = proposal.tree, len(seq.generated)
        if not any(constraints.stop.stops(token, n_before + depth)
                   for token, depth in zip(proposal.tokens.tolist(), tree.depths)):
            return proposal, False
        proposal = proposal.first_branch()
    stop_at = first_stop(proposal.tokens.tolist(), len(seq.generated), constraints)
    return (proposal, False) if stop_at is None else (proposal.cut(stop_at + 1), True)


def verify(link: CloudLink, drafter: Drafter, seq: AcceptedSequence, block: Proposal, next_n: int) -> Verdict | None:
    """The cloud's verdict on `block` (None: not verified, the cloud is lost). While it is in flight
    the drafter may draft up to next_n tokens of the next block."""
    in_flight = link.send(seq, block.tokens, block.probs, block.route, block.tree)
    drafter.meanwhile(seq, block, in_flight, next_n)
    return in_flight.verdict()


def accept(block: Proposal, verdict: Verdict | None, bonus_room: bool) -> list[int]:
    """The cycle's new tokens: the kept draft prefix, then the cloud's token: its correction, or the
    bonus after a fully accepted block when there is room for it and the block did not end generation.
    An unverified block is kept whole (a tree: its first branch)."""
    if verdict is None:
        return block.first_branch().tokens.tolist()
    return block.kept(verdict) + ([verdict.next_token] if block.corrected(verdict) or bonus_room else [])


def first_stop(tokens: list[int], n_before: int, constraints: Constraints) -> int | None:
    """Index of the first token in `tokens` that ends generation, given n_before tokens so far."""
    for i, token in enumerate(tokens):
        if constraints.stop.stops(token, n_before + i + 1):
            return i
    return None


@dataclass(frozen=True)
class CycleTimes:
    """A cycle's times for its record: the generation's start (time.perf_counter()), the cycle's start after it,
    and the seconds the edge and the cloud computed in the cycle."""

    start: float
    t_start_s: float
    edge_s: float
    cloud_s: float


def trace(block: Proposal, entropies: torch.Tensor | None, verdict: Verdict | None, emitted: list[int],
          note: DraftNote, times: CycleTimes) -> Cycle:
    """One cycle's record (specdec/core/trace.py)."""
    kept = len(block.first_branch()) if verdict is None else verdict.accepted
    extra = emitted[kept] if len(emitted) > kept else None
    corrected = verdict is not None and block.corrected(verdict)
    cycle = Cycle(block.tokens.tolist(), [] if entropies is None else entropies.tolist(), verdict is not None, kept,
                  extra_token=extra, extra_kind=None if extra is None else "correction" if corrected else "bonus",
                  edge_s=times.edge_s, t_start_s=times.t_start_s, drafter=block.drafter,
                  ahead_chosen=note.ahead_chosen, ahead_guess=note.ahead_guess, ahead_kept=note.ahead_kept,
                  ahead_wasted=note.ahead_wasted, edge_wait_s=note.edge_wait_s)
    if verdict is not None:
        cycle.cloud_s, cycle.cloud_tokens_in = times.cloud_s, verdict.tokens_in
        cycle.sent_features = verdict.sent_features
        cycle.wire_up_bytes, cycle.wire_down_bytes = verdict.wire_up_bytes, verdict.wire_down_bytes
        cycle.wait_s, cycle.server_queue_s = verdict.wait_s, verdict.server_queue_s
        cycle.t_sent_s, cycle.t_reply_s = verdict.sent_at - times.start, verdict.read_at - times.start
    return cycle


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
        logits = session.feed(session.unseen(seq), keep=1)[-1]  # [V], on the model's device
        logits = constraints.apply(seq.generated, logits)
        if decode.do_sample:  # drawn with the host generator: one seed, one stream, on any device
            logits = logits.cpu()
        probs = distribution(logits, decode.temperature) if decode.do_sample else None
        token = int(choose(logits, probs, decode.do_sample, generator))  # the step's one host read
        seq.extend([token])
        session.rollback(session.length, seq)  # no-op, but trims sliding-window layers
        ttft_s = ttft_s or time.perf_counter() - start
        if constraints.stop.stops(token, len(seq.generated)):
            stopped_by = "stop_token"
            break
    counters = Counters(cycles=len(seq.generated))
    return Generation(
        tokens=seq.generated, counters=counters, prompt_tokens=seq.prompt_len, prefill_s=session.prefill_s,
        ttft_s=ttft_s, decode_s=time.perf_counter() - start, stopped_by=stopped_by,
        edge_s=session.compute_s if role == "edge" else 0.0, cloud_s=session.compute_s if role == "cloud" else 0.0,
    )
