"""Prompt files (JSONL) and the shipped prompt sets, validated on load."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from specdec.errors import InputError

SETS_DIR = Path(__file__).parent / "prompts"


@dataclass(frozen=True)
class PromptRecord:
    id: str
    prompt: str
    system: str | None = None
    audio: Path | None = None  # resolved against the prompts file's folder
    reference: str | None = None


def prompt_sets() -> list[str]:
    return sorted(p.stem for p in SETS_DIR.glob("*.jsonl"))


def resolve_prompts(spec: str) -> Path:
    """A shipped set name (`zh-describe`) or a path to a JSONL file."""
    if spec in prompt_sets():
        return SETS_DIR / f"{spec}.jsonl"
    path = Path(spec).expanduser()
    if not path.is_file():
        raise InputError(f"prompts file {spec!r} not found: give a JSONL file or a shipped set ({', '.join(prompt_sets())})")
    return path


def load_prompts(spec: str) -> list[PromptRecord]:
    path = resolve_prompts(spec)
    records: list[PromptRecord] = []
    seen: set[str] = set()
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path.name} line {number}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise InputError(f"{where} is not valid JSON ({e.msg}): write one JSON object per line") from None
        if not isinstance(obj, dict):
            raise InputError(f"{where} must be a JSON object with 'id' and 'prompt'")
        for key in ("id", "prompt"):
            if not isinstance(obj.get(key), str):
                raise InputError(f"{where} needs a string {key!r}: add it")
        if not obj["prompt"].strip():
            raise InputError(f"{where} (id {obj['id']!r}) has an empty prompt: give it some text")
        if obj["id"] in seen:
            raise InputError(f"{where} repeats id {obj['id']!r}: ids must be unique")
        seen.add(obj["id"])
        audio = None
        if obj.get("audio"):
            audio = (path.parent / obj["audio"]).resolve()
            if not audio.is_file():
                raise InputError(f"{where} (id {obj['id']!r}): audio file {obj['audio']!r} not found next to {path.name}")
        records.append(PromptRecord(obj["id"], obj["prompt"], obj.get("system"), audio, obj.get("reference")))
    if not records:
        raise InputError(f"prompts file {path} has no prompts: add JSONL lines with 'id' and 'prompt'")
    return records


def read_audio(record: PromptRecord, sampling_rate: int = 16000):
    """Mono float32 waveform at `sampling_rate`; a clear error naming the sample otherwise."""
    import numpy as np
    import soundfile

    try:
        waveform, rate = soundfile.read(record.audio, dtype="float32", always_2d=True)
    except (RuntimeError, soundfile.LibsndfileError) as e:
        raise InputError(f"sample {record.id!r}: cannot read audio {record.audio.name} ({e}): re-encode it as wav/flac/ogg") from None
    if waveform.size == 0:
        raise InputError(f"sample {record.id!r}: audio {record.audio.name} is empty")
    if rate != sampling_rate:
        raise InputError(
            f"sample {record.id!r}: audio {record.audio.name} is {rate} Hz, the model needs {sampling_rate} Hz: resample it"
        )
    return np.ascontiguousarray(waveform.mean(axis=1))
