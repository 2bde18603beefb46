"""The policy registry: each policy file files itself under its `--policy` name, so the set of
names (the CLI's choices, `SpecConfig`'s validation) is whatever files exist."""
from __future__ import annotations

from collections.abc import Callable

import torch

# (draft_tokens, draft_probs, cloud_logits, cloud_probs, do_sample, generator) -> (accepted, next_token), as the
# package's docstring says. draft_probs None: a draft-free proposal; cloud_probs None: a policy that reads the logits
# alone (registered with `needs_probs=False`, greedy) under greedy decoding, which skips the softmax.
Policy = Callable[
    [torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor | None, bool, torch.Generator],
    tuple[int, torch.Tensor],
]
PolicyFactory = Callable[[float], Policy]  # accept_threshold -> the policy one generation uses

POLICIES: dict[str, PolicyFactory] = {}
_LOGITS_ONLY: set[str] = set()  # policies registered with needs_probs=False


def register_policy(name: str, *, from_threshold: bool = False, needs_probs: bool = True) -> Callable:
    """Decorator: file a policy under `name`. A plain policy is used as it is; with
    `from_threshold` the decorated callable builds it from the accept threshold
    (`ThresholdPolicy(accept_threshold)`). `needs_probs=False`: under greedy decoding it reads the cloud's logits
    alone and is given cloud_probs None (no softmax over the vocabulary per verify)."""

    def register(policy):
        if name in POLICIES:
            raise ValueError(f"two policies are registered as {name!r}: rename one")
        POLICIES[name] = policy if from_threshold else (lambda accept_threshold: policy)
        if not needs_probs:
            _LOGITS_ONLY.add(name)
        return policy

    return register


def needs_probs(name: str) -> bool:
    """Whether the policy `name` reads the cloud's probabilities under greedy decoding (its registration says)."""
    return name not in _LOGITS_ONLY


def make_policy(name: str, accept_threshold: float) -> Policy:
    return POLICIES[name](accept_threshold)
