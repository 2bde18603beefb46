"""How long a draft block is: a stop rule ends a block early, a k schedule sets the next block's
cap from how the last one fared. Each rule is one file; it registers itself by name here.

    rule = make_stop("entropy:2.5")      # stop(dist [V], entropy_nats) -> bool, after each token
    schedule = make_schedule("heuristic", k)   # schedule.k, then schedule.update(drafted, accepted)

Greedy verification stays lossless whatever the block length: the cloud still checks every token
it is sent, only fewer are sent.
"""
from __future__ import annotations

from specdec.core.block_length import constant, entropy, heuristic, pmin  # noqa: F401  (each registers itself)
from specdec.core.block_length.rules import (
    SCHEDULES,
    STOPS,
    DraftStop,
    KSchedule,
    block_size,
    make_schedule,
    make_stop,
    parse_stop,
)

__all__ = ["SCHEDULES", "STOPS", "DraftStop", "KSchedule", "block_size", "make_schedule", "make_stop", "parse_stop"]
