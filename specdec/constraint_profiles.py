"""A loaded model's decoding constraints by profile name: what the engine (the edge, or the cloud in
process) and a verifier server (the cloud behind `specbench serve`) both build, so both sides apply
the same rules and stop alike. It sits below both: the server never imports the engine."""
from __future__ import annotations

from specdec.core.constraints_zh import zh_profile
from specdec.core.processors import Constraints, StopRule
from specdec.models.loading import LoadedModel
from specdec.settings import Profile


def build_constraints(loaded: LoadedModel, profile: Profile, vocab: int, eos_ids: frozenset[int] | None = None) -> Constraints:
    """The model's own decoding rules (Whisper's token suppression) first, then the profile's.
    `eos_ids` default to the model's; a verifier server takes the edge's, so both sides stop alike."""
    eos_ids = loaded.eos_ids if eos_ids is None else eos_ids
    if profile == Profile.ZH:
        zh = zh_profile(loaded.tokenizer, eos_ids, vocab)
        return Constraints(loaded.processors + zh.processors, zh.stop)
    return Constraints(loaded.processors, StopRule(eos_ids=eos_ids))
