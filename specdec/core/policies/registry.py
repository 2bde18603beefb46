"""The policy registry: each policy file files itself under its `--policy` name, so the set of
names (the CLI's choices, `SpecConfig`'s validation) is whatever files exist."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

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


@dataclass(frozen=True)
class PolicyTraits:
    """What a policy declares when it registers, for the callers that must know it without its name."""

    needs_probs: bool = True  # reads the cloud's probabilities under greedy decoding (False: the logits alone)
    samples: bool = False  # speculative sampling: reads the draft's distribution, needs temperature > 0, and its
    # verdicts are drawn (a replay cannot check them)
    lossless: bool = False  # its text is the verifier's own greedy text (or, sampling, a draw from its distribution)
    argmax: bool = False  # accepts a draft token iff it is the cloud's argmax: the rule token trees are verified by


_TRAITS: dict[str, PolicyTraits] = {}


def register_policy(name: str, *, from_threshold: bool = False, needs_probs: bool = True, samples: bool = False,
                    lossless: bool = False, argmax: bool = False) -> Callable:
    """Decorator: file a policy under `name` with its traits (PolicyTraits). A plain policy is used as it is; with
    `from_threshold` the decorated callable builds it from the accept threshold (`ThresholdPolicy(accept_threshold)`).
    `needs_probs=False`: under greedy decoding it reads the cloud's logits alone and is given cloud_probs None (no
    softmax over the vocabulary per verify)."""

    def register(policy):
        if name in POLICIES:
            raise ValueError(f"two policies are registered as {name!r}: rename one")
        POLICIES[name] = policy if from_threshold else (lambda accept_threshold: policy)
        _TRAITS[name] = PolicyTraits(needs_probs, samples, lossless, argmax)
        return policy

    return register


def traits(name: str) -> PolicyTraits:
    """What the policy `name` declared when it registered."""
    return _TRAITS[name]


def needs_probs(name: str) -> bool:
    """Whether the policy `name` reads the cloud's probabilities under greedy decoding (its registration says)."""
    return traits(name).needs_probs


def policies_that(trait: str) -> tuple[str, ...]:
    """The registered policies that declare `trait` (a PolicyTraits field), for messages and reports."""
    return tuple(name for name, declared in _TRAITS.items() if getattr(declared, trait))


def make_policy(name: str, accept_threshold: float) -> Policy:
    return POLICIES[name](accept_threshold)
