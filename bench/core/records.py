"""Raw result records: one JSON object per (point, prompt), appended as soon as it exists.

`ResultRecord` is what a generation's record holds, field by field; `result_record` builds one and
returns it as the JSON object results.jsonl has always had (its keys in the class's order). Readers
read those objects back as dicts (`parse_records`), old folders included.
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import psutil

from bench.core.point import AXES, Deployment
from specdec.core.text import punctuation_density
from specdec.core.trace import Generation
from specdec.errors import InputError
from specdec.machine import fingerprint


@dataclass(frozen=True)
class ResultRecord:
    """One generation's line of results.jsonl, written flat by `as_dict`: `id`, the point's fields, then the
    rest in this order. None: does not apply (the split-only fields outside split deployment, a rate with
    nothing to divide by)."""

    id: str  # the prompt's id in its set
    point: dict  # the point's fields (bench/core/point.py's Point.record) and what the caller records beside them
    # (a sweep's network, cores, repeat, warm_up_s; a sweep's and a run's `node`, a `Node`): written flat after
    # `id`, not under this name
    status: str  # ok, or degraded: the cloud was lost and the rest was drafted edge-only (a rerun redoes it)
    # Records with no generation carry `id`, the point's fields, `status` and `error` only: failed (a bad
    # sample, a lost cloud, a point that crashed twice; done, not rerun), over_memory_cap, or crashed (a sweep
    # worker died of a signal in this generation; its sweep writes it and retries). Only ok rows are measurements.
    tokens: list[int]  # the new token ids, prompt excluded
    text: str  # the tokens decoded
    new_tokens: int  # len(tokens)
    prompt_tokens: int  # the prompt's length as encoded
    latency_s: float  # the whole generation, as the caller's tracker timed it
    ttft_s: float  # start -> first emitted token
    tpot_s: float | None  # time per output token after the first (TPOT, as in vLLM / MLPerf); None: < 2 tokens
    tokens_per_s: float | None  # new tokens over decode time; None: no decode time
    prefill_s: float  # the first forward of the edge (or of the mode's model): prompt + first step
    edge_s: float  # edge compute inside forwards, prefill included
    cloud_s: float  # cloud compute inside forwards (split: the server's), its prefill included
    overhead_s: float  # engine time outside model forwards: sampling, gate, policy, bookkeeping
    stopped_by: str  # max_new_tokens or stop_token
    # specdec/core/trace.py's Counters (Counters.as_dict), vLLM's spec-decode metrics
    cycles: int  # blocks drafted (plain decoding: tokens generated, one step each)
    cloud_calls: int  # blocks escalated to the cloud
    num_drafts: int  # blocks verified (= cloud_calls)
    num_draft_tokens: int  # draft tokens verified
    num_accepted_tokens: int  # verified draft tokens accepted
    accepted_per_position: list[int]  # [i]: verified blocks whose position i was accepted
    unverified_tokens: int  # draft tokens kept without a verify (the block was not escalated)
    corrections: int  # tokens the cloud put in place of a rejected draft token
    bonus_tokens: int  # tokens the cloud added after a fully accepted block
    overlap_kept_tokens: int  # drafted ahead during a verify and kept as the next block's
    overlap_wasted_tokens: int  # drafted ahead and dropped (a rejection, or a bonus other than the guess)
    acceptance_rate: float | None  # num_accepted_tokens / num_draft_tokens; None: nothing verified
    punct_density: float  # punctuation characters / non-whitespace characters of text
    peak_rss_bytes: int  # the process's peak resident memory (a run's spans its earlier prompts; a sweep's, this one)
    # split deployment only, None elsewhere: measured on the socket and the clock, not modelled
    wire_up_bytes: int | None  # bytes the edge sent for its verifies
    wire_down_bytes: int | None  # bytes of the verdicts it got back
    link_s: float | None  # seconds waited on the link itself: the waits minus the server's queue and compute
    server_queue_s: float | None  # seconds the verifies queued on the server
    server_compute_s: float | None  # seconds the server computed (= cloud_s)
    edge_wait_s: float | None  # overlap: seconds the edge idled after drafting ahead, waiting for a verdict
    block_len_mean: float | None  # mean drafted block length; None: no blocks
    block_len_hist: list[int]  # [i]: blocks of i + 1 tokens
    trace: list[dict]  # per cycle, specdec/core/trace.py's Cycle as a dict
    prompt_ids: list[int] | None = None  # split runs only (else left out): the ids the edge sent, so
    # `specbench fleet --edge-replay` can replay this trace
    peak_gpu_allocated_bytes: int | None = None  # where this process used CUDA (else left out): the most bytes
    # torch held in tensors on its GPUs (torch.cuda.max_memory_allocated, summed over devices), beside peak_rss_bytes
    peak_gpu_reserved_bytes: int | None = None  # ... and the most its caching allocator reserved (max_memory_reserved)

    @classmethod
    def of(cls, generation: Generation, point: dict, prompt_id: str, latency_s: float,
           peak_rss_bytes: int, gpu: dict[str, int] | None = None) -> ResultRecord:
        decode_tokens = max(generation.new_tokens - 1, 0)
        escalated = [cycle for cycle in generation.cycles if cycle.escalated]
        split = point.get("deployment") == Deployment.SPLIT
        lengths = [len(cycle.draft_tokens) for cycle in generation.cycles]
        peaks: dict[str, Any] = gpu or {}  # its peak_gpu_* fields (mypy matches a ** dict against every field)
        return cls(
            id=prompt_id,
            point=point,
            status="degraded" if generation.degraded else "ok",
            tokens=generation.tokens,
            text=generation.text,
            new_tokens=generation.new_tokens,
            prompt_tokens=generation.prompt_tokens,
            latency_s=latency_s,
            ttft_s=generation.ttft_s,
            tpot_s=(generation.decode_s - generation.ttft_s) / decode_tokens if decode_tokens else None,
            tokens_per_s=generation.new_tokens / generation.decode_s if generation.decode_s else None,
            prefill_s=generation.prefill_s,
            edge_s=generation.edge_s,
            cloud_s=generation.cloud_s,
            overhead_s=generation.decode_s - generation.edge_s - generation.cloud_s,
            stopped_by=generation.stopped_by,
            **generation.counters.as_dict(),  # a counter added there and not here is a TypeError, not a silent key
            punct_density=punctuation_density(generation.text),
            peak_rss_bytes=peak_rss_bytes,
            wire_up_bytes=sum(c.wire_up_bytes for c in escalated) if split else None,
            wire_down_bytes=sum(c.wire_down_bytes for c in escalated) if split else None,
            link_s=generation.link_s if split else None,
            server_queue_s=sum(c.server_queue_s for c in escalated) if split else None,
            server_compute_s=generation.cloud_s if split else None,
            edge_wait_s=sum(c.edge_wait_s for c in escalated) if split else None,
            block_len_mean=sum(lengths) / len(lengths) if lengths else None,
            block_len_hist=[lengths.count(n) for n in range(1, max(lengths, default=0) + 1)],
            trace=[asdict(cycle) for cycle in generation.cycles],
            prompt_ids=generation.prompt_ids if split else None,
            **peaks,
        )

    def as_dict(self) -> dict:
        """The JSON object results.jsonl holds: `id`, the point's fields, every other field in order,
        `prompt_ids` only when set (a key of the point's that a field also has takes the field's value)."""
        optional = ("prompt_ids", "peak_gpu_allocated_bytes", "peak_gpu_reserved_bytes")  # left out where None
        named = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("id", "point", *optional)}
        given = {name: getattr(self, name) for name in optional if getattr(self, name) is not None}
        return {"id": self.id, **self.point, **named, **given}


def result_record(generation: Generation, point: dict, prompt_id: str, latency_s: float, peak_rss_bytes: int,
                  gpu: dict[str, int] | None = None) -> dict:
    """The record of one generation of `point` (its fields and the caller's, as a dict) on prompt `prompt_id`;
    `gpu`: its peak GPU memory where it used CUDA (PeakMemoryTracker.gpu)."""
    return ResultRecord.of(generation, point, prompt_id, latency_s, peak_rss_bytes, gpu).as_dict()


RESULT_FIELDS = ("id", "mode")  # every result record has them, whatever its status


def parse_records(data: bytes, path: Path, required: tuple[str, ...] = RESULT_FIELDS) -> list[dict]:
    """The records in the complete lines of `data` (the contents of `path`). A line that is not a
    JSON object with the `required` fields means the file was damaged or is not ours: one
    InputError naming the file and the line, never a traceback from deeper down."""
    records = []
    for number, line in enumerate(data.split(b"\n"), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            why = e.msg if isinstance(e, json.JSONDecodeError) else "not UTF-8"
            raise InputError(f"{path} line {number} is not a JSON record ({why}): the file is damaged; restore it, "
                             "or delete that line (a run or sweep then redoes it)") from None
        if not isinstance(record, dict) or (missing := [k for k in required if k not in record]):
            what = f"has no {missing[0]!r} field" if isinstance(record, dict) else "is not a JSON object"
            raise InputError(f"{path} line {number} {what}: not a record specbench wrote; restore the file, "
                             "or delete that line")
        records.append(record)
    if required == RESULT_FIELDS:
        _one_row_each(records, [n for n, line in enumerate(data.split(b"\n"), start=1) if line.strip()], path)
    return records


ROW = ("id", "repeat", *AXES)  # one result row: a prompt's repeat at one point
FIXED = ("max_new_tokens", "temperature", "seed", "turns")  # the same for every row of a folder


def _one_row_each(records: list[dict], numbers: list[int], path: Path) -> None:
    """A line pasted twice or from another folder would be read as one more measurement, silently:
    a row measured ok twice, or a row with other fixed settings than the first, is damage."""
    if any("client" in record for record in records):  # a fleet's: one row per request, a prompt replayed many times
        return
    seen: dict[tuple, int] = {}
    first = records[0] if records else {}
    for record, number in zip(records, numbers):
        # Only where both say (a record without the field is another problem, named by its reader).
        if (other := next((n for n in FIXED if n in record and n in first and record[n] != first[n]), None)) is not None:
            raise InputError(f"{path} line {number} has {other} {record.get(other)!r}, line {numbers[0]} "
                             f"{first.get(other)!r}: a line from another folder; restore the file, or delete that line")
        if record.get("status", "ok") != "ok":
            continue
        row = tuple(json.dumps(record.get(n), sort_keys=True) for n in ROW)
        if row in seen:
            raise InputError(f"{path} line {number} measures again the row of line {seen[row]} (id "
                             f"{record['id']!r}): a line pasted twice or from another folder; restore the file, "
                             "or delete one of them")
        seen[row] = number


def read_records(path: Path, required: tuple[str, ...] = RESULT_FIELDS) -> list[dict]:
    """The complete records of a JSONL file, read only: a last line still being written (no
    newline yet) is skipped, never cut off the file as `ResultsFile.read` does for a resume,
    since a sweep may be appending to it while we read. Every reader (resume, compare, score,
    report) parses with `parse_records`, so a damaged file reads the same everywhere."""
    data = Path(path).read_bytes()
    return parse_records(data[: data.rfind(b"\n") + 1], Path(path), required)


class ResultsFile:
    """DIR/results.jsonl (or nll.jsonl): appended and flushed per record, so a crash loses nothing
    written. Only the folder's one writer (bench/core/folder.py) may cut a torn line off it."""

    def __init__(self, path: Path, required: tuple[str, ...] = RESULT_FIELDS) -> None:
        self.path = path
        self.required = required

    def read(self) -> list[dict]:
        """The complete records. A last line torn by a kill mid-write is cut off the file, so the
        next append starts on a fresh line and that record is simply redone."""
        if not self.path.exists():
            return []
        data = self.path.read_bytes()
        if data and not data.endswith(b"\n"):
            data = data[: data.rfind(b"\n") + 1]
            with self.path.open("r+b") as f:
                f.truncate(len(data))
        return parse_records(data, self.path, self.required)

    def append(self, record: dict) -> None:
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
            f.flush()
            os.fsync(f.fileno())


@dataclass(frozen=True)
class Node:
    """A record's `node` (every sweep and run record): the machine it was measured on, so reports can tell a
    cluster's machines apart and compare and the gate judge timings only within one machine class."""

    hostname: str
    cpu_model: str  # /proc/cpuinfo's model name (a cloud VM's may say only "Intel(R) Xeon(R) Processor")
    machine_class: str  # specdec/machine.py's fingerprint hash: CPU model, cores, kernel features, GPU
    kernel_features: list[str]  # the instruction-set features that pick kernels (AVX-512, VNNI, AMX, ...)


def node_info() -> dict:
    """This machine as a record's `node` field (`Node`, as a dict)."""
    found = fingerprint()
    return asdict(Node(platform.node(), found["cpu_model"], found["machine_class"], found["kernel_features"]))


def environment() -> dict:
    import torch
    import transformers

    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).parent, timeout=5
        ).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        commit = None
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "torch_threads": torch.get_num_threads(),
        "machine": platform.machine(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "memory_bytes": psutil.virtual_memory().total,
        "git_commit": commit,
        "fingerprint": fingerprint(),  # specdec/machine.py: compare and the gate judge timings within its class
    }
