"""Threshold verification (the rule of the research system this engine grew from): accept d_i while
p_cloud(d_i) >= tau, a probability; at the first miss emit a correction from the cloud's
distribution at that position (argmax when greedy, a sample when sampling). Not lossless: tau
trades acceptance for agreement."""
from __future__ import annotations

from dataclasses import dataclass

from specdec.core.policies.registry import register_policy
from specdec.core.sampling import accepted_prefix, choose


@register_policy("threshold", from_threshold=True)
@dataclass(frozen=True)
class ThresholdPolicy:
    accept_threshold: float

    def __call__(self, draft_tokens, draft_probs, cloud_logits, cloud_probs, do_sample, generator):
        cloud_prob_of_draft = cloud_probs[:-1].gather(-1, draft_tokens.unsqueeze(-1)).squeeze(-1)  # [n]
        accepted = accepted_prefix(cloud_prob_of_draft >= self.accept_threshold)
        return accepted, choose(cloud_logits[accepted], cloud_probs[accepted], do_sample, generator)
