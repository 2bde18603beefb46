"""Load a model by name (local directory, registry alias, or hub id) into a backend + tokenizer,
and turn prompt text (and audio) into a `Prompt` for it.

Each runtime's loader is named by its declaration (specdec/runtimes) and imported on first load, and the concrete
backends inside the loaders: each imports transformers at load (about 2.5 s here), which `specbench --help` and a bad
flag should not pay."""
from __future__ import annotations

import json
import re
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import torch
from safetensors import SafetensorError

from specdec.backends.base import DTYPES, Backend
from specdec.backends.devices import check_device, on_cpu, steps_of
from specdec.backends.prompt import Prompt
from specdec.errors import ConfigError, InputError, ModelError
from specdec.models import fetch as fetching
from specdec.models import integrity, registry
from specdec.models.architecture import NoTokenizer, build_architecture, is_architecture
from specdec.models.derive import split_name
from specdec.runtime_registry import check_file, declared, default_runtime, runtimes
from specdec.settings import CudaGraphs, DType, ExtraBuffers, KVCache, Steps, parse, parse_fields

# Hub ids as the hub validates them: two names that start with a letter or digit.
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$")


@dataclass
class LoadedModel:
    name: str
    location: str
    backend: Backend
    tokenizer: Any
    load_s: float
    feature_extractor: Any = None  # audio models only
    runtime: str | None = None  # what runs it (specdec/runtimes); None where unsaid

    @property
    def eos_ids(self) -> frozenset[int]:
        """Every id the model or its tokenizer declares as end of sequence."""
        ids: set[int] = set()
        model = self.backend.model  # a torch model; llama.cpp's backend declares its own
        declared = getattr(model.generation_config, "eos_token_id", None) if model is not None else None
        for value in (self.tokenizer.eos_token_id, declared, self.backend.eos_ids):
            if value is not None:
                ids.update(value if isinstance(value, (list, tuple, frozenset)) else [value])
        return frozenset(int(i) for i in ids)

    @property
    def max_positions(self) -> int | None:
        """The longest sequence (prompt + output tokens) the model has positions for, from its
        config (a decoder's own limit first: Whisper's 448 target positions), or None if unsaid;
        llama.cpp's backend says how many positions its context holds."""
        own = self.backend.max_positions  # llama.cpp's context; a server's static cache's capacity
        if own is not None or self.backend.model is None:
            return own
        config = self.backend.model.config
        for part in (config, getattr(config, "text_config", None)):
            for key in ("max_target_positions", "max_position_embeddings"):
                if isinstance(value := getattr(part, key, None), int):
                    return value
        return None

    @property
    def processors(self) -> tuple:
        """Logits processors the model's own decoding rule needs (Whisper's token suppression),
        to run before any profile's: `Constraints(processors=loaded.processors + ...)`."""
        return tuple(self.backend.processors)

    def uses_chat_template(self, asked: bool) -> bool:
        """Whether `encode(..., chat_template=asked)` wraps text in a chat template: Whisper takes no
        text, an audio (Omni) model always uses its tokenizer's template, a text model when asked
        and its tokenizer has one."""
        if self.backend.transcribes:
            return False
        return uses_chat_template(self.tokenizer, asked or self.backend.accepts_audio)

    def encode(self, text: str, system: str | None = None, waveform=None, sampling_rate: int = 16000,
               chat_template: bool = True, language: str | None = None,
               history: tuple[tuple[str, str], ...] = ()) -> Prompt:
        """Text (and audio) -> Prompt. Whisper takes the audio alone: `text` and `system` are
        ignored (a chat instruction is not a transcript; as Whisper's `<|startofprev|>` context it
        would bias the words), the task is transcription, and `language` (a code or an English
        name) is detected from the audio when None on a multilingual model (one extra encoder
        pass, outside the timed decode; pass it to save that). `history`: the (user, assistant) turns
        before this one, for a conversation's later turns (text models only)."""
        if self.backend.transcribes:
            from specdec.backends.whisper import WhisperBackend, build_whisper_prompt, detect_language, whisper_features

            if waveform is None:
                raise InputError(f"model {self.name!r} is Whisper (speech recognition): the prompt needs an `audio` clip")
            config = self.backend.model.generation_config
            if language is None and getattr(config, "is_multilingual", False):
                features = whisper_features(self.feature_extractor, waveform, sampling_rate)
                language = detect_language(cast(WhisperBackend, self.backend), features)  # its `transcribes` says so
            return build_whisper_prompt(config, self.feature_extractor, waveform, sampling_rate, language)
        if not text.strip():
            raise InputError("the prompt is empty: give it some text")
        if history and (waveform is not None or self.backend.accepts_audio):
            raise InputError(f"model {self.name!r} takes audio: a conversation's later turns run on text models only")
        if waveform is not None and not self.backend.accepts_audio:
            raise InputError(
                f"model {self.name!r} is text-only but the prompt has audio: use an audio model "
                "(a Qwen2.5-Omni thinker or Whisper) or drop the `audio` field"
            )
        if self.backend.accepts_audio:
            from specdec.backends.omni_thinker import build_omni_prompt

            return build_omni_prompt(self.tokenizer, self.feature_extractor, text, waveform, sampling_rate, system)
        return encode_text(self.tokenizer, text, system, chat_template, history)


def uses_chat_template(tokenizer, asked: bool) -> bool:
    return asked and bool(getattr(tokenizer, "chat_template", None))


def encode_text(tokenizer, text: str, system: str | None = None, chat_template: bool = True,
                history: tuple[tuple[str, str], ...] = ()) -> Prompt:
    """The tokenizer's chat template (with the generation prompt) when it has one and it is wanted.
    `history`: earlier (user, assistant) turns of the conversation, before `text`."""
    if uses_chat_template(tokenizer, chat_template):
        earlier = [{"role": role, "content": content} for turn in history for role, content in zip(("user", "assistant"), turn)]
        messages = ([{"role": "system", "content": system}] if system else []) + earlier + [{"role": "user", "content": text}]
        rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids = tokenizer(rendered, add_special_tokens=False)["input_ids"]
    else:
        turns = "".join(f"{user}\n\n{answer}\n\n" for user, answer in history)
        ids = tokenizer((system + "\n\n" if system else "") + turns + text)["input_ids"]
    return Prompt(torch.tensor(ids, dtype=torch.long), text=text)


def resolve(name: str, *, fetch: bool = True, log: Callable[[str], object] = print) -> Path | str:
    """A local directory, a registry alias (its converted directory, fetched on first use; a
    derived alias's base's) or a hub id (unchanged). Derivations are applied by `load_model`."""
    if Path(name).expanduser().is_dir():
        return Path(name).expanduser()
    if registry.is_alias(name):
        state = registry.state(name)
        if state == registry.State.FETCHED:
            return registry.model_dir(name)
        if state == registry.State.DAMAGED:
            raise ModelError(registry.refetch_hint(name))
        if not fetch:
            raise ModelError(f"model {name!r} is not fetched yet: run `specbench models fetch {name}`")
        return fetching.fetch(name, log=log)
    if name.startswith(("/", ".", "~")):
        raise ModelError(f"model directory {name!r} does not exist: check the path")
    if _HUB_ID.match(name):
        return name
    raise ModelError(registry.unknown_model(name))


def cast_copy(location: Path | str, dtype: str, log: Callable[[str], object] = print) -> Path | str:
    """A registry model is stored in float32 (its dequantized weights are exact only there). Loading
    it as bf16 would mmap and touch the whole fp32 file, peaking at fp32 + bf16 bytes: a false edge
    footprint. So a bf16 copy is made once beside it; its weights are bit-identical to casting at load."""
    location = Path(location)
    marker = registry.read_marker(location)
    if dtype == DType.FLOAT32 or marker is None:
        return location
    copy = location / dtype
    made = registry.read_marker(copy)
    if made is not None and not (damaged := integrity.problems(copy, made.get("files"))):
        return copy
    if made is not None:
        log(f"the {dtype} copy of {location.name} is damaged ({'; '.join(damaged)}): making it again")
    from transformers import AutoModelForCausalLM

    log(f"making a one-time {dtype} copy of {location.name} (halves its load-time peak memory) ...")
    tmp = location / f"{dtype}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    model = AutoModelForCausalLM.from_pretrained(location, dtype=DTYPES[dtype])
    model.save_pretrained(tmp)
    for item in location.iterdir():
        if item.is_file() and not item.name.endswith(".safetensors") and item.name not in ("config.json", registry.MARKER):
            shutil.copy2(item, tmp / item.name)  # tokenizer, generation config
    (tmp / registry.MARKER).write_text(json.dumps({**marker, "files": integrity.record(tmp)}, indent=1))  # last
    del model
    shutil.rmtree(copy, ignore_errors=True)
    tmp.rename(copy)
    return copy


@dataclass(frozen=True)
class LoadSettings:
    """How one model loads, parsed once where load_model's words come in: the runtime, the dtype, the device, and
    for the torch runtime its KV cache, captured graphs and a server's sessions; llama.cpp's extra buffers."""

    dtype: DType = DType.BFLOAT16
    runtime: str = field(default_factory=default_runtime)
    device: str = "cpu"
    kv_cache: KVCache = KVCache.DYNAMIC
    cuda_graphs: CudaGraphs = CudaGraphs.ON
    extra_buffers: ExtraBuffers = ExtraBuffers.AUTO
    sessions: int | None = None  # a server's: its static cache holds that many sequences (static_slots.py)

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ModelError(f"unknown dtype {self.dtype!r}: use one of {', '.join(DTYPES)}")
        try:  # an old runtime name is today's
            object.__setattr__(self, "runtime", declared(self.runtime).name)
        except ConfigError as e:
            raise ModelError(str(e)) from None
        parse_fields(self)

    def steps(self, static_capable: bool = True) -> Steps:
        """What runs the torch runtime's forwards, from the KV cache, the graphs and the device (devices.steps_of):
        the one place a load reads them."""
        return steps_of(self.kv_cache, self.device, self.cuda_graphs, static_capable)

    def identity(self) -> tuple:
        """What tells two loads apart: a setting the runtime does not take is left out (a KV cache for llama.cpp),
        and the cache and graphs as the steps they resolve to (auto on the CPU is the dynamic cache: one load)."""
        runtime = declared(self.runtime)
        steps = self.steps() if runtime.caches else None
        return (runtime.name, self.dtype, self.device, steps, self.extra_buffers if runtime.extra_buffers else None,
                self.sessions)


def load_model(name: str, dtype: str = "bfloat16", *, log: Callable[[str], object] = print,
               runtime: str | None = None, llamacpp_extra_buffers: str = "auto", device: str = "cpu",
               kv_cache: str = "dynamic", cuda_graphs: str = "on") -> LoadedModel:
    """Resolve `name` (fetching a registry alias on first use; `arch:PATH.json` builds a random-weight architecture,
    specdec/models/architecture.py) and load it in `runtime` (specdec/runtimes; None: the one a model file needs, a
    `.gguf`'s, else the default): the words parsed once into LoadSettings, then `load`. Engine's loader; a server,
    which sizes its static cache by its sessions, builds its LoadSettings and calls `load`."""
    settings = LoadSettings(parse(DType, dtype, "dtype"), runtime or default_runtime(name), device,
                            parse(KVCache, kv_cache, "kv_cache"),
                            parse(CudaGraphs, cuda_graphs, "cuda_graphs"),
                            parse(ExtraBuffers, llamacpp_extra_buffers, "extra_buffers"))
    return load(name, settings, log)


def load(name: str, settings: LoadSettings, log: Callable[[str], object] = print) -> LoadedModel:
    """`name` loaded as `settings` say, by the loader its runtime declares (specdec/runtimes). A torch model's weights
    go to `settings.device` (specdec/backends/devices.py); its KV cache and graphs say how its forwards run
    (devices.steps_of)."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a sub-second bar per load is noise in run logs
    check_device(settings.device, "device")
    runtime = declared(settings.runtime)
    if not on_cpu(settings.device) and not runtime.devices:
        on_devices = ", ".join(r.name for r in runtimes() if r.devices)
        raise ModelError(f"runtime {runtime.name} runs on the CPU only: device {settings.device} takes runtime "
                         f"{on_devices}")
    if is_architecture(name):
        if not runtime.default:
            raise ModelError(f"{name} is a random-weight architecture, which the {default_runtime()} runtime builds: "
                             f"use runtime {default_runtime()}")
        return load_architecture(name, settings)
    return runtime.load(name, settings, log)


def load_architecture(name: str, settings: LoadSettings) -> LoadedModel:
    """`arch:PATH.json`: the architecture with seeded random weights on the device (specdec/models/architecture.py)."""
    from specdec.backends.static_cache import static_capable
    from specdec.backends.static_slots import causal_backend

    start = time.perf_counter()
    model = build_architecture(name, DTYPES[settings.dtype], settings.device)
    steps = settings.steps(static_capable(model))
    backend = causal_backend(model, name, steps, settings.sessions)
    return LoadedModel(name, name, backend, NoTokenizer(name), time.perf_counter() - start, runtime=default_runtime())


def load_converted(name: str, settings: LoadSettings, log: Callable[[str], object] = print) -> LoadedModel:
    """The loader of a runtime that converts the model's folder (its declaration's `conversion`, with its `options`):
    the folder (a registry alias is fetched first), converted on first use (seconds to minutes; the conversion is kept
    beside the folder with the hashes it was made from), loaded with the folder's tokenizer and stop tokens, so every
    runtime encodes and stops alike."""
    from transformers import AutoTokenizer, GenerationConfig

    declaration = declared(settings.runtime)
    runtime = declaration.name
    declaration.check()
    base, ops = split_name(registry.expand(name))
    if ops:
        raise ModelError(f"cannot load {name!r} in {runtime}: @{'+'.join(ops)} derives a torch model: drop the "
                         f"derivation, or run it in runtime {default_runtime()}")
    try:
        check_file(base, runtime, "model", "runtime")
    except ConfigError as e:
        raise ModelError(str(e)) from None
    location = resolve(base, log=log)
    if not isinstance(location, Path):
        raise ModelError(f"runtime {runtime} converts a model folder: fetch {name!r} first (`specbench models fetch`) or "
                         "give a folder")
    if damaged := integrity.problems(location, None):
        raise ModelError(f"cannot load model {name!r}: {damaged[0]} in {location}: restore that file, or point at a "
                         "whole model folder")
    convert = declaration.converter()
    if convert is None:
        raise ModelError(f"runtime {runtime} declares no conversion, so it cannot load a model folder: give its "
                         "declaration `conversion`")
    start = time.perf_counter()
    backend = convert(location, log, name=name, **declaration.options)
    with load_errors(name, location):
        tokenizer = AutoTokenizer.from_pretrained(location)
    if (location / "generation_config.json").is_file():  # the folder's stop tokens, as torch reads them
        stop = GenerationConfig.from_pretrained(location).eos_token_id
        backend.eos_ids = frozenset(backend.eos_ids) | frozenset(
            stop if isinstance(stop, (list, tuple)) else [stop] if stop is not None else [])
    return LoadedModel(name, str(location), backend, tokenizer, time.perf_counter() - start, runtime=runtime)


def check_weights(name: str, location: str, info: dict) -> None:
    """transformers re-initializes at random what it cannot take from the weight files (and says so
    in a log table): a model with random weights must not run as if it were the one named."""
    if info["mismatched_keys"]:
        key, stored, expected = sorted(info["mismatched_keys"], key=lambda entry: entry[0])[0]
        raise ModelError(f"cannot load model {name!r}: its weights do not fit {Path(location) / 'config.json'} ({key} "
                         f"is {list(stored)} in the weights, {list(expected)} by the config): restore config.json or "
                         "the weights")
    if info["missing_keys"]:
        missing = sorted(info["missing_keys"])
        raise ModelError(f"cannot load model {name!r}: the weights in {location} lack {len(missing)} of its tensors "
                         f"(e.g. {missing[0]}): restore the weight files")


@contextmanager
def verbosity(hf_logging, level: int) -> Iterator[None]:
    previous = hf_logging.get_verbosity()
    hf_logging.set_verbosity(level)
    try:
        yield
    finally:
        hf_logging.set_verbosity(previous)


@contextmanager
def load_errors(name: str, location) -> Iterator[None]:
    """One line for whatever a model folder makes loading raise: missing or unreadable files
    (OSError), bad configs (ValueError), tensors that do not fit (RuntimeError, SafetensorError)."""
    try:
        yield
    except (OSError, ValueError, RuntimeError, SafetensorError) as e:
        where = location if Path(location).is_dir() else "a local directory or the model hub (offline here?)"
        lines = [line.strip() for line in str(e).splitlines() if line.strip()] or [type(e).__name__]
        cause = next((line for line in lines if "mismatch" in line), lines[0]).rstrip(".")
        fix = "; restore its files, or point at a whole model folder" if Path(location).is_dir() else ""
        raise ModelError(f"cannot load model {name!r} from {where}: {cause}{fix}") from e
