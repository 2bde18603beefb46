"""Backend for the Qwen2.5-Omni *thinker* (text + audio in, text out). The speech talker and
token2wav are never built: only `Qwen2_5OmniThinkerForConditionalGeneration` is loaded.

Same KV discipline as `hf_causal` (DynamicCache, explicit positions, no attention mask, exact
crop), with three differences:
- prefill also passes the prompt's `input_features` [1, 128, L] and `feature_attention_mask`
  [1, L]; the audio tower turns them into one embedding per `<|AUDIO|>` placeholder token.
- positions are M-RoPE ids [3, 1, n]. For text and audio the three rows are equal and
  sequential (rope_deltas = 0), but the delta is read from `get_rope_index` at prefill and added
  to every later block, as `generate` does, rather than assumed.
- the thinker ignores `logits_to_keep`, so we run the base model and apply `lm_head` to the last
  `keep` hidden states only (V = 152k: logits for a whole audio prompt would be gigabytes).

The HF processor (`Qwen2_5OmniProcessor`) cannot be built offline, so `build_omni_prompt`
reproduces what it does for one audio clip: Whisper log-mel features, then the chat template
with `<|audio_bos|><|AUDIO|><|audio_eos|>` where `<|AUDIO|>` is repeated once per audio embedding.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from transformers import (
    PreTrainedModel,
    Qwen2_5OmniThinkerForConditionalGeneration,
    WhisperFeatureExtractor,
)

from specdec.backends.hf_causal import CausalState, HFCausalBackend, block_positions
from specdec.backends.hf_util import cache_kwarg, from_pretrained_checked
from specdec.backends.prompt import Prompt
from specdec.errors import InputError, ModelError

AUDIO_TOKEN, AUDIO_BOS, AUDIO_EOS = "<|AUDIO|>", "<|audio_bos|>", "<|audio_eos|>"
OMNI_MODEL_TYPES = ("qwen2_5_omni", "qwen2_5_omni_thinker")  # full checkpoint, thinker alone


def audio_token_count(mel_frames: int) -> int:
    """Audio embeddings (= `<|AUDIO|>` placeholders) for L valid mel frames: conv stride 2, then
    avg-pool stride 2. Same formula as the audio tower's `_get_feat_extract_output_lengths`."""
    after_conv = (mel_frames - 1) // 2 + 1
    return (after_conv - 2) // 2 + 1


def default_feature_extractor() -> WhisperFeatureExtractor:
    """The Qwen2.5-Omni feature extractor (its preprocessor_config.json): 128 mel bins, 16 kHz,
    hop 160 (100 frames/s), clips up to 300 s."""
    return WhisperFeatureExtractor(feature_size=128, sampling_rate=16000, chunk_length=300, dither=0.0)


def audio_features(feature_extractor: WhisperFeatureExtractor, waveform, sampling_rate: int = 16000) -> dict:
    """Mono waveform [S] -> {"input_features": [1, n_mels, L] float32, "feature_attention_mask": [1, L]},
    L = ceil(S / hop) valid frames; clips over 300 s are truncated, as the processor does.

    The processor zero-pads every clip to 300 s (~1 s of STFT on a small CPU) and the thinker
    reads only the L valid frames. Zero-padding to S + n_fft gives those frames the same values:
    their windows see the same zeros past the end (`longest` padding would reflect the signal
    instead), and the frames left out are all-zero ones at the log-mel floor, so the clamp
    (max - 8) is unchanged. The padded tail is then cut: `feature_attention_mask` is all ones."""
    wave = np.asarray(waveform.detach().cpu() if isinstance(waveform, torch.Tensor) else waveform, dtype=np.float32)
    if wave.ndim != 1 or wave.size == 0:
        raise InputError(f"audio must be a non-empty mono waveform [samples], got shape {wave.shape}")
    if sampling_rate != feature_extractor.sampling_rate:
        raise InputError(
            f"audio is sampled at {sampling_rate} Hz but the model needs {feature_extractor.sampling_rate} Hz: resample it"
        )
    out = feature_extractor(
        wave,
        sampling_rate=sampling_rate,
        padding="max_length",
        max_length=min(wave.size + feature_extractor.n_fft, feature_extractor.n_samples),
        truncation=True,
        return_attention_mask=True,
        return_tensors="pt",
    )
    frames = int(out["attention_mask"].sum())  # ceil(S / hop)
    return {
        "input_features": out["input_features"][:, :, :frames].contiguous(),
        "feature_attention_mask": out["attention_mask"][:, :frames].long(),
    }


def build_omni_prompt(
    tokenizer, feature_extractor, text: str, waveform=None, sampling_rate: int = 16000, system: str | None = None
) -> Prompt:
    """One user turn: the audio clip (if any) then `text`, rendered with the tokenizer's chat
    template (generation prompt added) or plain when it has none. `feature_extractor=None` uses
    `default_feature_extractor()`."""
    audio_token = getattr(tokenizer, "audio_token", None) or AUDIO_TOKEN
    audio_id = tokenizer.convert_tokens_to_ids(audio_token)
    features: dict[str, torch.Tensor] = {}
    n_audio = 0
    if waveform is not None:
        if audio_id is None or audio_id == tokenizer.unk_token_id:
            raise InputError(f"the tokenizer has no {audio_token} token: use the Qwen2.5-Omni tokenizer for audio")
        features = audio_features(feature_extractor or default_feature_extractor(), waveform, sampling_rate)
        n_audio = audio_token_count(int(features["feature_attention_mask"].sum()))
        if n_audio < 1:
            raise InputError("the audio clip is too short (under 3 mel frames, ~20 ms): give a longer one")
        bos = getattr(tokenizer, "audio_bos_token", None) or AUDIO_BOS
        eos = getattr(tokenizer, "audio_eos_token", None) or AUDIO_EOS
        text_in = bos + audio_token + eos + text  # one placeholder, expanded below (as the processor does)
    else:
        text_in = text

    if tokenizer.chat_template:
        # String content renders the same under the Omni template and plain Qwen2 ChatML ones.
        messages = [{"role": "system", "content": system}] if system else []
        messages.append({"role": "user", "content": text_in})
        rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids = tokenizer(rendered, add_special_tokens=False)["input_ids"]
    else:
        ids = tokenizer((system + "\n" if system else "") + text_in)["input_ids"]

    at = [i for i, t in enumerate(ids) if t == audio_id]
    if len(at) != (1 if n_audio else 0):
        raise InputError(f"the prompt text itself contains {audio_token}: remove it")
    if n_audio:
        ids = ids[: at[0]] + [audio_id] * n_audio + ids[at[0] + 1 :]
    return Prompt(torch.tensor(ids, dtype=torch.long), features, text)


@dataclass
class OmniState(CausalState):
    rope_deltas: int = 0  # M-RoPE position minus token index, fixed at prefill (0 for text+audio)


class OmniThinkerBackend(HFCausalBackend):
    """Wraps a `Qwen2_5OmniThinkerForConditionalGeneration`; build with `load_omni_thinker`."""

    accepts_audio = True

    def __init__(self, model: PreTrainedModel, name: str = "") -> None:
        if not isinstance(model, Qwen2_5OmniThinkerForConditionalGeneration):
            raise ModelError(
                f"{type(model).__name__} is not a Qwen2.5-Omni thinker: load it with load_omni_thinker()"
            )
        if getattr(model.config, "vision_start_token_id", None) is None:
            # get_rope_index reads it unconditionally; real Omni configs carry 151652.
            raise ModelError("the thinker config has no vision_start_token_id: add it (151652 in Qwen2.5-Omni)")
        super().__init__(model, name)
        self.audio_token_id = model.config.audio_token_id
        self._cache_kwarg = cache_kwarg(model.model.forward)  # forwards go to the inner text model

    # --- protocol -----------------------------------------------------------------------
    def prefill(self, prompt: Prompt, token_ids: torch.Tensor, keep: int = 0, use_cache: bool = True):
        features = self._audio_inputs(prompt, token_ids)
        state = OmniState(self._new_cache() if use_cache else None, 0)
        if token_ids.numel() == 0:
            return state, None
        ids = token_ids.view(1, -1).to(self.model.device)
        lens = features["feature_attention_mask"].sum(-1) if features else None
        # positions [3, 1, n], deltas [1, 1]; without image/video grids this is the sequential branch.
        positions, deltas = self.model.model.get_rope_index(
            ids, attention_mask=torch.ones_like(ids), audio_seqlens=lens
        )
        state.rope_deltas = int(deltas.item())
        return state, self._run(state, token_ids, keep, positions, features)

    # forward() and crop() are HFCausalBackend's: forward calls _run below.

    # --- internals ----------------------------------------------------------------------
    def _audio_inputs(self, prompt: Prompt, token_ids: torch.Tensor) -> dict[str, torch.Tensor]:
        """The prompt's audio tensors, after checking `token_ids` holds exactly one placeholder per
        audio embedding (the model does not check: extra embeddings would be silently dropped)."""
        placeholders = int((token_ids == self.audio_token_id).sum())
        if not prompt.features:
            if placeholders:
                raise InputError(f"the prompt has {placeholders} audio placeholder tokens but no audio features")
            return {}
        if set(prompt.features) != {"input_features", "feature_attention_mask"}:
            raise InputError(
                f"the Omni thinker takes input_features + feature_attention_mask, got {sorted(prompt.features)}"
            )
        frames = prompt.features["feature_attention_mask"].sum(-1)  # [clips]
        expected = sum(audio_token_count(int(f)) for f in frames)
        if placeholders != expected:
            raise InputError(
                f"the prompt has {placeholders} audio placeholder tokens but its audio gives {expected} embeddings: "
                "build it with build_omni_prompt"
            )
        return {k: v.to(self.model.device) for k, v in prompt.features.items()}

    def _run(
        self,
        state: CausalState,
        token_ids: torch.Tensor,
        keep: int,
        positions: torch.Tensor | None = None,
        features: dict[str, torch.Tensor] | None = None,
    ) -> torch.Tensor | None:
        assert isinstance(state, OmniState)  # this backend's prefill makes every state it is fed
        n = token_ids.numel()
        if positions is None:  # decode block: the same ids on all 3 M-RoPE rows -> [3, 1, n]
            positions = (block_positions(state.length, n) + state.rope_deltas).expand(3, 1, n)
        device = self.model.device
        hidden = self.model.model(
            input_ids=token_ids.view(1, n).to(device),
            position_ids=positions.to(device),
            **{self._cache_kwarg: state.cache},
            use_cache=state.cache is not None,
            **(features or {}),
        ).last_hidden_state  # [1, n, H]
        state.length += n
        if keep == 0:
            return None
        return self.model.lm_head(hidden[0, -keep:]).float()  # [keep, V]


def load_omni_thinker(path_or_model, dtype: torch.dtype | None = None, name: str = "") -> OmniThinkerBackend:
    """A backend on the thinker alone, from a local path / hub id of a Qwen2.5-Omni checkpoint
    (the full-model layout works: transformers picks `thinker_config` and strips the `thinker.`
    weight prefix, and talker/token2wav weights are skipped), or from a loaded thinker (or a full
    Omni model, whose `.thinker` is taken)."""
    if isinstance(path_or_model, PreTrainedModel):
        model = getattr(path_or_model, "thinker", path_or_model)
        if dtype is not None:
            model = model.to(dtype)  # type: ignore[arg-type]  # `to` is functools.wraps'd: mypy takes dtype for self
        return OmniThinkerBackend(model, name)
    model = from_pretrained_checked(
        Qwen2_5OmniThinkerForConditionalGeneration, path_or_model, OMNI_MODEL_TYPES, "Qwen2.5-Omni (audio-capable)", dtype
    )
    return OmniThinkerBackend(model, name)
