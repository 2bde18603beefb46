"""The user-facing engine: models by name, loaded lazily, so edge-only runs never construct or
load the cloud model (a "dummy" cloud once cost an edge-only baseline 6 s and 14 GB) and cloud-only
runs never load the edge. With `cloud_url`, spec blocks are verified by a `specbench serve` server
and no cloud model is loaded here either."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypedDict

import torch

from specdec.constraint_profiles import build_constraints
from specdec.core.cloud import Cloud, LocalCloud
from specdec.core.config import DecodeConfig, DeployConfig, EngineConfig, SpecConfig
from specdec.core.decode import SpecOptions, autoregressive_decode, speculative_decode
from specdec.core.drafters import DRAFTS_AHEAD, NEEDS_MODEL, WEIGHS_RUNTIMES, drafter_options
from specdec.core.history import History
from specdec.core.overlap import OverlapGovernor
from specdec.core.processors import Constraints
from specdec.core.tokenstats import PunctuationTable
from specdec.core.trace import Generation
from specdec.core.two_runtime import TwoRuntimeCloud
from specdec.errors import ConfigError, InputError
from specdec.models.architecture import is_architecture
from specdec.models.loading import LoadedModel, LoadSettings, load
from specdec.remote.client import RemoteCloud, SessionSettings
from specdec.remote.protocol import read_token, token_file_warning, tokenizer_sha256
from specdec.runtime_registry import declared, runtime_parts
from specdec.settings import Mode, Overlap

PLAIN_STEPS = "cloud plain steps"  # the model key of a two-runtime cloud's plain-step copy


class Derived(TypedDict, total=False):
    """What an engine derives once and keeps: per-tokenizer tables, the server, what its requests measured."""

    overlap: OverlapGovernor  # overlap "auto"'s governor, its running means carried across generations
    block_steps_prior: dict[int, float]  # assumed verify-block costs in plain steps (assume_block_costs)
    history: History
    remote: RemoteCloud  # the verifier server, once connected
    checked: bool  # load() checked that the models fit together
    constraints: Constraints
    punct: PunctuationTable


@dataclass(frozen=True, eq=False)
class Engine(EngineConfig):
    """An `EngineConfig` (validated on construction) plus the models it loads on first use."""

    spec: SpecConfig = field(default_factory=SpecConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    deploy: DeployConfig = field(default_factory=DeployConfig)
    loader: Callable[[str, LoadSettings, Callable[[str], object]], LoadedModel] = load  # (name, settings, log)
    log: Callable[[str], object] = print
    _models: dict[str, LoadedModel] = field(default_factory=dict, init=False, repr=False)
    _derived: Derived = field(default_factory=Derived, init=False, repr=False)  # per-tokenizer tables, the server

    def __post_init__(self) -> None:
        super().__post_init__()
        for role in self.roles:
            if is_architecture(name := getattr(self, role) or ""):
                raise ConfigError(f"--{role} {name} is a random-weight architecture: it serves token ids to replayed "
                                  "edges (`specbench fleet --edge-replay DIR --follow-verdicts`), not text prompts; "
                                  "load a real model here")
        if self.mode == Mode.SPEC:
            self.spec.check_decoding(self.decode)
            if self.two_runtimes and self.spec.drafter not in WEIGHS_RUNTIMES:
                raise ConfigError(f"--cloud-runtime {self.cloud_runtime} needs a drafter that weighs switching between "
                                  f"the two runtimes ({', '.join(sorted(WEIGHS_RUNTIMES))}); {self.spec.drafter!r} would "
                                  "feed the whole prompt to each: use --drafter auto or one runtime")
            if not self.remote_cloud and self.deploy.overlap is True:
                raise ConfigError("--overlap true drafts the next block while a remote cloud verifies; this cloud runs "
                                  "in this process, where each verify returns before the next draft: give --cloud-url, "
                                  "or use --overlap auto or false")
            if self.remote_cloud and self.deploy.overlap is True and self.spec.drafter not in DRAFTS_AHEAD:
                raise ConfigError(f"--overlap true drafts ahead with the edge model; drafter {self.spec.drafter!r} cannot "
                                  f"(only {', '.join(sorted(DRAFTS_AHEAD))}): use --overlap auto or false")

    @property
    def roles(self) -> tuple[str, ...]:
        """The models this process loads: a draft-free drafter verified here needs no edge model."""
        if self.mode == Mode.SPEC and not self.remote_cloud and self.spec.drafter not in NEEDS_MODEL:
            return ("cloud",)
        return super().roles

    def _governor(self) -> OverlapGovernor | None:
        """overlap auto: one governor per engine, its running means carried across generations."""
        if self.deploy.overlap != Overlap.AUTO:
            return None
        return self._derived.setdefault("overlap", OverlapGovernor(self.spec.k))

    def assume_block_costs(self, block_steps: dict[int, float]) -> None:
        """What a verify block of n tokens is expected to cost, in plain token steps of the cloud's runtime
        (a machine's calibration), until this engine has measured its own: drafters that weigh blocks
        against plain steps (`auto`) start from it instead of assuming every block costs one step. Not
        history: forget_history keeps it."""
        self._derived["block_steps_prior"] = {int(n): float(steps) for n, steps in block_steps.items()}
        if "history" in self._derived:
            self._derived["history"].block_steps_prior = dict(self._derived["block_steps_prior"])

    def history(self) -> History:
        """What this engine's requests measured for its next ones (specdec/core/history.py), from the
        assumed block costs on."""
        if "history" not in self._derived:
            self._derived["history"] = History(self._derived.get("block_steps_prior"))
        return self._derived["history"]

    def forget_history(self) -> None:
        """Drop what earlier generations taught this engine (the overlap governor's running means, the
        History: costs, answers, an n-gram drafter's counts), as after an untimed warm-up: the next
        generation starts as the first one of a fresh engine."""
        self._derived.pop("overlap", None)
        self._derived.pop("history", None)

    @property
    def two_runtimes(self) -> bool:
        """The cloud is held in two runtimes (--cloud-runtime PLAIN+BLOCKS)."""
        return len(runtime_parts(self.cloud_runtime)) > 1

    def model(self, role: str) -> LoadedModel:
        """The edge or cloud model, loaded on first use. A cloud held in two runtimes (PLAIN+BLOCKS) is
        "cloud" in the blocks' runtime (it verifies, its tokenizer encodes) and PLAIN_STEPS in the other."""
        if role not in self._models:
            self._models[role] = self.loader(self.model_name(role), self.load_settings(role), self.log)
        return self._models[role]

    def model_name(self, role: str) -> str:
        name = self.cloud if role == PLAIN_STEPS else getattr(self, role)
        if not name:  # EngineConfig names what each mode needs; an engine asked for another role has none
            raise ConfigError(f"no {role} model to load: give --{role} MODEL")
        return name

    def load_settings(self, role: str) -> LoadSettings:
        """How the role's model loads: the typed settings as they were parsed, passed to the loader whole (what the
        runtime does not take, it ignores: its declaration says which it takes)."""
        if role == PLAIN_STEPS:
            runtime, device = runtime_parts(self.cloud_runtime)[0], self.cloud_device
        else:
            runtime, device = runtime_parts(getattr(self, f"{role}_runtime"))[-1], getattr(self, f"{role}_device")
        return LoadSettings(self.dtype, runtime, device, self.kv_cache, self.cuda_graphs, self.llamacpp_extra_buffers)

    @property
    def primary(self) -> LoadedModel:
        """The model whose tokenizer encodes prompts and decodes outputs."""
        return self.model(self.roles[0] if self.mode == Mode.SPEC else self.mode)

    @property
    def chat_template_used(self) -> bool:
        """Whether prompts are wrapped in a chat template: as asked until the model that encodes
        them is loaded, then what it really does (a raw-text run must not be recorded as templated)."""
        loaded = self._models.get(self.roles[0] if self.mode == Mode.SPEC else self.mode)
        return self.chat_template if loaded is None else loaded.uses_chat_template(self.chat_template)

    def load(self) -> None:
        """Load every model this mode needs (and no other), and check that they fit together."""
        if self._derived.get("checked"):
            return
        _ = self.primary  # loaded first: the model that encodes prompts
        if self.mode == Mode.SPEC and not self.remote_cloud and self.two_runtimes:
            self.model(PLAIN_STEPS)  # a cloud held in two runtimes: its plain-step copy too
        self.check_positions(prompt_tokens=None)
        if self.remote_cloud:
            self._connect()
        elif self.roles == ("edge", "cloud"):
            edge, cloud = self.model("edge"), self.model("cloud")
            if edge.tokenizer.get_vocab() != cloud.tokenizer.get_vocab():
                raise ConfigError(
                    f"edge {edge.name!r} and cloud {cloud.name!r} use different tokenizers: "
                    "speculative decoding needs a pair that shares one"
                )
            if cloud.backend.accepts_audio != edge.backend.accepts_audio:
                raise ConfigError("the edge and the cloud must both take audio or both be text-only, so they see the same inputs")
        if self.mode == Mode.SPEC and self.spec.drafter in NEEDS_MODEL:
            drafting = self.model("edge").backend
            if drafter_options(self.spec.drafter, self.spec.drafter_options).get("head_vocab") and not drafting.cuts_head:
                drafting.with_head_rows(torch.zeros(0, dtype=torch.long))  # its one-line refusal, before any generation
        self._derived["checked"] = True

    def _connect(self) -> None:
        edge = self.model("edge")
        token = None
        if self.deploy.token_file:
            token = read_token(self.deploy.token_file)  # never empty: read_token refuses an empty file
            if warning := token_file_warning(self.deploy.token_file):
                self.log(warning)
        settings = SessionSettings(self.constraints, tuple(sorted(edge.eos_ids)))
        assert self.cloud_url is not None  # only a remote cloud connects, and remote_cloud means a URL was given
        remote = RemoteCloud(self.cloud_url, token, settings, timeout_s=self.deploy.cloud_timeout_s)  # wss://: TLS
        remote.connect()
        self._derived["remote"] = remote
        server = remote.server
        assert server is not None  # connect() returned, so it holds the server's `ready` (it raises otherwise)
        if server.tokenizer_sha256 != tokenizer_sha256(edge.tokenizer):
            raise ConfigError(f"edge {edge.name!r} and the cloud at {self.cloud_url} ({server.model!r}) use different "
                              "tokenizers: speculative decoding needs a pair that shares one")
        if server.accepts_audio != edge.backend.accepts_audio:
            raise ConfigError("the edge and the cloud must both take audio or both be text-only, so they see the same inputs")

    @property
    def cloud_name(self) -> str | None:
        """The cloud model's name; for a server, the name it loaded its model under (after load)."""
        remote = self._derived.get("remote")
        if self.remote_cloud and remote is not None and remote.server:
            return self.cloud or remote.server.model
        return self.cloud

    @property
    def cloud_runtime_used(self) -> str:
        """What runs the cloud model: as asked in process; for a server, the runtime its `ready` names once
        connected (a server too old to say: as asked), so a split run's records say what verified them."""
        remote = self._derived.get("remote")
        if self.remote_cloud and remote is not None and remote.server and remote.server.runtime:
            return remote.server.runtime
        return self.cloud_runtime

    @property
    def cloud_device_used(self) -> str:
        """Where the cloud's model runs: as asked in process; for a server, the device its `ready` names once
        connected (a server too old to say ran on the CPU)."""
        remote = self._derived.get("remote")
        if self.remote_cloud and remote is not None and remote.server:
            return remote.server.device
        return self.cloud_device

    @property
    def llamacpp_extra_buffers_used(self) -> str | None:
        """Whether the models this process runs in llama.cpp use its extra buffer types: as asked until one
        is loaded, then "on" or "off" (its backend's verdict; "mixed" if two loads differ); None where no
        model of this process runs in llama.cpp (a server's model is the server's)."""
        if not any(declared(part).extra_buffers for role in self.roles
                   for part in runtime_parts(getattr(self, f"{role}_runtime"))):
            return None
        used = {m.backend.extra_buffers for m in self._models.values() if m.backend.extra_buffers is not None}
        if not used:
            return self.llamacpp_extra_buffers
        return "mixed" if len(used) > 1 else "on" if used == {True} else "off"

    def cloud_side(self) -> Cloud:
        """What verifies spec blocks: the server, or the cloud model in this process (in two runtimes with
        --cloud-runtime PLAIN+BLOCKS: plain steps in one, blocks in the other)."""
        if self.remote_cloud:
            return self._derived["remote"]
        blocks = LocalCloud(self.model("cloud").backend)
        if not self.two_runtimes:
            return blocks
        return TwoRuntimeCloud(LocalCloud(self.model(PLAIN_STEPS).backend), blocks)

    def close(self) -> None:
        """Hang up on the verifier server, if any (models stay loaded)."""
        remote = self._derived.pop("remote", None)
        if remote is not None:
            remote.close()
            self._derived.pop("checked", None)

    def constraints_for(self) -> Constraints:
        if "constraints" not in self._derived:
            vocab = min(self.model(r).backend.vocab_size for r in self.roles)
            if self.remote_cloud:
                vocab = min(vocab, self.cloud_side().vocab_size)
            self._derived["constraints"] = build_constraints(self.primary, self.constraints, vocab)
        return self._derived["constraints"]

    def punct_density(self) -> Callable[[list[int]], float] | None:
        if self.mode != Mode.SPEC or self.spec.punct_trigger is None:
            return None
        if "punct" not in self._derived:
            self._derived["punct"] = PunctuationTable.build(self.primary.tokenizer, self.primary.backend.vocab_size)
        return self._derived["punct"].density

    def load_seconds(self) -> dict[str, float]:
        return {role: self.model(role).load_s for role in self.roles}

    def check_positions(self, prompt_tokens: int | None) -> None:
        """The prompt plus max_new_tokens must fit the positions of every model this process runs
        (a verifier server checks its own): past them a model extrapolates, or decodes for ever.
        `prompt_tokens` None: before any prompt, whether even a one-token prompt would fit."""
        budget = self.decode.max_new_tokens
        for role in self.roles:
            loaded = self.model(role)
            limit = loaded.max_positions
            if limit is None or (prompt_tokens or 1) + budget <= limit:
                continue
            if prompt_tokens is None:
                raise ConfigError(f"max_new_tokens {budget} does not fit model {loaded.name!r}, which has {limit} "
                                  f"positions for prompt and output together: lower --max-new-tokens below {limit}")
            fix = (f"lower --max-new-tokens to {limit - prompt_tokens} or less" if prompt_tokens < limit
                   else "shorten the prompt")
            raise InputError(f"the prompt has {prompt_tokens} tokens and max_new_tokens is {budget}, "
                             f"{prompt_tokens + budget} positions, but model {loaded.name!r} has {limit}: {fix}")

    def generate(self, text: str, system: str | None = None, waveform=None, sampling_rate: int = 16000,
                 language: str | None = None, follow_ups: tuple[str, ...] = ()) -> Generation:
        """One prompt; with `follow_ups`, a conversation: each later user turn is asked after the
        model's own answers so far (as Spec-Bench asks MT-bench's second turn), and the turns come
        back as one Generation (`Generation.then`)."""
        generation = self._turn(text, system, waveform, sampling_rate, language, ())
        history: tuple[tuple[str, str], ...] = ((text, generation.text),)
        for turn in follow_ups:
            later = self._turn(turn, system, None, sampling_rate, language, history)
            generation, history = generation.then(later), (*history, (turn, later.text))
        return generation

    def _turn(self, text: str, system: str | None, waveform, sampling_rate: int, language: str | None,
              history: tuple[tuple[str, str], ...]) -> Generation:
        self.load()
        loaded = self.primary
        if waveform is not None and self.mode == Mode.SPEC and not self.cloud_side().accepts_audio:
            raise InputError(f"cloud model {self.cloud_name!r} is text-only but the prompt has audio")
        prompt = loaded.encode(text, system, waveform, sampling_rate, self.chat_template, language=language,
                               **({"history": history} if history else {}))
        self.check_positions(prompt.input_ids.numel())
        constraints = self.constraints_for()
        if self.mode == Mode.SPEC:
            edge = self.model("edge").backend if self.spec.drafter in NEEDS_MODEL else None
            measured = self.history()  # this request reads what earlier ones measured; its answer's length closes it
            options = SpecOptions(constraints, self.punct_density(), self.deploy.on_cloud_loss,
                                  self.deploy.overlap if self.remote_cloud else False, self._governor(), measured)
            generation = speculative_decode(edge, self.cloud_side(), prompt, self.spec, self.decode, options)
            measured.close_request(generation.new_tokens)
        else:
            generation = autoregressive_decode(loaded.backend, prompt, self.decode, constraints, role=self.mode)
        generation.text = loaded.tokenizer.decode(generation.tokens, skip_special_tokens=True)
        generation.prompt_ids = prompt.input_ids.tolist()
        return generation
