"""Drafters: what proposes the next block (see interface.py). Each file registers itself and this
package imports every module beside it, so a new drafter is one new file.

    model.py   the edge model drafts token by token on its KV cache (`--drafter model`, the default)
    ahead.py   a model drafter that also drafts the next block while a remote cloud verifies this one
    prompt_lookup.py  the longest recurring suffix of prompt + output proposes what followed it (no model)
    ngram.py   the most frequent continuations counted over an engine's prompts and outputs (no model)
    hybrid.py  prompt lookup when it matches, the edge model otherwise while its blocks pay
    auto.py    prompt lookup only while its blocks pay for their verify cost; plain steps otherwise
"""
from __future__ import annotations

import importlib
import pkgutil

from specdec.core.drafters.interface import (
    DRAFTERS, NEEDS_MODEL, WEIGHS_RUNTIMES, DraftContext, DraftFree, DraftNote, Drafter, Proposal, make_drafter, register_drafter,
)

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["DRAFTERS", "NEEDS_MODEL", "WEIGHS_RUNTIMES", "DraftContext", "DraftFree", "DraftNote", "Drafter", "Proposal", "make_drafter", "register_drafter"]
