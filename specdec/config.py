"""Frozen, self-validating configs. Errors name the setting, the value and the fix."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from specdec.drafting import make_schedule, parse_stop
from specdec.errors import ConfigError

POLICIES = ("threshold", "greedy", "sample")
VERIFIERS = ("cached", "stateless")
UNCERTAINTY = ("max", "mean", "first")
MODES = ("edge", "cloud", "spec")


@dataclass(frozen=True)
class DecodeConfig:
    max_new_tokens: int = field(default=64, metadata={"help": "tokens to generate at most"})
    temperature: float = field(default=0.0, metadata={"help": "0 = greedy; > 0 = sampling at this temperature"})
    seed: int = field(default=0, metadata={"help": "seed of the sampling generator"})

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if not (self.temperature >= 0 and math.isfinite(self.temperature)):
            raise ConfigError(f"temperature must be a finite number >= 0 (0 = greedy), got {self.temperature}")

    @property
    def do_sample(self) -> bool:
        return self.temperature > 0


@dataclass(frozen=True)
class SpecConfig:
    k: int = field(default=4, metadata={"help": "draft tokens per block"})
    entropy_threshold: float = field(
        default=2.0, metadata={"help": "escalate a block iff its uncertainty (nats) >= this; 0 = always, inf = never"}
    )
    accept_threshold: float = field(
        default=0.1, metadata={"help": "threshold policy: accept d_i while p_cloud(d_i) >= this (a probability)"}
    )
    policy: str = field(default="threshold", metadata={"help": f"acceptance rule, one of {POLICIES}"})
    verifier: str = field(default="cached", metadata={"help": f"cloud state handling, one of {VERIFIERS}"})
    uncertainty: str = field(default="max", metadata={"help": f"block uncertainty from token entropies: {UNCERTAINTY}"})
    punct_trigger: float | None = field(
        default=None, metadata={"help": "force escalation when the block's punctuation density exceeds this (seed 003: 0.4)"}
    )

    draft_topn: int | None = field(
        default=None, metadata={"help": "sample policy: draft from the top-N of the edge distribution (renormalized), "
                                        "so a remote verify uploads N probabilities per token instead of the vocabulary"}
    )

    draft_stop: str = field(
        default="none", metadata={"help": "end a block early: none, entropy:NATS (after a token with entropy >= NATS) "
                                          "or pmin:P (after a token whose top-1 probability < P)"}
    )
    k_schedule: str = field(
        default="constant", metadata={"help": "constant, or heuristic (+2 after a fully accepted block, -1 otherwise; "
                                              "k is the cap)"}
    )

    def __post_init__(self) -> None:
        if not isinstance(self.k, int) or self.k < 1:
            raise ConfigError(f"k must be >= 1, got {self.k}")
        if math.isnan(self.entropy_threshold) or self.entropy_threshold < 0:
            raise ConfigError(
                f"entropy_threshold must be >= 0 nats (0 = verify every block, inf = never), got {self.entropy_threshold}"
            )
        if not 0.0 <= self.accept_threshold <= 1.0:
            raise ConfigError(f"accept_threshold is a probability and must be in [0, 1], got {self.accept_threshold}")
        for name, value, allowed in (
            ("policy", self.policy, POLICIES),
            ("verifier", self.verifier, VERIFIERS),
            ("uncertainty", self.uncertainty, UNCERTAINTY),
        ):
            if value not in allowed:
                raise ConfigError(f"unknown {name} {value!r}: use one of {', '.join(allowed)}")
        if self.draft_topn is not None and (not isinstance(self.draft_topn, int) or self.draft_topn < 1):
            raise ConfigError(f"draft_topn must be an integer >= 1 (or unset for the full distribution), got {self.draft_topn}")
        if self.draft_topn is not None and self.policy != "sample":
            raise ConfigError("draft_topn truncates sampled drafts: use it with --policy sample, or leave it unset")
        parse_stop(self.draft_stop)
        make_schedule(self.k_schedule, self.k)
        if self.punct_trigger is not None and not 0.0 <= self.punct_trigger <= 1.0:
            raise ConfigError(f"punct_trigger is a density in [0, 1], got {self.punct_trigger}")

    def check_decoding(self, decode: DecodeConfig) -> None:
        if self.policy == "sample" and not decode.do_sample:
            raise ConfigError("policy 'sample' needs temperature > 0: set --temperature, or use --policy greedy for greedy decoding")
