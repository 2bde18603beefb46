"""DIR/nll.jsonl: the cloud NLL of each output (written by `specbench score`, bench/measure/nll.py), one
record per (point, prompt), read by the summary and the report. Reading it loads no model."""
from __future__ import annotations

from pathlib import Path

from bench.core.point import Point
from bench.core.records import read_records

SCORES = "nll.jsonl"
SCORE_FIELDS = ("key", "id")  # every score record has them


def score_key(row: dict) -> str:
    """Which (point, prompt) a score belongs to (the point's key with the prompt's id)."""
    return Point.from_row(row).key(id=row["id"])


def read_scores(out: Path) -> dict[str, float]:
    """score_key -> NLL, for the summary (empty when the folder was never scored). Read only: a
    last line still being written is skipped, never cut (reports read while `score` appends)."""
    path = Path(out) / SCORES
    if not path.is_file():
        return {}
    return {r["key"]: r["cloud_nll"] for r in read_records(path, SCORE_FIELDS) if r.get("cloud_nll") is not None}
