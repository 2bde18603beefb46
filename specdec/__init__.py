"""specdec: a compact edge-cloud speculative decoding engine."""
from specdec.backends.base import Backend
from specdec.backends.prompt import Prompt
from specdec.core.config import DecodeConfig, EngineConfig, SpecConfig
from specdec.core.decode import SpecOptions, autoregressive_decode, speculative_decode
from specdec.core.drafters import DraftContext, Drafter, Proposal, register_drafter
from specdec.core.processors import Constraints, StopRule
from specdec.core.trace import Counters, Cycle, Generation
from specdec.errors import ConfigError, InputError, ModelError, SpecdecError

__all__ = [
    "Backend", "Prompt", "DecodeConfig", "EngineConfig", "SpecConfig", "SpecOptions", "autoregressive_decode",
    "speculative_decode",
    "ConfigError", "InputError", "ModelError", "SpecdecError", "Constraints", "StopRule",
    "Counters", "Cycle", "Generation", "DraftContext", "Drafter", "Proposal", "register_drafter",
]
