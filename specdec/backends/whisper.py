"""Backend for Whisper (encoder-decoder speech recognition): audio in, text out.

The encoder runs once per prefill: its output [1, 1500, D] is kept in the state and every decoder
block attends to it. The KV state is an `EncoderDecoderCache`: the self-attention half grows with
the decoded tokens and is the only half cropped on rollback; the cross-attention half is filled by
the first decoder call (K/V of the encoder output) and fixed after it. Every block passes explicit
decoder `position_ids = length + arange(n)` (the decoder would otherwise derive them from the
cache length; explicit ones cannot drift).

The decoder prompt is Whisper's task prefix, `<|startoftranscript|>` [+ `<|lang|>` + `<|task|>`]
+ `<|notimestamps|>`; the audio is `Prompt.features["input_features"]` [1, 80, 3000] (log-mel,
zero-padded to 30 s, as the model requires). `generate`'s two suppression lists are applied by
`SuppressTokens`, a specdec logits processor, so edge, cloud and `generate` see the same rule.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, cast

import numpy as np
import torch
from transformers import (
    DynamicCache,
    EncoderDecoderCache,
    GenerationConfig,
    PreTrainedModel,
    WhisperFeatureExtractor,
    WhisperForConditionalGeneration,
)

from specdec.backends.base import Backend
from specdec.backends.hf_causal import block_positions
from specdec.backends.hf_util import cache_kwarg, from_pretrained_checked
from specdec.backends.prompt import Prompt
from specdec.errors import InputError, ModelError

WHISPER_MODEL_TYPES = ("whisper",)
TASKS = ("transcribe", "translate")


class WhisperGenerationFields(Protocol):
    """What a Whisper checkpoint's GenerationConfig holds beyond the fields transformers declares: attributes of its
    own, from generation_config.json (or the constructor's keywords, convert_ct2.whisper_generation_config)."""

    lang_to_id: dict[str, int]  # multilingual models only: "<|en|>" -> its token
    task_to_id: dict[str, int]  # "transcribe" / "translate" -> its token
    no_timestamps_token_id: int


# --- prompts ------------------------------------------------------------------------------
def whisper_features(feature_extractor: WhisperFeatureExtractor, waveform, sampling_rate: int = 16000) -> torch.Tensor:
    """Mono waveform [S] (S <= 30 s of samples) -> input_features [1, n_mels, 3000] float32."""
    wave = np.asarray(waveform.detach().cpu() if isinstance(waveform, torch.Tensor) else waveform, dtype=np.float32)
    if wave.ndim != 1 or wave.size == 0:
        raise InputError(f"audio must be a non-empty mono waveform [samples], got shape {wave.shape}")
    if sampling_rate != feature_extractor.sampling_rate:
        raise InputError(
            f"audio is sampled at {sampling_rate} Hz but Whisper needs {feature_extractor.sampling_rate} Hz: resample it"
        )
    if wave.size > feature_extractor.n_samples:
        raise InputError(
            f"the clip is {wave.size / sampling_rate:.1f} s long; Whisper hears at most "
            f"{feature_extractor.chunk_length} s per prompt: split it"
        )
    return feature_extractor(wave, sampling_rate=sampling_rate, return_tensors="pt")["input_features"]


def language_code(generation_config: GenerationConfig, language: str) -> str:
    """'en' / 'English' / '<|en|>' -> 'en', checked against the model's language tokens."""
    from transformers.models.whisper.tokenization_whisper import LANGUAGES, TO_LANGUAGE_CODE

    code = language.strip().lower().removeprefix("<|").removesuffix("|>")
    code = TO_LANGUAGE_CODE.get(code, code)
    if f"<|{code}|>" not in getattr(generation_config, "lang_to_id", {}):
        known = sorted(c for c in LANGUAGES if f"<|{c}|>" in getattr(generation_config, "lang_to_id", {}))
        raise InputError(f"unknown language {language!r} for this Whisper model: use one of {', '.join(known)}")
    return code


def build_whisper_prompt(
    generation_config: GenerationConfig, feature_extractor: WhisperFeatureExtractor, waveform,
    sampling_rate: int = 16000, language: str | None = None, task: str = "transcribe",
) -> Prompt:
    """The decoder prompt generate() builds with `return_timestamps=False`:
    multilingual: [<|startoftranscript|>, <|lang|>, <|task|>, <|notimestamps|>];
    English-only: [<|startoftranscript|>, <|notimestamps|>] (language must be None or English).
    A multilingual model needs the language: give it, or detect it with `detect_language`."""
    if task not in TASKS:
        raise InputError(f"unknown Whisper task {task!r}: use one of {', '.join(TASKS)}")
    features = whisper_features(feature_extractor, waveform, sampling_rate)
    whisper = cast(WhisperGenerationFields, generation_config)  # transformers declares none of Whisper's fields
    ids = [generation_config.decoder_start_token_id]
    if getattr(generation_config, "is_multilingual", False):
        if language is None:
            raise InputError("a multilingual Whisper model needs the language: pass language= (or detect_language)")
        ids += [whisper.lang_to_id[f"<|{language_code(generation_config, language)}|>"], whisper.task_to_id[task]]
    elif (language is not None and language.strip().lower() not in ("en", "english", "<|en|>")) or task != "transcribe":
        raise InputError(f"this Whisper model is English-only: it cannot {task} language {language!r}")
    ids.append(whisper.no_timestamps_token_id)
    return Prompt(torch.tensor(ids, dtype=torch.long), {"input_features": features})


@torch.inference_mode()
def detect_language(backend: WhisperBackend, input_features: torch.Tensor) -> str:
    """generate()'s rule: after <|startoftranscript|>, the most likely language token. Costs one
    encoder pass and one decoder step; pass a language to skip it."""
    config = backend.model.generation_config
    lang_to_id = getattr(config, "lang_to_id", None)
    if not lang_to_id:
        raise InputError("this Whisper model is English-only: it has no language tokens to detect")
    start = torch.tensor([config.decoder_start_token_id])
    _, logits = backend.prefill(Prompt(start, {"input_features": input_features}), start, keep=1, use_cache=False)
    codes, ids = zip(*lang_to_id.items())
    return codes[int(logits[0, list(ids)].argmax())].removeprefix("<|").removesuffix("|>")


@dataclass(frozen=True)
class SuppressTokens:
    """generate()'s SuppressTokensLogitsProcessor and SuppressTokensAtBeginLogitsProcessor as one
    specdec processor: `always` ids get -inf at every step, `at_begin` ids at the first new token."""

    always: torch.Tensor  # [A] int64
    at_begin: torch.Tensor  # [B] int64

    @classmethod
    def from_generation_config(cls, config: GenerationConfig, vocab_size: int) -> SuppressTokens:
        def ids(name: str) -> torch.Tensor:
            values = torch.tensor(list(getattr(config, name, None) or []), dtype=torch.long)
            if values.numel() and not (0 <= int(values.min()) and int(values.max()) < vocab_size):
                raise ModelError(f"generation_config.{name} holds ids outside the vocabulary [0, {vocab_size})")
            return values

        return cls(ids("suppress_tokens"), ids("begin_suppress_tokens"))

    def __call__(self, generated: Sequence[int], logits: torch.Tensor) -> torch.Tensor:
        ids = self.always if generated else torch.cat([self.always, self.at_begin])
        return logits.index_fill(0, ids, float("-inf")) if ids.numel() else logits


# --- backend ------------------------------------------------------------------------------
@dataclass
class WhisperState:
    cache: EncoderDecoderCache | None  # None: prefill(use_cache=False), one forward that keeps nothing
    encoder_hidden: torch.Tensor  # [1, 1500, D]: the audio, encoded once
    length: int  # decoder positions held in the self-attention cache


class WhisperBackend(Backend):
    """Wraps a `WhisperForConditionalGeneration`; build with `load_whisper`."""

    transcribes = True

    accepts_audio = True

    def __init__(self, model: PreTrainedModel, name: str = "") -> None:
        if not isinstance(model, WhisperForConditionalGeneration):
            raise ModelError(f"{type(model).__name__} is not a Whisper model: load it with load_whisper()")
        self.model = model.eval()
        self.name = name or model.config.name_or_path or type(model).__name__
        self.vocab_size = model.config.vocab_size  # proj_out may be quantized: no plain .weight
        self.max_positions: int = model.config.max_target_positions
        self.device = model.device  # inputs are copied here (the loop times forwards after its queue drains)
        self._cache_kwarg = cache_kwarg(model.model.decoder.forward)

    @property
    def processors(self) -> tuple[SuppressTokens, ...]:
        return (SuppressTokens.from_generation_config(self.model.generation_config, self.vocab_size),)

    # --- protocol -----------------------------------------------------------------------
    def prefill(self, prompt: Prompt, token_ids: torch.Tensor, keep: int = 0, use_cache: bool = True):
        encoder_hidden = self.encode(self._input_features(prompt))
        cache = EncoderDecoderCache(DynamicCache(), DynamicCache()) if use_cache else None
        state = WhisperState(cache, encoder_hidden, 0)
        if token_ids.numel() == 0:
            return state, None
        return state, self._run(state, token_ids, keep)


    def _drop_past(self, state: WhisperState, length: int) -> None:
        assert state.cache is not None, "a state built with use_cache=False is never fed again or cropped"
        state.cache.crop(length - state.length)  # self-attention only; cross-attention K/V stay

    # --- internals ----------------------------------------------------------------------
    def encode(self, input_features: torch.Tensor) -> torch.Tensor:
        """[1, n_mels, 3000] -> encoder output [1, 1500, D]."""
        encoder = self.model.get_encoder()
        dtype = next(encoder.parameters()).dtype
        return encoder(input_features.to(self.model.device, dtype)).last_hidden_state

    def _input_features(self, prompt: Prompt) -> torch.Tensor:
        if set(prompt.features) != {"input_features"}:
            raise InputError(
                "Whisper takes exactly input_features (from build_whisper_prompt), "
                f"got {sorted(prompt.features) or 'no audio'}"
            )
        features = prompt.features["input_features"]
        expected = (1, self.model.config.num_mel_bins, 2 * self.model.config.max_source_positions)
        if tuple(features.shape) != expected:
            raise InputError(f"input_features must be {list(expected)} (30 s of log-mel), got {list(features.shape)}")
        return features

    def _run(self, state: WhisperState, token_ids: torch.Tensor, keep: int) -> torch.Tensor | None:
        n = token_ids.numel()
        if state.length + n > self.max_positions:
            raise InputError(
                f"Whisper decodes at most {self.max_positions} tokens (prompt included), asked for "
                f"{state.length + n}: lower max_new_tokens"
            )
        device = self.model.device
        hidden = self.model.model.decoder(
            input_ids=token_ids.view(1, n).to(device),
            encoder_hidden_states=state.encoder_hidden,
            position_ids=block_positions(state.length, n).to(device),
            **{self._cache_kwarg: state.cache},
            use_cache=state.cache is not None,
        ).last_hidden_state  # [1, n, D]
        state.length += n
        if keep == 0:
            return None
        return self.model.proj_out(hidden[0, -keep:]).float()  # [keep, V]


def load_whisper(path_or_model, dtype: torch.dtype | None = None, name: str = "") -> WhisperBackend:
    """A backend from a local Whisper directory (e.g. one converted by `specdec.models.convert_ct2`) or a
    loaded `WhisperForConditionalGeneration`."""
    if isinstance(path_or_model, PreTrainedModel):
        model = path_or_model
        if dtype is not None:
            model = model.to(dtype)  # type: ignore[arg-type]  # `to` is functools.wraps'd: mypy takes dtype for self
        return WhisperBackend(model, name)
    model = from_pretrained_checked(WhisperForConditionalGeneration, path_or_model, WHISPER_MODEL_TYPES, "Whisper", dtype)
    return WhisperBackend(model, name)


def whisper_feature_extractor(location, n_mels: int) -> WhisperFeatureExtractor:
    """The directory's preprocessor_config.json, else the default one for `n_mels` bins."""
    try:
        extractor = WhisperFeatureExtractor.from_pretrained(location)
    except OSError:
        extractor = WhisperFeatureExtractor(feature_size=n_mels)
    if extractor.feature_size != n_mels:
        raise ModelError(f"the feature extractor makes {extractor.feature_size} mel bins but the model takes {n_mels}")
    return extractor
