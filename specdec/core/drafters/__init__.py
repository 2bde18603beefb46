"""Drafters: what proposes the next block (see interface.py). Each file registers itself and this
package imports every module beside it, so a new drafter is one new file.

    model.py   the edge model drafts token by token on its KV cache (`--drafter model`, the default)
    ahead.py   a model drafter that also drafts the next block while a remote cloud verifies this one
    prompt_lookup.py  the longest recurring suffix of prompt + output proposes what followed it (no model)
    ngram.py   the most frequent continuations counted over an engine's prompts and outputs (no model)
    suffix.py  suffix decoding: the longest suffix's continuations in this request and in earlier outputs, kept
               apart, scored by frequency into a tree or chain (no model)
    hybrid.py  prompt lookup when it matches, the edge model otherwise while its blocks pay (core/payoff.py)
    auto.py    prompt lookup only while its blocks pay for their verify cost (core/payoff.py); plain steps
               otherwise, or where the router says on a cloud held in two runtimes (core/two_runtime.py)
"""
from __future__ import annotations

import importlib
import pkgutil

from specdec.core.drafters.interface import (
    DRAFTERS,
    DRAFTS_AHEAD,
    NEEDS_MODEL,
    OPTIONS,
    WEIGHS_RUNTIMES,
    DraftContext,
    Drafter,
    DrafterOption,
    DraftFree,
    DraftNote,
    Proposal,
    Router,
    describe_options,
    drafter_options,
    make_drafter,
    plain_step,
    register_drafter,
)

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["DRAFTERS", "DRAFTS_AHEAD", "NEEDS_MODEL", "OPTIONS", "WEIGHS_RUNTIMES", "DraftContext", "DraftFree", "DrafterOption",
           "DraftNote", "Drafter", "Proposal", "Router", "describe_options", "drafter_options", "make_drafter", "plain_step",
           "register_drafter"]
