"""How long a draft block is: a stop rule ends a block early, a k schedule sets the next block's
cap from how the last one fared. Each rule is one file; it registers itself by name here.

    rule = make_stop("entropy:2.5")      # stop(dist [V], entropy_nats) -> bool, after each token
    schedule = make_schedule("heuristic", k)   # schedule.k, then schedule.update(drafted, accepted)

Greedy verification stays lossless whatever the block length: the cloud still checks every token
it is sent, only fewer are sent.
"""
from __future__ import annotations

import importlib
import pkgutil

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

for _module in pkgutil.iter_modules(__path__):  # each rule file registers itself
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["SCHEDULES", "STOPS", "DraftStop", "KSchedule", "block_size", "make_schedule", "make_stop", "parse_stop"]
