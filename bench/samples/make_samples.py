"""Make the shipped audio samples: short sentences spoken by espeak-ng, 16 kHz mono FLAC, and
manifest.jsonl beside them with the spoken text as each sample's `reference`.

    apt-get install -y espeak-ng          # Debian; made with eSpeak NG 1.51
    .venv/bin/python bench/samples/make_samples.py

espeak-ng writes 22,050 Hz 16-bit WAV to stdout; it is resampled to 16 kHz with soxr (VHQ) and
stored as 16-bit FLAC (lossless, about half the size of WAV). Rerunning rewrites every file; the
output is deterministic for one espeak-ng version. The voices are synthetic, so these clips test
the plumbing (reading, resampling, audio reaching both models, WER/CER) rather than the accuracy
of a real speech model on real speech.
"""
from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import soundfile
import soxr

HERE = Path(__file__).resolve().parent
SAMPLING_RATE = 16000  # Hz, what bench.core.audio.read_audio delivers to the models
PROMPTS = {
    "en": "Transcribe the speech in this audio clip exactly.",
    "zh": "请把这段语音逐字转写成中文。",
}


@dataclass(frozen=True)
class Sample:
    id: str
    language: str  # key of PROMPTS
    voice: str  # espeak-ng voice[+variant]
    words_per_minute: int  # espeak-ng -s (its default is 175)
    text: str


SAMPLES = (
    Sample("en-01", "en", "en-us", 165, "The quick brown fox jumps over the lazy dog."),
    Sample("en-02", "en", "en-us+f3", 160, "Please turn off the lights before you leave the room."),
    Sample("en-03", "en", "en-us", 150, "The meeting has been moved to three o'clock on Thursday."),
    Sample("en-04", "en", "en-us+m3", 170, "She sells fresh bread at the market every morning."),
    Sample("en-05", "en", "en-us+f2", 165, "Rain is expected tonight, so bring an umbrella."),
    Sample("en-06", "en", "en-us", 185, "Our train was late again because of the snow."),
    Sample("en-07", "en", "en-us+f4", 155, "Can you tell me the way to the nearest library?"),
    Sample("en-08", "en", "en-us+m2", 130, "He spoke slowly and calmly, but his hands were shaking."),
    Sample("zh-01", "zh", "cmn", 150, "今天天气很好，我们去公园散步吧。"),
    Sample("zh-02", "zh", "cmn", 160, "请在会议开始之前把报告发给我。"),
    Sample("zh-03", "zh", "cmn+f3", 130, "他说话的声音很低，听起来有点累。"),
    Sample("zh-04", "zh", "cmn+m3", 170, "这家餐厅的饺子非常好吃。"),
)


def speak(sample: Sample, out: Path) -> float:
    """Write `sample` spoken to `out` (16 kHz mono 16-bit FLAC); returns its length in seconds."""
    wav = subprocess.run(
        ["espeak-ng", "-v", sample.voice, "-s", str(sample.words_per_minute), "--stdout", sample.text],
        check=True, capture_output=True,
    ).stdout
    waveform, rate = soundfile.read(io.BytesIO(wav), dtype="float32", always_2d=True)  # [frames, channels]
    mono = soxr.resample(waveform.mean(axis=1), rate, SAMPLING_RATE, quality="VHQ")
    soundfile.write(out, mono, SAMPLING_RATE, subtype="PCM_16", format="FLAC")
    return len(mono) / SAMPLING_RATE


def main() -> int:
    if shutil.which("espeak-ng") is None:
        print("espeak-ng not found: apt-get install -y espeak-ng", file=sys.stderr)
        return 1
    lines = []
    for sample in SAMPLES:
        audio = f"{sample.id}.flac"
        seconds = speak(sample, HERE / audio)
        lines.append({
            "id": sample.id, "audio": audio, "prompt": PROMPTS[sample.language], "language": sample.language,
            "reference": sample.text, "voice": sample.voice, "seconds": round(seconds, 2),
        })
        print(f"{audio}: {seconds:.2f} s, {(HERE / audio).stat().st_size / 1024:.0f} KiB")
    (HERE / "manifest.jsonl").write_text("".join(json.dumps(x, ensure_ascii=False) + "\n" for x in lines), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
