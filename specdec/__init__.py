"""specdec: a compact edge-cloud speculative decoding engine."""
from specdec.backends.base import Backend, Prompt
from specdec.config import DecodeConfig, EngineConfig, SpecConfig
from specdec.decode import autoregressive_decode, speculative_decode
from specdec.errors import ConfigError, InputError, ModelError, SpecdecError
from specdec.processors import Constraints, StopRule
from specdec.trace import Counters, Cycle, Generation

__all__ = [
    "Backend", "Prompt", "DecodeConfig", "EngineConfig", "SpecConfig", "autoregressive_decode", "speculative_decode",
    "ConfigError", "InputError", "ModelError", "SpecdecError", "Constraints", "StopRule",
    "Counters", "Cycle", "Generation",
]
