"""What a report reads: a results directory written by `specbench sweep` (results.jsonl +
sweep.json) or `specbench run` (results.jsonl + run.json), and a profile of it if one exists.
Reading only: nothing here measures."""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from bench.core.folder import MACHINE_FILE
from bench.core.records import read_records
from bench.derive.scores import read_scores
from bench.derive.summary import summarize
from specdec.errors import InputError

PROFILE_MARKER = "profile.json"  # written by `specbench profile` into its --out folder


@dataclass(frozen=True)
class ReportInputs:
    source: Path  # the results directory
    kind: str  # "sweep" | "run"
    rows: list[dict]  # every record, whatever its status
    summary: pd.DataFrame  # bench.derive.summary.summarize(rows): one row per point, ok records only
    meta: dict  # sweep.json ({config, environment}) or run.json ({point, environment, load_s}); + machine.json as "machine"
    profile: Path | None = None  # a `specbench profile` folder for this run
    statuses: dict = field(default_factory=dict)  # status -> number of records

    @property
    def ok_rows(self) -> list[dict]:
        return [r for r in self.rows if r.get("status", "ok") == "ok"]

    @property
    def problems(self) -> list[dict]:
        """Records that are not ok (failed, over the memory cap), for the report to list."""
        return [r for r in self.rows if r.get("status", "ok") != "ok"]


def load_inputs(results_dir: Path, profile: Path | None = None) -> ReportInputs:
    """Read and summarise a results directory; one-line InputError for anything unusable."""
    results_dir = Path(results_dir)
    if not results_dir.is_dir():
        raise InputError(f"results directory {results_dir} does not exist: pass the --out folder of "
                         "`specbench sweep` or `specbench run`")
    results = results_dir / "results.jsonl"
    if not results.is_file():
        raise InputError(f"{results_dir} has no results.jsonl: pass the --out folder of `specbench sweep` or "
                         "`specbench run`")
    try:
        rows = read_records(results)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InputError(f"{results} is not valid JSON lines ({e}): was it written by specbench?") from None
    if not rows:
        raise InputError(f"{results} is empty: run the sweep (or let it finish) before reporting on it")
    statuses = dict(Counter(r.get("status", "ok") for r in rows))
    if not statuses.get("ok"):
        counts = ", ".join(f"{n} {s}" for s, n in sorted(statuses.items()))
        raise InputError(f"{results} has no successful results ({counts}): see the records' `error` fields")
    kind, meta = _meta(results_dir)
    machine = results_dir / MACHINE_FILE  # the sweep's machine and its calibration's choices, where written
    if machine.is_file():
        try:
            meta = {**meta, "machine": json.loads(machine.read_text(encoding="utf-8"))}
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise InputError(f"{machine} is not valid JSON: restore it or delete it (the report then names no "
                             "calibration)") from None
    return ReportInputs(source=results_dir, kind=kind, rows=rows, summary=summarize(rows, read_scores(results_dir)), meta=meta,
                        profile=find_profile(results_dir, profile), statuses=statuses)


def _meta(results_dir: Path) -> tuple[str, dict]:
    for kind, name in (("sweep", "sweep.json"), ("run", "run.json")):
        path = results_dir / name
        if path.is_file():
            try:
                meta = json.loads(path.read_text(encoding="utf-8"))
            except (json.JSONDecodeError, UnicodeDecodeError) as e:  # bytes flipped on disk are not UTF-8
                why = e.msg if isinstance(e, json.JSONDecodeError) else "not UTF-8"
                raise InputError(f"{path} is not valid JSON ({why}): restore it or delete it") from None
            if not isinstance(meta, dict):
                raise InputError(f"{path} is not a JSON object: restore it or delete it")
            return kind, meta
    return "run", {}


def find_profile(results_dir: Path, explicit: Path | None = None) -> Path | None:
    """A `specbench profile` folder for these results: the one given; RESULTS/profile (a folder or
    a link to one); the profile folder around RESULTS (a profile keeps its run in PROFILE/run); or
    profiles/<results dir name> under the working directory."""
    if explicit is not None:
        if not (Path(explicit) / PROFILE_MARKER).is_file():
            raise InputError(f"{explicit} is not a profile folder (no {PROFILE_MARKER}): pass the --out of "
                             "`specbench profile`")
        return Path(explicit)
    results_dir = Path(results_dir).resolve()
    for candidate in (results_dir / "profile", results_dir.parent, Path("profiles") / results_dir.name):
        if (candidate / PROFILE_MARKER).is_file():
            return candidate
    return None
