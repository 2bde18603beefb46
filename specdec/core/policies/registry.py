"""The policy registry: each policy file files itself under its `--policy` name, so the set of
names (the CLI's choices, `SpecConfig`'s validation) is whatever files exist."""
from __future__ import annotations

from collections.abc import Callable

import torch

Policy = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, bool, torch.Generator], tuple[int, torch.Tensor]
]
PolicyFactory = Callable[[float], Policy]  # accept_threshold -> the policy one generation uses

POLICIES: dict[str, PolicyFactory] = {}


def register_policy(name: str, *, from_threshold: bool = False) -> Callable:
    """Decorator: file a policy under `name`. A plain policy is used as it is; with
    `from_threshold` the decorated callable builds it from the accept threshold
    (`ThresholdPolicy(accept_threshold)`)."""

    def register(policy):
        if name in POLICIES:
            raise ValueError(f"two policies are registered as {name!r}: rename one")
        POLICIES[name] = policy if from_threshold else (lambda accept_threshold: policy)
        return policy

    return register


def make_policy(name: str, accept_threshold: float) -> Policy:
    return POLICIES[name](accept_threshold)
