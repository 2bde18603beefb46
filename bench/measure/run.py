"""`specbench run`: one configuration over a prompt set, results appended as produced, resumable.

A sample whose input is bad (its audio missing, corrupt, empty or over the length cap, or a prompt
the model cannot encode) is recorded with status `failed` and its error, and the run goes on; at
the end `run` raises `FailedSamples` (an InputError: the CLI prints one line and exits 2). A rerun
of the same command redoes only what is not `ok`, so fixing the file and rerunning completes it.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from tqdm import tqdm

from bench.core.audio import MAX_SECONDS, SAMPLING_RATE, model_limits, read_audio
from bench.core.folder import IDENTITY_FILES, claim, has_results, write_identity, writer
from bench.core.point import Point
from bench.core.prompts import PromptInputs, PromptRecord, Turns, load_prompts
from bench.core.records import ResultsFile, environment, node_info, result_record
from bench.measure.trackers import LatencyTracker, PeakMemoryTracker, tracked
from specdec.core.verdict import CloudLost
from specdec.engine import Engine
from specdec.errors import InputError
from specdec.settings import CudaGraphs, ExtraBuffers, KVCache, Mode


class FailedSamples(InputError):
    """Some samples of a run failed on bad input; `rows` holds every record this run wrote."""

    def __init__(self, message: str, rows: list[dict]) -> None:
        super().__init__(message)
        self.rows = rows


def run(engine: Engine, prompts: str, out: Path, progress: bool = True, limit: int | None = None,
        max_audio_s: float = MAX_SECONDS, turns: Turns = Turns.ALL) -> list[dict]:
    """Generate for every prompt not already done (`ok`) in `out` for this point; return the new
    records. Raises FailedSamples after the last prompt if any were recorded as failed.

    Everything is checked before the folder is touched (settings, prompts) and before a model loads
    (the folder's lock and identity, bench/core/folder.py); the folder's run.json is written once the
    models are loaded and the point they give is known."""
    inputs = PromptInputs(prompts, limit, max_audio_s, turns)  # validated (a word given for `turns` parsed)
    records = load_prompts(prompts)[:limit]
    asked = Point.of(engine, prompts, turns=inputs.turns).record()  # before the models load: as asked
    with writer(out):
        claim(out, "run", asked, before=before(asked))
        return _run(engine, prompts, records, asked, out, progress, max_audio_s, inputs.turns)


def before(point: dict) -> dict:
    """Point fields added since a run folder was first written, at the value that reproduces it (llama.cpp ran
    with its extra buffers then: asked auto or on, or used on, matches; off does not)."""
    extra_buffers = point.get("llamacpp_extra_buffers")
    mode = point.get("mode")
    return {"drafter": "model" if mode == Mode.SPEC else None, "turns": Turns.ALL,
            "llamacpp_extra_buffers": extra_buffers if extra_buffers in (None, ExtraBuffers.AUTO, ExtraBuffers.ON)
            else ExtraBuffers.ON,
            "edge_device": None if mode == Mode.CLOUD else "cpu", "cloud_device": None if mode == Mode.EDGE else "cpu",
            "kv_cache": KVCache.AUTO, "cuda_graphs": CudaGraphs.ON, "drafter_options": "" if mode == Mode.SPEC else None}


def _run(engine: Engine, prompts: str, records: list[PromptRecord], asked: dict, out: Path, progress: bool,
         max_audio_s: float, turns: Turns) -> list[dict]:
    results = ResultsFile(out / "results.jsonl")
    done = {row["id"] for row in results.read() if row.get("status") == "ok"}
    todo = [r for r in records if r.id not in done]
    if not todo:
        return []
    prepare(engine, todo)
    point = Point.of(engine, prompts, turns=turns).record()  # as used: the server's model, the chat template really applied
    claim(out, "run", point, key="point", before=before(point))  # e.g. the server at --cloud-url now runs another model
    if not (has_results(out) and (out / IDENTITY_FILES["run"]).is_file()):  # a resume keeps the first
        write_identity(out, "run", {"config": asked, "point": point, "environment": environment(),
                                    "load_s": engine.load_seconds()})
    with tqdm(total=len(todo), desc=engine.mode, unit="prompt", disable=not progress) as bar:  # closed on errors too
        measured_on = {**point, "node": node_info()}  # beside the point, as a sweep's records: not part of its identity
        rows = [generate_one(engine, record, measured_on, results, after=lambda: bar.update(), max_audio_s=max_audio_s)
                for record in todo]
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


def audio_of(engine: Engine, record: PromptRecord, max_audio_s: float):
    """(waveform, rate) of the prompt's audio read at the model's rate, or (None, 16 kHz) without one."""
    if not record.audio:
        return None, SAMPLING_RATE
    rate, cap_s = model_limits(engine.primary.feature_extractor, max_audio_s)
    return read_audio(record.audio, record.id, rate, cap_s), rate


def warm_up(engine: Engine, record: PromptRecord, max_audio_s: float = MAX_SECONDS) -> float:
    """One untimed generation, then the engine forgets it. A process's first forward on a model pays
    one-time costs (oneDNN kernel selection, allocator growth, llama.cpp's graph) that are not the
    model's speed: on 2026-11-24 the first bf16 cloud-only generation of a sweep (one core) prefilled
    a 51-token prompt in 5.84 s, the next one 48 tokens in 1.19 s, and inflated that baseline's time 27 %.
    Returns its wall seconds (the sweep records them as `warm_up_s` on the generation that follows)."""
    start = time.perf_counter()
    try:
        waveform, rate = audio_of(engine, record, max_audio_s)
        engine.generate(record.prompt, record.system, waveform, rate, language=record.language)
    except (InputError, CloudLost):
        pass  # the timed generation meets the same problem and records it
    engine.forget_history()
    return time.perf_counter() - start


def generate_one(engine: Engine, record: PromptRecord, point: dict, results: ResultsFile,
                 after: Callable[[], object] = lambda: None,
                 decorate: Callable[[dict, object], object] = lambda row, generation: None,
                 max_audio_s: float = MAX_SECONDS) -> dict:
    """Generate for one prompt and append its record at once: status `ok`, or `failed` with the
    one-line error when its input is bad (the audio is read here, at the model's rate)."""
    labels = {key: value for key, value in (("reference", record.reference), ("language", record.language))
              if value is not None}
    try:
        waveform, rate = audio_of(engine, record, max_audio_s)
        # Peak memory is not reset here: a run's peak spans its prompts (a sweep worker resets it per generation).
        latency, memory = LatencyTracker(), PeakMemoryTracker(reset=False)
        with tracked(memory, latency):
            generation = engine.generate(record.prompt, record.system, waveform, rate, language=record.language,
                                         follow_ups=record.turns[1:] if point.get("turns") != Turns.FIRST else ())
    except (InputError, CloudLost) as e:  # this sample alone: record it and go on
        row = {"id": record.id, **point, "status": "failed", "error": str(e), **labels}
        results.append(row)
        after()
        return row
    row = result_record(generation, point, record.id, latency.elapsed_s, memory.peak_rss_bytes, memory.gpu)
    row.update(labels)
    decorate(row, generation)
    results.append(row)
    after()
    return row

