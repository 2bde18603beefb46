"""The user-facing engine: models by name, loaded lazily, so edge-only runs never construct or
load the cloud model (seed 001) and cloud-only runs never load the edge."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from specdec.config import DecodeConfig, SpecConfig
from specdec.constraints_zh import zh_profile
from specdec.decode import autoregressive_decode, speculative_decode
from specdec.errors import ConfigError, InputError
from specdec.models.loading import LoadedModel, load_model
from specdec.processors import Constraints, StopRule
from specdec.tokenstats import PunctuationTable
from specdec.trace import Generation

CONSTRAINT_PROFILES = ("none", "zh")


@dataclass
class Engine:
    mode: str
    edge: str | None = None
    cloud: str | None = None
    dtype: str = "bfloat16"
    spec: SpecConfig = field(default_factory=SpecConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    constraints: str = "none"
    chat_template: bool = True
    loader: Callable[..., LoadedModel] = load_model
    log: Callable[[str], object] = print

    def __post_init__(self) -> None:
        if self.mode not in ("edge", "cloud", "spec"):
            raise ConfigError(f"unknown mode {self.mode!r}: use edge, cloud or spec")
        needs = {"edge": ("edge",), "cloud": ("cloud",), "spec": ("edge", "cloud")}[self.mode]
        missing = [role for role in needs if not getattr(self, role)]
        if missing:
            flags = " and ".join(f"--{role} MODEL" for role in missing)
            raise ConfigError(f"--mode {self.mode} needs {flags}")
        if self.constraints not in CONSTRAINT_PROFILES:
            raise ConfigError(f"unknown constraints profile {self.constraints!r}: use one of {', '.join(CONSTRAINT_PROFILES)}")
        if self.mode == "spec":
            self.spec.check_decoding(self.decode)
        self._models: dict[str, LoadedModel] = {}
        self._constraints: Constraints | None = None
        self._punct = None
        self._checked = False

    def model(self, role: str) -> LoadedModel:
        """The edge or cloud model, loaded on first use."""
        if role not in self._models:
            self._models[role] = self.loader(getattr(self, role), self.dtype, log=self.log)
        return self._models[role]

    @property
    def primary(self) -> LoadedModel:
        """The model whose tokenizer encodes prompts and decodes outputs."""
        return self.model("cloud" if self.mode == "cloud" else "edge")

    def load(self) -> None:
        """Load every model this mode needs (and no other), and check that they fit together."""
        if self._checked:
            return
        self.primary
        if self.mode == "spec":
            edge, cloud = self.model("edge"), self.model("cloud")
            if edge.tokenizer.get_vocab() != cloud.tokenizer.get_vocab():
                raise ConfigError(
                    f"edge {edge.name!r} and cloud {cloud.name!r} use different tokenizers: "
                    "speculative decoding needs a pair that shares one"
                )
            if cloud.backend.accepts_audio != edge.backend.accepts_audio:
                raise ConfigError("the edge and the cloud must both take audio or both be text-only, so they see the same inputs")
        self._checked = True

    def constraints_for(self) -> Constraints:
        if self._constraints is None:
            loaded = self.primary
            vocab = min(self.model(r).backend.vocab_size for r in self._roles())
            # The model's own decoding rules (Whisper's token suppression) run before any profile.
            if self.constraints == "zh":
                profile = zh_profile(loaded.tokenizer, loaded.eos_ids, vocab)
                self._constraints = Constraints(loaded.processors + profile.processors, profile.stop)
            else:
                self._constraints = Constraints(loaded.processors, StopRule(eos_ids=loaded.eos_ids))
        return self._constraints

    def punct_density(self) -> Callable[[list[int]], float] | None:
        if self.mode != "spec" or self.spec.punct_trigger is None:
            return None
        if self._punct is None:
            self._punct = PunctuationTable.build(self.primary.tokenizer, self.model("edge").backend.vocab_size)
        return self._punct.density

    def load_seconds(self) -> dict[str, float]:
        return {role: self.model(role).load_s for role in self._roles()}

    def _roles(self) -> tuple[str, ...]:
        return {"edge": ("edge",), "cloud": ("cloud",), "spec": ("edge", "cloud")}[self.mode]

    def generate(self, text: str, system: str | None = None, waveform=None, sampling_rate: int = 16000,
                 language: str | None = None) -> Generation:
        self.load()
        loaded = self.primary
        if waveform is not None and self.mode == "spec" and not self.model("cloud").backend.accepts_audio:
            raise InputError(f"cloud model {self.cloud!r} is text-only but the prompt has audio")
        prompt = loaded.encode(text, system, waveform, sampling_rate, self.chat_template, language=language)
        constraints = self.constraints_for()
        if self.mode == "spec":
            generation = speculative_decode(
                self.model("edge").backend, self.model("cloud").backend, prompt, self.spec, self.decode,
                constraints, self.punct_density(),
            )
        else:
            generation = autoregressive_decode(loaded.backend, prompt, self.decode, constraints, role=self.mode)
        generation.text = loaded.tokenizer.decode(generation.tokens, skip_special_tokens=True)
        return generation
