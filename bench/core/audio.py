"""Reading one sample's audio for a model: any file libsndfile reads (wav, flac, ogg/vorbis, ...),
downmixed to mono and resampled to the model's rate.

Every way a file can be unusable (missing, unreadable, empty, longer than the cap) raises a one-line
`InputError` naming the sample and the fix. It is raised when the sample is read, not when the
manifest is loaded, so a run or sweep records that one sample as failed and goes on.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import soundfile
import soxr

from specdec.errors import InputError

SAMPLING_RATE = 16000  # Hz: Whisper and the Qwen2.5-Omni audio tower both take 16 kHz log-mels
# Whisper's window (30 s); the Omni feature extractor would take 300 s, but a clip that long is
# ~750 audio tokens per prompt and far from the ≤ 30 s MER-style clips this harness measures.
MAX_SECONDS = 30.0


def read_audio(path: Path, sample_id: str, sampling_rate: int = SAMPLING_RATE,
               max_seconds: float = MAX_SECONDS) -> np.ndarray:
    """Mono float32 waveform [S] of `path` at `sampling_rate` Hz, S <= max_seconds * sampling_rate.

    Channels are averaged (a plain downmix; no channel is preferred). A file at another rate is
    resampled with soxr's VHQ polyphase filter, so any source rate works."""
    if sampling_rate <= 0:
        raise InputError(f"sampling rate must be > 0 Hz, got {sampling_rate}")
    if not max_seconds > 0:
        raise InputError(f"the audio length cap must be > 0 s, got {max_seconds}")
    path = Path(path)
    where = f"sample {sample_id!r}: audio {path.name}"
    if not path.is_file():
        raise InputError(f"{where} not found in {path.parent}: fix the `audio` path (relative to the manifest) or add the file")
    try:
        info = soundfile.info(path)  # header only: an over-long file is refused before it is decoded
        seconds = info.frames / info.samplerate if info.samplerate else 0.0
        if info.frames > 0 and seconds > max_seconds:
            raise InputError(
                f"{where} is {seconds:.1f} s, over the {max_seconds:g} s cap: trim or split it, or raise the cap"
            )
        waveform, rate = soundfile.read(path, dtype="float32", always_2d=True)  # [frames, channels]
    except soundfile.LibsndfileError as e:  # LibsndfileError subclasses RuntimeError; say the cause once
        raise InputError(f"{where} cannot be decoded ({e.error_string}): re-encode it as wav, flac or ogg") from None
    except RuntimeError as e:
        raise InputError(f"{where} cannot be decoded ({e}): re-encode it as wav, flac or ogg") from None
    if waveform.shape[0] == 0:
        raise InputError(f"{where} is empty (0 samples): re-record it or drop it from the manifest")
    mono = waveform.mean(axis=1)  # [frames]
    if rate != sampling_rate:
        mono = soxr.resample(mono, rate, sampling_rate, quality="VHQ")
    return np.ascontiguousarray(mono, dtype=np.float32)


def model_limits(feature_extractor, max_seconds: float = MAX_SECONDS) -> tuple[int, float]:
    """(sampling rate in Hz, length cap in s) for a model's feature extractor (None: text-only or
    unknown, the defaults). The cap never exceeds the extractor's window (`chunk_length` s):
    a longer clip would be truncated silently by the extractor."""
    rate = int(getattr(feature_extractor, "sampling_rate", None) or SAMPLING_RATE)
    window = getattr(feature_extractor, "chunk_length", None)
    return rate, min(max_seconds, float(window)) if window else max_seconds
