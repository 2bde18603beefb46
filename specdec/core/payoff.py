"""Whether a block pays for its verify: a frozen evidence record and a pure rule, read by `auto` (prompt
lookup's blocks), the hybrid (the edge model's) and the two-runtime router's switches.

A block of n draft tokens is one verify forward over n + 1 tokens (the last accepted one and the draft)
that yields τ = accepted + 1 tokens; a plain step is one forward over 1 token that yields 1. Greedy
output is the cloud's either way, so the choice can change every cycle. With d the seconds the block took
to propose (0 for a draft-free one), in plain steps per emitted token:

    c = (t_block(n + 1) + d) / (τ̂ · t_plain(1))
    send the block  <=>  c < 1  and  (1 − c) · t_plain(1) · N  >  F

N: the tokens the request will still decode; F: the seconds a cache must first be fed (the edge's, for a
model block after lookup blocks or plain steps: on a request's first cycle, the whole prompt). For a
draft-free block (d = F = 0) this is τ̂ > t_block(n + 1) / t_plain(1).

t_block, t_plain: a verify forward's mean seconds, blocks and plain steps apart, kept across an engine's
requests (specdec/core/history.py): the machine's cost curve. On 2026-11-25, 2 threads, a 5-token block
cost 1.07 token steps in torch's dynamic int8 and 2.9 in llama.cpp Q4_K_M, so the same acceptance pays in one
runtime and not the other. Until both are measured the ratio is the machine's calibrated block cost in
steps where the engine was told it (Engine.assume_block_costs: the sweep passes its calibration's curve
for the cloud's runtime), else 1. τ̂: the running mean (EMA, alpha 0.5) of tokens per verify of such
blocks, starting from the mean over the engine's earlier requests (2.0 before any).

The edge model's blocks (the hybrid) on 2026-11-25 (2 threads, the 1.5B verified in int8): without this
rule the hybrid ran at 0.53–0.98× plain llama.cpp where lookup alone ran at 0.77–2.27×: the 0.5B's block
cost more per token than an int8 step on MT-bench, and on a 900-token article its prefill took ~3 s of a
~12-s request.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class BlockEvidence:
    """What the rule reads (None: not measured yet)."""

    tau_hat: float  # τ̂: tokens a verify of such a block is expected to yield (accepted + 1)
    block_s: float | None  # t_block(n + 1): a verify forward over the block and the last accepted token
    step_s: float | None  # t_plain(1): a plain step of the cloud
    prior_steps: float = 1.0  # t_block(n + 1) / t_plain(1) assumed until both are measured
    draft_s: float = 0.0  # d: proposing the block (a model's forwards; needs step_s)
    feed_s: float = 0.0  # F: feeding a cache what it has not seen before the block (needs step_s)
    tokens_left: float = math.inf  # N: tokens the request will still decode


def measured_step_s(e: BlockEvidence) -> float:
    """t_plain(1) where a drafting or feeding cost is weighed: those need a measured step (BlockEvidence), as their
    callers ensure (hybrid.py's rule returns before it builds evidence without one; auto.py's has neither cost)."""
    assert e.step_s is not None, "draft_s and feed_s are weighed against a measured plain step (step_s)"
    return e.step_s


def block_steps(e: BlockEvidence) -> float:
    """t_block(n + 1) / t_plain(1): measured once both are, else assumed."""
    return e.block_s / e.step_s if e.block_s and e.step_s else e.prior_steps


def steps_per_token(e: BlockEvidence) -> float:
    """c: plain steps each token through the block costs, its proposal included."""
    draft_steps = e.draft_s / measured_step_s(e) if e.draft_s else 0.0
    return (block_steps(e) + draft_steps) / e.tau_hat


def feed_pays(saved_s_per_token: float, tokens_left: float, feed_s: float) -> bool:
    """Seconds saved on each token left, over the tokens left, beat a feed of `feed_s` seconds."""
    return saved_s_per_token * tokens_left > feed_s


def block_pays(e: BlockEvidence) -> bool:
    """Send the block: it costs less than a plain step per token, and what it saves pays for any feed."""
    saved_steps = 1.0 - steps_per_token(e)
    return saved_steps > 0 and (not e.feed_s or feed_pays(saved_steps * measured_step_s(e), e.tokens_left, e.feed_s))


def steps_at(known: Mapping[int, float], rows: int) -> float:
    """A verify block's cost over `rows` tokens fed, in plain steps, from the sizes `known` (rows -> steps; 1 row is
    1 step): the known value, else the line between the nearest known sizes around it, else past the largest the
    line from 1 row through it (a block never costs less than a step)."""
    points = {1: 1.0, **known}
    if rows in points:
        return points[rows]
    low = max(size for size in points if size < rows)
    high = min((size for size in points if size > rows), default=None)
    if high is None:  # past the largest known size: the line from 1 row through it
        low, high = 1, low
    if high == low:  # nothing known but a step
        return 1.0
    slope = (points[high] - points[low]) / (high - low)
    return max(1.0, points[low] + slope * (rows - low))


def best_prefix(scores: Sequence[float], calibration: float, steps: Callable[[int], float]) -> int:
    """How many of a drafter's best-first nodes to send, 0 meaning none (a plain step): the n that maximises the
    tokens a verify is expected to yield, 1 + calibration · Σ_{i<n} scores_i (a node's score: the chance it is kept),
    per plain step a block of n + 1 rows costs (`steps`); a plain step yields 1 token a step, so n = 0 unless a block
    beats it."""
    best, best_rate, tokens = 0, 1.0, 1.0
    for n, score in enumerate(scores, 1):
        tokens += calibration * score
        rate = tokens / steps(n + 1)
        if rate > best_rate:
            best, best_rate = n, rate
    return best
