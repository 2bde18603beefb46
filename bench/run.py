"""`specbench run`: one configuration over a prompt set, results appended as produced, resumable.

A sample whose input is bad (its audio missing, corrupt, empty or over the length cap, or a prompt
the model cannot encode) is recorded with status `failed` and its error, and the run goes on; at
the end `run` raises `FailedSamples` (an InputError: the CLI prints one line and exits 2). A rerun
of the same command redoes only what is not `ok`, so fixing the file and rerunning completes it.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from tqdm import tqdm

from bench.audio import MAX_SECONDS, SAMPLING_RATE, model_limits, read_audio
from bench.prompts import PromptRecord, load_prompts
from bench.records import ResultsFile, environment, result_record
from bench.trackers import LatencyTracker, PeakMemoryTracker, tracked
from specdec.cloud import CloudLost
from specdec.engine import Engine
from specdec.errors import InputError


def point_of(engine: Engine, prompts: str) -> dict:
    """The settings that identify a result. Spec-only axes are None outside spec mode."""
    spec = engine.spec if engine.mode == "spec" else None
    return {
        "mode": engine.mode,
        "edge": engine.edge if engine.mode != "cloud" else None,
        "cloud": engine.cloud_name if engine.mode != "edge" else None,
        "deployment": "split" if engine.remote_cloud else "inproc",
        "dtype": engine.dtype,
        "policy": spec and spec.policy,
        "k": spec and spec.k,
        "entropy_threshold": spec and spec.entropy_threshold,
        "accept_threshold": spec and spec.accept_threshold,
        "verifier": spec and spec.verifier,
        "uncertainty": spec and spec.uncertainty,
        "punct_trigger": spec and spec.punct_trigger,
        "draft_stop": spec and spec.draft_stop,
        "k_schedule": spec and spec.k_schedule,
        "draft_topn": spec and spec.draft_topn,
        "overlap": engine.deploy.overlap if engine.remote_cloud else None,
        "temperature": engine.decode.temperature,
        "seed": engine.decode.seed,
        "max_new_tokens": engine.decode.max_new_tokens,
        "constraints": engine.constraints,
        "chat_template": engine.chat_template,
        "prompts": prompts,
    }


class FailedSamples(InputError):
    """Some samples of a run failed on bad input; `rows` holds every record this run wrote."""

    def __init__(self, message: str, rows: list[dict]) -> None:
        super().__init__(message)
        self.rows = rows


def run(engine: Engine, prompts: str, out: Path, progress: bool = True, limit: int | None = None,
        max_audio_s: float = MAX_SECONDS) -> list[dict]:
    """Generate for every prompt not already done (`ok`) in `out` for this point; return the new
    records. Raises FailedSamples after the last prompt if any were recorded as failed."""
    records = load_prompts(prompts)[:limit]
    out.mkdir(parents=True, exist_ok=True)
    if engine.remote_cloud:
        engine.load()  # the server says which cloud model it runs: part of this folder's identity
    point = point_of(engine, prompts)
    run_file = out / "run.json"
    if run_file.exists():
        previous = json.loads(run_file.read_text())
        if previous.get("point") != point:
            changed = sorted(k for k in point if previous.get("point", {}).get(k) != point[k])
            raise InputError(
                f"{out} holds results of a different configuration (differs in {', '.join(changed)}): "
                "use another --out, or delete that folder to start over"
            )
    results = ResultsFile(out / "results.jsonl")
    done = {row["id"] for row in results.read() if row.get("status") == "ok"}
    todo = [r for r in records if r.id not in done]
    if not todo:
        return []
    prepare(engine, todo)
    run_file.write_text(json.dumps({"point": point, "environment": environment(), "load_s": engine.load_seconds()},
                                   indent=2, ensure_ascii=False))
    bar = tqdm(total=len(todo), desc=engine.mode, unit="prompt", disable=not progress)
    rows = [generate_one(engine, record, point, results, after=lambda: bar.update(), max_audio_s=max_audio_s)
            for record in todo]
    bar.close()
    failed = [r for r in rows if r["status"] == "failed"]
    if failed:
        raise FailedSamples(
            f"{len(failed)} of {len(rows)} samples failed, e.g. {failed[0]['error']} "
            f"(all recorded as failed in {results.path}; fix them and rerun to redo only those)", rows)
    return rows


def prepare(engine: Engine, records: list[PromptRecord]) -> None:
    """Load the models this point needs and check the prompts fit them, before any generation."""
    engine.load()
    audio = [r.id for r in records if r.audio]
    if audio and not engine.primary.backend.accepts_audio:
        raise InputError(
            f"model {engine.primary.name!r} is text-only but the prompt has audio (e.g. {audio[0]!r}): "
            "use an audio model (a Qwen2.5-Omni thinker) or drop the `audio` field"
        )


def generate_one(engine: Engine, record: PromptRecord, point: dict, results: ResultsFile,
                 after: Callable[[], object] = lambda: None,
                 decorate: Callable[[dict, object], object] = lambda row, generation: None,
                 max_audio_s: float = MAX_SECONDS) -> dict:
    """Generate for one prompt and append its record at once: status `ok`, or `failed` with the
    one-line error when its input is bad (the audio is read here, at the model's rate)."""
    labels = {key: value for key, value in (("reference", record.reference), ("language", record.language))
              if value is not None}
    try:
        waveform, rate = None, SAMPLING_RATE
        if record.audio:
            rate, cap_s = model_limits(engine.primary.feature_extractor, max_audio_s)
            waveform = read_audio(record.audio, record.id, rate, cap_s)
        # Peak memory is not reset here: a run's peak spans its prompts (a sweep worker resets it per generation).
        latency, memory = LatencyTracker(), PeakMemoryTracker(reset=False)
        with tracked(memory, latency):
            generation = engine.generate(record.prompt, record.system, waveform, rate, language=record.language)
    except (InputError, CloudLost) as e:  # this sample alone: record it and go on
        row = {"id": record.id, **point, "status": "failed", "error": str(e), **labels}
        results.append(row)
        after()
        return row
    row = result_record(generation, point, record.id, latency.elapsed_s, memory.peak_rss_bytes)
    row.update(labels)
    decorate(row, generation)
    results.append(row)
    after()
    return row

