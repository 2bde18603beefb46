"""Raw result records: one JSON object per (point, prompt), appended as soon as it exists."""
from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import psutil

from specdec.errors import InputError
from specdec.core.text import punctuation_density
from specdec.core.trace import Generation


def result_record(generation: Generation, point: dict, prompt_id: str, latency_s: float, peak_rss_bytes: int) -> dict:
    c = generation.counters
    decode_tokens = max(generation.new_tokens - 1, 0)
    escalated = [cycle for cycle in generation.cycles if cycle.escalated]
    split = point.get("deployment") == "split"
    lengths = [len(cycle.draft_tokens) for cycle in generation.cycles]
    return {
        "id": prompt_id,
        **point,
        # degraded: the cloud was lost and the rest was drafted edge-only (a rerun redoes it)
        "status": "degraded" if generation.degraded else "ok",
        "tokens": generation.tokens,
        "text": generation.text,
        "new_tokens": generation.new_tokens,
        "prompt_tokens": generation.prompt_tokens,
        "latency_s": latency_s,
        "ttft_s": generation.ttft_s,
        # time per output token after the first (TPOT, as in vLLM / MLPerf)
        "tpot_s": (generation.decode_s - generation.ttft_s) / decode_tokens if decode_tokens else None,
        "tokens_per_s": generation.new_tokens / generation.decode_s if generation.decode_s else None,
        "prefill_s": generation.prefill_s,
        "edge_s": generation.edge_s,
        "cloud_s": generation.cloud_s,
        # engine time outside model forwards: sampling, gate, policy, bookkeeping
        "overhead_s": generation.decode_s - generation.edge_s - generation.cloud_s,
        "stopped_by": generation.stopped_by,
        **{key: value for key, value in c.as_dict().items()},
        "punct_density": punctuation_density(generation.text),
        "peak_rss_bytes": peak_rss_bytes,
        # split deployment: measured on the socket and the clock, not modelled
        "wire_up_bytes": sum(c.wire_up_bytes for c in escalated) if split else None,
        "wire_down_bytes": sum(c.wire_down_bytes for c in escalated) if split else None,
        "link_s": generation.link_s if split else None,
        "server_queue_s": sum(c.server_queue_s for c in escalated) if split else None,
        "server_compute_s": generation.cloud_s if split else None,
        "edge_wait_s": sum(c.edge_wait_s for c in escalated) if split else None,
        "block_len_mean": sum(lengths) / len(lengths) if lengths else None,
        "block_len_hist": [lengths.count(n) for n in range(1, max(lengths, default=0) + 1)],  # [i]: blocks of i+1 tokens
        "trace": [asdict(cycle) for cycle in generation.cycles],
        # split runs: the ids the edge sent, so `specbench fleet --edge-replay` can replay this trace
        **({"prompt_ids": generation.prompt_ids} if split else {}),
    }


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
    return records


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


def node_info() -> dict:
    """The machine a record was measured on, so reports can tell a cluster's machines apart."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("model name"):
                cpu = line.partition(":")[2].strip()
                break
    except OSError:  # not Linux
        pass
    return {"hostname": platform.node(), "cpu_model": cpu}


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
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "torch_threads": torch.get_num_threads(),
        "machine": platform.machine(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "memory_bytes": psutil.virtual_memory().total,
        "git_commit": commit,
    }
