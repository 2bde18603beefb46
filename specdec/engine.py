"""The user-facing engine: models by name, loaded lazily, so edge-only runs never construct or
load the cloud model (seed 001) and cloud-only runs never load the edge."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from specdec.cloud import Cloud, LocalCloud
from specdec.config import DecodeConfig, SpecConfig
from specdec.decode import autoregressive_decode, speculative_decode
from specdec.errors import ConfigError, InputError
from specdec.loading import LoadedModel, load_model
from specdec.processors import Constraints, StopRule
from specdec.remote.client import RemoteCloud, SessionSettings
from specdec.remote.protocol import tokenizer_sha256
from specdec.trace import Generation

CONSTRAINT_PROFILES = ("none", "zh")
ON_CLOUD_LOSS = ("fail", "edge")


def build_constraints(loaded: LoadedModel, profile: str, vocab: int, eos_ids: frozenset[int] | None = None) -> Constraints:
    """The model's own decoding rules (Whisper's token suppression) first, then the profile's.
    `eos_ids` default to the model's; a verifier server takes the edge's, so both sides stop alike."""
    eos_ids = loaded.eos_ids if eos_ids is None else eos_ids
    if profile == "zh":
        from specdec.constraints_zh import zh_profile

        zh = zh_profile(loaded.tokenizer, eos_ids, vocab)
        return Constraints(loaded.processors + zh.processors, zh.stop)
    if profile != "none":
        raise ConfigError(f"unknown constraints profile {profile!r}: use one of {', '.join(CONSTRAINT_PROFILES)}")
    return Constraints(loaded.processors, StopRule(eos_ids=eos_ids))


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
    cloud_url: str | None = None  # spec mode: verify on a `specbench serve` server instead of in process
    cloud_token: str | None = None
    cloud_timeout_s: float = 60.0
    on_cloud_loss: str = "fail"  # or "edge": finish a generation edge-only when the server is lost
    overlap: bool = True  # with cloud_url: draft the next block while the server verifies

    def __post_init__(self) -> None:
        if self.mode not in ("edge", "cloud", "spec"):
            raise ConfigError(f"unknown mode {self.mode!r}: use edge, cloud or spec")
        if self.on_cloud_loss not in ON_CLOUD_LOSS:
            raise ConfigError(f"unknown on_cloud_loss {self.on_cloud_loss!r}: use one of {', '.join(ON_CLOUD_LOSS)}")
        if self.cloud_url and self.mode == "cloud":
            raise ConfigError("--cloud-url verifies spec blocks on a server; cloud mode runs the cloud model here: "
                              "drop --cloud-url or use --mode spec")
        needs = {"edge": ("edge",), "cloud": ("cloud",), "spec": ("edge",) if self.remote_cloud else ("edge", "cloud")}[self.mode]
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
        self._remote: RemoteCloud | None = None

    @property
    def remote_cloud(self) -> bool:
        """Spec blocks are verified by a server; edge mode never contacts it."""
        return self.mode == "spec" and bool(self.cloud_url)

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
        if self.remote_cloud:
            self._connect()
        elif self.mode == "spec":
            edge, cloud = self.model("edge"), self.model("cloud")
            if edge.tokenizer.get_vocab() != cloud.tokenizer.get_vocab():
                raise ConfigError(
                    f"edge {edge.name!r} and cloud {cloud.name!r} use different tokenizers: "
                    "speculative decoding needs a pair that shares one"
                )
            if cloud.backend.accepts_audio != edge.backend.accepts_audio:
                raise ConfigError("the edge and the cloud must both take audio or both be text-only, so they see the same inputs")
        self._checked = True

    def _connect(self) -> None:
        edge = self.model("edge")
        settings = SessionSettings(self.constraints, tuple(sorted(edge.eos_ids)))
        self._remote = RemoteCloud(self.cloud_url, self.cloud_token, settings, timeout_s=self.cloud_timeout_s)
        ready = self._remote.connect()
        if ready["tokenizer_sha256"] != tokenizer_sha256(edge.tokenizer):
            raise ConfigError(f"edge {edge.name!r} and the cloud at {self.cloud_url} ({ready['model']!r}) use different "
                              "tokenizers: speculative decoding needs a pair that shares one")
        if ready["accepts_audio"] != edge.backend.accepts_audio:
            raise ConfigError("the edge and the cloud must both take audio or both be text-only, so they see the same inputs")

    @property
    def cloud_name(self) -> str | None:
        """The cloud model's name; for a server, the name it loaded its model under (after load)."""
        if self.remote_cloud and self._remote is not None and self._remote.info:
            return self.cloud or self._remote.info["model"]
        return self.cloud

    def close(self) -> None:
        """Hang up on the verifier server, if any (models stay loaded)."""
        if self._remote is not None:
            self._remote.close()

    def constraints_for(self) -> Constraints:
        if self._constraints is None:
            vocab = min(self.model(r).backend.vocab_size for r in self._roles())
            if self._remote is not None:
                vocab = min(vocab, self._remote.vocab_size)
            self._constraints = build_constraints(self.primary, self.constraints, vocab)
        return self._constraints

    def punct_density(self) -> Callable[[list[int]], float] | None:
        if self.mode != "spec" or self.spec.punct_trigger is None:
            return None
        if self._punct is None:
            from specdec.tokenstats import PunctuationTable

            self._punct = PunctuationTable.build(self.primary.tokenizer, self.model("edge").backend.vocab_size)
        return self._punct.density

    def cloud_side(self) -> Cloud:
        """What verifies spec blocks: the server, or the cloud model in this process."""
        return self._remote if self.remote_cloud else LocalCloud(self.model("cloud").backend)

    def load_seconds(self) -> dict[str, float]:
        return {role: self.model(role).load_s for role in self._roles()}

    def _roles(self) -> tuple[str, ...]:
        return {"edge": ("edge",), "cloud": ("cloud",), "spec": ("edge",) if self.remote_cloud else ("edge", "cloud")}[self.mode]

    def generate(self, text: str, system: str | None = None, waveform=None, sampling_rate: int = 16000,
                 language: str | None = None) -> Generation:
        self.load()
        loaded = self.primary
        if waveform is not None and self.mode == "spec" and not self.cloud_side().accepts_audio:
            raise InputError(f"cloud model {self.cloud!r} is text-only but the prompt has audio")
        prompt = loaded.encode(text, system, waveform, sampling_rate, self.chat_template, language=language)
        constraints = self.constraints_for()
        if self.mode == "spec":
            generation = speculative_decode(
                self.model("edge").backend, self.cloud_side(), prompt, self.spec, self.decode,
                constraints, self.punct_density(), on_cloud_loss=self.on_cloud_loss,
                overlap=self.overlap and self.remote_cloud,
            )
        else:
            generation = autoregressive_decode(loaded.backend, prompt, self.decode, constraints, role=self.mode)
        generation.text = loaded.tokenizer.decode(generation.tokens, skip_special_tokens=True)
        return generation
