"""`specbench compare BASELINE CURRENT`: what moved between two measurements, and the gate's verdict.

Each side is a results directory (a `specbench run` or `sweep` folder with results.jsonl; its
per-point summary comes from bench.derive.summary) or a gate JSON (`specbench gate --save` or a
baseline). Writes `compare.html` and `compare.png` (per-metric relative change per point; green
better, red worse) to --out. Reads results only; it never measures.

Verdict, with the gate's rules (bench/derive/gate_verdict.py): token hashes exact; deterministic rates within
`rate_abs`; same-run ratios judged on their repeats (gate files) or, for results directories, a
speed-up fails when the upper end of its 95 % interval over prompts (summary.csv's `_ci_high`)
is below baseline * (1 - timing_margin); absolute speeds and latencies are shown but never gated.
Results directories take the tiny suite's tolerance for fp32 points and the real suite's for bf16
points. Their speed-ups come from a sweep's runs, not from the gate's interleaved repeats: with
one prompt (no interval) or on tiny models, whose passes take milliseconds, they can flap. Timings
are judged only between two measurements of one machine class (a folder's identity records its
fingerprint, its records their node's class; older ones record none, an "unknown machine"): across
machines they are shown, not judged, and the comparison opens with a line naming both machines.
"""
from __future__ import annotations

import hashlib
import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import TypeGuard

from bench.core.folder import IDENTITY_FILES, read_identity
from bench.core.metric_registry import compared, direction
from bench.core.point import Point
from bench.core.records import read_records
from bench.derive.gate_verdict import (
    NOT_JUDGED,
    TOLERANCES,
    Check,
    Suite,
    machine_of,
    other_machine,
    read_gate_file,
    show_value,
    verdict,
)
from bench.derive.gate_verdict import compare as gate_compare
from bench.derive.summary import summarize
from bench.read.report import page
from bench.read.report.fonts import subplots
from specdec.errors import InputError

DTYPE_SUITE = {"float32": Suite.TINY, "bfloat16": Suite.REAL}


@dataclass(frozen=True)
class Row:
    point: str
    metric: str
    baseline: object
    current: object
    direction: str | None  # "higher" | "lower" | None (neutral)
    gated: bool
    ok: bool
    rule: str

    @property
    def relative_change(self) -> float | None:
        if not (_number(self.baseline) and _number(self.current)) or self.baseline == self.current:
            return 0.0 if self.baseline == self.current and _number(self.baseline) else None
        return (self.current - self.baseline) / abs(self.baseline) if self.baseline else math.copysign(math.inf, self.current)

    @property
    def better(self) -> bool | None:
        change = self.relative_change
        if not change or self.direction is None:
            return None
        return (change > 0) == (self.direction == "higher")


def _number(value) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


# --- reading either kind of input ------------------------------------------------------------
def is_gate_file(path: Path) -> bool:
    return path.is_file() and path.suffix == ".json"


def read_results_dir(path: Path):
    results = path / "results.jsonl"
    if not results.is_file():
        raise InputError(f"{path} has no results.jsonl: give a `specbench run`/`sweep` folder or a gate JSON file")
    rows = read_records(results)
    summary = summarize(rows)
    if summary.empty:
        raise InputError(f"{results} has no successful results to compare")
    return summary, rows


def _point_hashes(rows: list[dict]) -> dict[str, str]:
    """Per point: sha256 of its token ids ordered by prompt id (as the gate hashes per mode)."""
    by_point: dict[str, dict] = {}
    for row in rows:
        if row.get("status", "ok") == "ok":
            key = Point.from_row(row).label()
            by_point.setdefault(key, {})[row["id"]] = row["tokens"]
    return {key: hashlib.sha256(json.dumps([ids[i] for i in sorted(ids)]).encode()).hexdigest()
            for key, ids in by_point.items()}


def folder_machine(path: Path, rows: list[dict] | None = None) -> dict | None:
    """The machine a results folder was measured on: its identity's environment fingerprint, else the
    class its records' `node` names; None for a folder older than fingerprints."""
    for name in IDENTITY_FILES.values():
        if (path / name).is_file():
            try:
                if found := machine_of(read_identity(path / name)):
                    return found
            except InputError:
                pass  # a damaged identity says nothing about the machine; the records may
    for row in rows if rows is not None else read_records(path / "results.jsonl"):
        node = row.get("node")
        if isinstance(node, dict) and isinstance(node.get("machine_class"), str):
            return {key: node.get(key) for key in ("cpu_model", "kernel_features", "machine_class")}
    return None


def machines(base: Path, current: Path) -> tuple[dict | None, dict | None]:
    """The machines of two results folders or two gate files (None: unknown)."""
    if is_gate_file(base) and is_gate_file(current):
        return machine_of(read_gate_file(base)), machine_of(read_gate_file(current))
    return folder_machine(base), folder_machine(current)


def machine_note(base: Path, current: Path) -> str | None:
    """The comparison's first line when its two sides come from different machines, else None."""
    if other := other_machine(*machines(base, current), current_is="current from"):
        return f"note: measured on different machines: {other}; timings are shown, not judged"
    return None


def compare_results(base_dir: Path, current_dir: Path) -> list[Row]:
    (base, base_rows), (now, now_rows) = read_results_dir(base_dir), read_results_dir(current_dir)
    other = other_machine(folder_machine(base_dir, base_rows), folder_machine(current_dir, now_rows))
    base_points = {Point.from_row(r).label(): r for r in base.to_dict("records")}
    now_points = {Point.from_row(r).label(): r for r in now.to_dict("records")}
    common = [p for p in base_points if p in now_points]
    if not common:
        raise InputError(f"{base_dir} and {current_dir} share no point (mode, dtype, prompts, k, ...): nothing to compare")
    base_hash, now_hash = _point_hashes(base_rows), _point_hashes(now_rows)
    rows = []
    for label in common:
        b, c = base_points[label], now_points[label]
        tolerance = TOLERANCES[DTYPE_SUITE.get(b["dtype"], Suite.REAL)]
        rows.append(Row(label, "tokens_sha256", base_hash.get(label), now_hash.get(label), None, True,
                        base_hash.get(label) == now_hash.get(label), "exact"))
        for judged in compared():  # bench/core/metric_registry.py: which way is better, how it is judged
            metric, better, rule = judged.name, judged.direction, judged.compared
            bv, cv = _clean(b.get(metric)), _clean(c.get(metric))
            if bv is None and cv is None:
                continue  # not defined at this point (e.g. acceptance of cloud mode)
            if rule == "deterministic":
                ok = _number(bv) and _number(cv) and abs(cv - bv) <= tolerance.rate_abs
                rows.append(Row(label, metric, bv, cv, better, True, ok, f"±{tolerance.rate_abs:g}"))
            elif rule == "timing" and other:
                rows.append(Row(label, metric, bv, cv, better, False, True, NOT_JUDGED))
            elif rule == "timing":
                high = _clean(c.get(f"{metric}_ci_high"))
                high = high if _number(high) else cv  # no interval (one prompt): the estimate itself
                floor = 1 - tolerance.timing_margin
                ok = _number(bv) and _number(cv) and high >= bv * floor
                rows.append(Row(label, metric, bv, cv, better, True, ok, f"95 % interval reaches >= {floor:.0%} of baseline"))
            else:
                rows.append(Row(label, metric, bv, cv, better, False, True, "shown, not gated"))
    return rows


def _clean(value):
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return value.item() if hasattr(value, "item") else value


def compare_gate_files(base_path: Path, current_path: Path) -> list[Row]:
    base, now = read_gate_file(base_path), read_gate_file(current_path)
    if base["suite"] != now["suite"]:
        raise InputError(f"{base_path} is a {base['suite']!r} gate run and {current_path} a {now['suite']!r} one: "
                         "compare like with like")
    suite = base["suite"]
    rows = [_row_from_check(suite, check) for check in gate_compare(base, now, TOLERANCES[suite])]
    for mode in base.get("tokens_per_s", {}):
        bv, cv = (_median(r.get("tokens_per_s", {}).get(mode)) for r in (base, now))
        if bv is not None or cv is not None:
            rows.append(Row(suite, f"{mode}.tokens_per_s", bv, cv, direction("tokens_per_s"), False, True, "shown, not gated"))
    return rows


def _median(values) -> float | None:
    return statistics.median(values) if values else None


def _row_from_check(suite: str, check: Check) -> Row:
    return Row(suite, check.metric, check.baseline, check.current, check.direction, check.judged, check.ok, check.rule)


def compare_paths(base: Path, current: Path) -> list[Row]:
    for path in (base, current):
        if not path.exists():
            raise InputError(f"{path} does not exist: give a results directory or a gate JSON file")
    if is_gate_file(base) and is_gate_file(current):
        return compare_gate_files(base, current)
    if base.is_dir() and current.is_dir():
        return compare_results(base, current)
    raise InputError(f"cannot compare {base} with {current}: give two results directories or two gate JSON files")


# --- writing ---------------------------------------------------------------------------------
def plot(rows: list[Row], path: Path) -> None:
    """One panel per point: horizontal bars of relative change (%), green better, red worse."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    numeric = [r for r in rows if r.relative_change is not None]
    points = list(dict.fromkeys(r.point for r in numeric)) or ["(no numeric metric)"]
    heights = [max(1, sum(r.point == p for r in numeric)) for p in points]
    fig, axes = subplots(len(points), 1, figsize=(9, 1.2 + 0.28 * sum(heights) + 0.6 * len(points)),
                             gridspec_kw={"height_ratios": heights}, squeeze=False)
    for ax, point in zip(axes[:, 0], points):
        mine = [r for r in numeric if r.point == point]
        # clip: inf and huge jumps (every row of `numeric` has a change)
        changes = [max(-200.0, min(200.0, 100 * c)) for r in mine if (c := r.relative_change) is not None]
        colors = ["tab:green" if r.better else "tab:red" if r.better is False else "tab:gray" for r in mine]
        labels = [r.metric + ("" if r.ok else "  (FAIL)") for r in mine]
        ax.barh(range(len(mine)), changes, color=colors)
        ax.set_yticks(range(len(mine)), labels, fontsize=8)
        ax.invert_yaxis()
        ax.axvline(0, color="black", linewidth=0.8)
        ax.set_title(point, fontsize=9, loc="left")
        ax.set_xlabel("relative change vs baseline (%)", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


CHANGE_COLORS = {True: "#1a7f37", False: "#cf222e", None: "#57606a"}  # better, worse, neutral


def write_html(rows: list[Row], base: Path, current: Path, verdict_line: str, passed: bool, path: Path,
               note: str | None = None) -> None:
    """compare.html through the report's jinja2 templates (autoescaped); `note`: the machines line."""
    shown = [{"point": r.point, "metric": r.metric, "baseline": show_value(r.baseline), "current": show_value(r.current),
              "change": "" if r.relative_change is None else f"{100 * r.relative_change:+.2f}%",
              "color": CHANGE_COLORS[r.better], "ok": r.ok, "rule": r.rule} for r in rows]
    context = {"base": base, "current": current, "verdict": verdict_line, "passed": passed, "rows": shown, "note": note}
    path.write_text(page.render(context, "compare.html.j2"), encoding="utf-8")


def gate_verdict(rows: list[Row]) -> tuple[bool, str]:
    gated = [Check(f"{r.point}: {r.metric}", "", r.baseline, r.current, r.ok, r.rule) for r in rows if r.gated]
    return verdict(gated)


def _name(path: Path) -> str:
    return (path.stem if path.is_file() else path.resolve().name) or "root"
