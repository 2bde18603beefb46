"""Acceptance policies: given a draft block and the cloud's view of it, how many draft tokens
survive and which token comes next (a correction, or the free bonus token on full acceptance).

Every policy is one callable:

    accepted, next_token = policy(draft_tokens, draft_probs, cloud_logits, cloud_probs, do_sample, generator)

    draft_tokens [n]        the edge's block d_0..d_{n-1}
    draft_probs  [n, V]     the edge distribution each d_i was drawn from (None: a draft-free proposal)
    cloud_logits [n+1, V]   processed cloud logits; row i predicts d_i, row n is the bonus position
    cloud_probs  [n+1, V]   their distribution (temperature applied once)
    -> accepted: int in [0, n]; next_token: 0-d int64 tensor from row `accepted`

A policy file registers itself (`@register_policy("name")`, specdec/core/policies/registry.py) and this
package imports every module beside it, so a new policy is one new file.
"""
from __future__ import annotations

import importlib
import pkgutil

from specdec.core.policies.registry import (
    POLICIES,
    Policy,
    PolicyTraits,
    make_policy,
    needs_probs,
    policies_that,
    register_policy,
    traits,
)

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["POLICIES", "Policy", "PolicyTraits", "make_policy", "needs_probs", "policies_that", "register_policy", "traits"]
