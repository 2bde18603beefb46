"""The user-facing engine: models by name, loaded lazily, so edge-only runs never construct or
load the cloud model (a "dummy" cloud once cost an edge-only baseline 6 s and 14 GB) and cloud-only
runs never load the edge."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from specdec.config import DecodeConfig, EngineConfig, SpecConfig
from specdec.constraints_zh import zh_profile
from specdec.decode import autoregressive_decode, speculative_decode
from specdec.errors import ConfigError, InputError
from specdec.models.loading import LoadedModel, load_model
from specdec.processors import Constraints, StopRule
from specdec.tokenstats import PunctuationTable
from specdec.trace import Generation


@dataclass(frozen=True, eq=False)
class Engine(EngineConfig):
    """An `EngineConfig` (validated on construction) plus the models it loads on first use."""

    spec: SpecConfig = field(default_factory=SpecConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    loader: Callable[..., LoadedModel] = load_model
    log: Callable[[str], object] = print
    _models: dict[str, LoadedModel] = field(default_factory=dict, init=False, repr=False)
    _derived: dict[str, object] = field(default_factory=dict, init=False, repr=False)  # per-tokenizer tables

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.mode == "spec":
            self.spec.check_decoding(self.decode)

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
        if self._derived.get("checked"):
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
        self._derived["checked"] = True

    def constraints_for(self) -> Constraints:
        if "constraints" not in self._derived:
            loaded = self.primary
            vocab = min(self.model(r).backend.vocab_size for r in self.roles)
            # The model's own decoding rules (Whisper's token suppression) run before any profile.
            if self.constraints == "zh":
                profile = zh_profile(loaded.tokenizer, loaded.eos_ids, vocab)
                self._derived["constraints"] = Constraints(loaded.processors + profile.processors, profile.stop)
            else:
                self._derived["constraints"] = Constraints(loaded.processors, StopRule(eos_ids=loaded.eos_ids))
        return self._derived["constraints"]

    def punct_density(self) -> Callable[[list[int]], float] | None:
        if self.mode != "spec" or self.spec.punct_trigger is None:
            return None
        if "punct" not in self._derived:
            self._derived["punct"] = PunctuationTable.build(self.primary.tokenizer, self.model("edge").backend.vocab_size)
        return self._derived["punct"].density

    def load_seconds(self) -> dict[str, float]:
        return {role: self.model(role).load_s for role in self.roles}

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
