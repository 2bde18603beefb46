"""Audio input: reading (wav, flac, ogg; downmix; resampling to 16 kHz), every bad file's one-line
error, audio manifests (JSON array and JSONL, prompt_type), and the shipped espeak-ng samples."""
from __future__ import annotations

import json

import numpy as np
import pytest
import soundfile
import soxr

from bench.core.audio import MAX_SECONDS, SAMPLING_RATE, model_limits, read_audio
from bench.core.prompts import PROMPT_TYPES, SAMPLES_MANIFEST, load_prompts
from specdec.backends.omni_thinker import default_feature_extractor
from specdec.errors import InputError


def sine(seconds: float, rate: int, hz: float = 440.0, amplitude: float = 0.5) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (amplitude * np.sin(2 * np.pi * hz * t)).astype(np.float32)


def peak_hz(waveform: np.ndarray, rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(waveform * np.hanning(len(waveform))))
    return float(np.fft.rfftfreq(len(waveform), 1 / rate)[spectrum.argmax()])


@pytest.mark.parametrize("suffix,subtype", [(".wav", "FLOAT"), (".flac", "PCM_24"), (".ogg", "VORBIS")])
@pytest.mark.parametrize("rate", [8000, 22050, 44100])
def test_any_format_and_rate_becomes_16k_mono(tmp_path, suffix, subtype, rate):
    left = sine(1.0, rate)
    stereo = np.stack([left, np.zeros_like(left)], axis=1)  # [frames, 2]: the mean halves the sine
    path = tmp_path / f"clip{suffix}"
    soundfile.write(path, stereo, rate, subtype=subtype)
    waveform = read_audio(path, "s1")
    assert waveform.dtype == np.float32 and waveform.ndim == 1 and waveform.flags.c_contiguous
    assert abs(waveform.size - SAMPLING_RATE) <= 1  # 1.0 s at 16 kHz
    assert peak_hz(waveform, SAMPLING_RATE) == pytest.approx(440.0, abs=1.0)
    if subtype != "VORBIS":  # lossless input: the resampled sine is the analytic one at 16 kHz
        middle = slice(800, -800)  # away from the filter's edge transients
        np.testing.assert_allclose(waveform[middle], sine(1.0, SAMPLING_RATE, amplitude=0.25)[middle], atol=2e-3)


def test_a_16k_mono_float_file_comes_back_unchanged(tmp_path):
    clip = np.random.default_rng(0).uniform(-0.5, 0.5, 8000).astype(np.float32)
    soundfile.write(tmp_path / "c.wav", clip, SAMPLING_RATE, subtype="FLOAT")
    np.testing.assert_array_equal(read_audio(tmp_path / "c.wav", "s1"), clip)


def _missing(tmp_path):
    return tmp_path / "nowhere.wav"


def _corrupt(tmp_path):
    path = tmp_path / "corrupt.wav"
    path.write_bytes(b"RIFF\x24\x00\x00\x00WAVEjunk" + bytes(range(256)))
    return path


def _not_audio(tmp_path):
    path = tmp_path / "notes.flac"
    path.write_text("this is a text file with an audio name")
    return path


def _empty(tmp_path):
    path = tmp_path / "empty.wav"
    soundfile.write(path, np.zeros(0, dtype=np.float32), SAMPLING_RATE)
    return path


def _too_long(tmp_path):
    path = tmp_path / "long.flac"
    soundfile.write(path, np.zeros(int((MAX_SECONDS + 1) * 8000), dtype=np.float32), 8000)  # 31 s at 8 kHz
    return path


@pytest.mark.parametrize(
    "make,message",
    [
        (_missing, "audio nowhere.wav not found in"),
        (_corrupt, "cannot be decoded"),
        (_not_audio, "cannot be decoded (Format not recognised.): re-encode it as wav, flac or ogg"),
        (_empty, "is empty (0 samples): re-record it or drop it"),
        (_too_long, "is 31.0 s, over the 30 s cap: trim or split it, or raise the cap"),
    ],
)
def test_every_bad_file_is_one_line_naming_the_sample_and_the_fix(tmp_path, make, message):
    with pytest.raises(InputError) as caught:
        read_audio(make(tmp_path), "mer-0042")
    text = str(caught.value)
    assert "\n" not in text and text.startswith("sample 'mer-0042': audio ") and message in text, text


def test_the_length_cap_is_configurable(tmp_path):
    soundfile.write(tmp_path / "c.wav", np.zeros(2 * SAMPLING_RATE, dtype=np.float32), SAMPLING_RATE)
    assert read_audio(tmp_path / "c.wav", "s", max_seconds=2.0).size == 2 * SAMPLING_RATE
    with pytest.raises(InputError, match=r"is 2.0 s, over the 1.5 s cap"):
        read_audio(tmp_path / "c.wav", "s", max_seconds=1.5)
    with pytest.raises(InputError, match="cap must be > 0 s, got 0"):
        read_audio(tmp_path / "c.wav", "s", max_seconds=0)


def test_model_limits_never_exceed_the_feature_extractors_window():
    omni = default_feature_extractor()  # 16 kHz, a 300 s window
    assert model_limits(omni) == (16000, MAX_SECONDS)
    assert model_limits(omni, 600.0) == (16000, 300.0)
    assert model_limits(None, 45.0) == (16000, 45.0)  # text-only / unknown: the defaults


# --- manifests ----------------------------------------------------------------------------

def write_manifest(folder, records, name="manifest.jsonl"):
    path = folder / name
    if name.endswith(".json"):
        path.write_text(json.dumps(records, ensure_ascii=False, indent=1), encoding="utf-8")
    else:
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    return path


MER_RECORDS = [
    {"id": "sample_00000001", "audio": "audio/a.wav", "prompt_type": "detailed", "language": "Chinese",
     "reference": "中年男声低沉急促，带着愤怒。", "emotion": "angry"},
    {"id": "sample_00000002", "audio": "audio/b.wav", "prompt_type": "concise", "language": "zh",
     "reference": "女声清脆，充满喜悦。"},
    {"id": "own-prompt", "audio": "audio/a.wav", "prompt": "Describe the voice.", "prompt_type": "concise", "language": "en"},
]


@pytest.mark.parametrize("name", ["manifest.json", "manifest.jsonl"])
def test_mer_style_manifest_as_json_array_or_jsonl(tmp_path, name):
    (tmp_path / "set").mkdir()
    path = write_manifest(tmp_path / "set", MER_RECORDS, name)
    records = load_prompts(str(path))
    assert [r.id for r in records] == ["sample_00000001", "sample_00000002", "own-prompt"]
    first, second, own = records
    assert first.prompt == PROMPT_TYPES["detailed"] == "请用一句中文描述说话人的音色、语速、语调和情绪。"
    assert second.prompt == PROMPT_TYPES["concise"] == "请用一句简短的中文概括说话人的声音特点和情绪。"
    assert own.prompt == "Describe the voice." and own.prompt_type == "concise"  # a given prompt wins
    assert first.audio == (tmp_path / "set" / "audio" / "a.wav").resolve()  # relative to the manifest
    assert first.language == "chinese" and first.reference == "中年男声低沉急促，带着愤怒。"


def test_a_missing_audio_file_fails_its_sample_at_read_time_not_the_manifest(tmp_path):
    path = write_manifest(tmp_path, [{"id": "gone", "audio": "gone.wav", "prompt": "hello"}])
    (record,) = load_prompts(str(path))
    with pytest.raises(InputError, match="sample 'gone': audio gone.wav not found in"):
        read_audio(record.audio, record.id)


@pytest.mark.parametrize(
    "content,message",
    [
        ('{"id": "a"}', "needs a string 'prompt' (or a 'prompt_type': detailed, concise)"),
        ('{"id": "a", "prompt_type": "verbose"}', "has prompt_type 'verbose': use one of detailed, concise"),
        ('{"id": "a", "prompt": "hi", "audio": 3}', "'audio' must be a string, got int"),
        ('{"id": "a", "prompt": "hi", "reference": ["x"]}', "'reference' must be a string, got list"),
        ('{"prompt": "hi"}', "needs a string 'id'"),
        ('{"id": "a", "prompt": "hi"}\n{"id": "a", "prompt_type": "concise"}', "line 2 repeats id 'a'"),
        ('["not", "an", "object"]', "must be a JSON object"),
    ],
)
def test_bad_jsonl_records(tmp_path, content, message):
    (tmp_path / "m.jsonl").write_text(content + "\n", encoding="utf-8")
    with pytest.raises(InputError) as caught:
        load_prompts(str(tmp_path / "m.jsonl"))
    assert message in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize(
    "content,message",
    [
        ('{"id": "a", "prompt": "hi"}', "must be a JSON array of objects, got dict: wrap the records in [ ]"),
        ('[{"id": "a", "prompt": "hi"},', "m.json is not valid JSON"),
        ('[{"id": "a", "prompt": "hi"}, {"id": "b"}]', "m.json item 2 (id 'b') needs a string 'prompt'"),
        ("[]", "has no prompts"),
    ],
)
def test_bad_json_manifests(tmp_path, content, message):
    (tmp_path / "m.json").write_text(content, encoding="utf-8")
    with pytest.raises(InputError) as caught:
        load_prompts(str(tmp_path / "m.json"))
    assert message in str(caught.value), caught.value


def test_shipped_text_sets_still_load_with_their_labels():
    records = load_prompts("zh-describe")
    assert records[0].prompt_type == "detailed" and records[0].prompt.endswith(PROMPT_TYPES["detailed"])


# --- the shipped samples ------------------------------------------------------------------

def test_shipped_samples_are_small_readable_and_described():
    records = load_prompts("audio-samples")
    assert load_prompts(str(SAMPLES_MANIFEST)) == records
    languages = [r.language for r in records]
    assert languages.count("en") == 8 and languages.count("zh") == 4
    meta = {row["id"]: row for row in map(json.loads, SAMPLES_MANIFEST.read_text(encoding="utf-8").splitlines())}
    total_bytes = 0
    for record in records:
        info = soundfile.info(record.audio)
        assert (info.samplerate, info.channels, info.format) == (16000, 1, "FLAC")
        waveform = read_audio(record.audio, record.id)
        seconds = waveform.size / SAMPLING_RATE
        assert 1.0 < seconds < 10.0 and seconds == pytest.approx(meta[record.id]["seconds"], abs=0.01)
        assert np.abs(waveform).max() > 0.05  # speech, not silence
        assert record.reference and record.prompt
        total_bytes += record.audio.stat().st_size
    assert total_bytes < 2 << 20


def test_resampling_a_shipped_clip_round_trips(tmp_path):
    """A 44.1 kHz stereo copy of a shipped clip reads back as (nearly) the 16 kHz original."""
    record = load_prompts("audio-samples")[0]
    original = read_audio(record.audio, record.id)
    upsampled = soxr.resample(original, SAMPLING_RATE, 44100, quality="VHQ")
    soundfile.write(tmp_path / "c.wav", np.stack([upsampled, upsampled], axis=1), 44100, subtype="FLOAT")
    back = read_audio(tmp_path / "c.wav", record.id)
    assert abs(back.size - original.size) <= 1
    n = min(back.size, original.size)
    # speech has little energy near 8 kHz, where the two anti-alias filters cut
    assert np.sqrt(np.mean((back[:n] - original[:n]) ** 2)) < 0.01 * np.sqrt(np.mean(original**2)) + 1e-4
