"""index.html: the page around the figures and tables. Text from results is escaped by jinja2's
autoescape (or by pandas for tables); the page has no script and no external asset."""
from __future__ import annotations

import base64
import datetime
import json
import math
import platform
from importlib import metadata as importlib_metadata
from pathlib import Path
from typing import Any

import jinja2
import pandas as pd

from bench.read.report.fonts import font_face_css
from bench.read.report.inputs import ReportInputs
from bench.read.report.pareto import set_name
from specdec.machine import describe

TEMPLATES = Path(__file__).parent / "templates"
GIB = 1 << 30
# Settings shown first, in this order; the rest follow alphabetically.
FIRST_SETTINGS = ("edge", "cloud", "mode", "dtype", "prompts", "k", "entropy_threshold", "accept_threshold", "policy",
                  "verifier", "max_new_tokens", "temperature", "constraints", "network", "edge_cores",
                  "edge_memory_gb", "rlimit_as")


def value_text(key: str, value) -> str:
    """A metadata value as a reader wants it: lists joined, bytes in GiB, inf spelled out."""
    if value is None:
        return "—"
    if isinstance(value, (list, tuple)):
        return ", ".join(value_text(key, v) for v in value) or "—"
    if isinstance(value, dict):
        return ", ".join(f"{k}: {value_text(k, v)}" for k, v in value.items())
    if isinstance(value, float) and math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if key.endswith("_bytes") and isinstance(value, (int, float)):
        return f"{value / GIB:.1f} GiB"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _items(mapping: dict, first: tuple[str, ...] = ()) -> list[tuple[str, str]]:
    keys = [k for k in first if k in mapping] + sorted(k for k in mapping if k not in first)
    return [(k, value_text(k, mapping[k])) for k in keys]


def _versions(*packages: str) -> dict:
    found = {}
    for package in packages:
        try:
            found[package] = importlib_metadata.version(package)
        except importlib_metadata.PackageNotFoundError:
            pass
    return found


def metadata_sections(inputs: ReportInputs) -> list[dict]:
    """Settings, the environment the results were measured in, and what made this report."""
    meta = inputs.meta
    sections = []
    settings = dict(meta.get("config") or meta.get("point") or {})
    observed = inputs.ok_rows[0]  # the network and caps a run dir records only per row
    for key in ("network", "edge_cores", "edge_memory_gb"):
        settings.setdefault(key, observed.get(key))
    if settings:
        sections.append({"title": "Settings (sweep grid)" if inputs.kind == "sweep" else "Settings (run)",
                         "rows": _items(settings, FIRST_SETTINGS)})
    if meta.get("load_s"):
        sections.append({"title": "Model load time (s)", "rows": _items(meta["load_s"])})
    if meta.get("environment"):
        sections.append({"title": "Environment the results were measured in", "rows": _items(meta["environment"])})
    report = {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
              "python": platform.python_version(), "machine": platform.machine(),
              **_versions("specbench", "pandas", "matplotlib", "sacrebleu")}
    sections.append({"title": "This report was made with", "rows": _items(report)})
    return sections


def machine_block(inputs: ReportInputs) -> dict | None:
    """The machine the results were measured on and the runtimes its calibration chose: the report's header.
    From DIR/machine.json (a sweep's), else the fingerprint in the records' environment; None if neither."""
    machine = inputs.meta.get("machine") or {}
    found = machine.get("fingerprint") or (inputs.meta.get("environment") or {}).get("fingerprint")
    if not found:
        return None
    line = describe(found)
    if machine.get("bandwidth_gbs"):
        line += f"; memory read bandwidth {machine['bandwidth_gbs']:.1f} GB/s (measured)"
    choices = [f"{c['role']} runtime: {', '.join(c['runtimes'])} — {c['reason']}" for c in machine.get("choices", [])]
    rows = [{"model": e["model"], "runtime": e["runtime"], "threads": e.get("threads"),
             "step ms": round(e["step_ms"], 1), "floor ms": round(e["floor_ms"], 1) if e.get("floor_ms") else None,
             "step / floor": round(e["step_ms"] / e["floor_ms"], 2) if e.get("floor_ms") else None,
             **{f"{n}-token block (steps)": e["block_steps"].get(str(n)) for n in (2, 5, 9)},
             "prefill tok/s": round(e["prefill_tokens_per_s"]) if e.get("prefill_tokens_per_s") else None}
            for e in machine.get("calibration", []) if not e.get("error") and e.get("step_ms")]
    rows += [{"model": e["model"], "runtime": e["runtime"], "step ms": None, "floor ms": None,
              "step / floor": f"failed: {e['error']}"} for e in machine.get("calibration", []) if e.get("error")]
    return {"line": line, "choices": choices, "table": table_html(pd.DataFrame(rows)) if rows else None}


def status_text(inputs: ReportInputs) -> str:
    counts = ", ".join(f"{n} {status}" for status, n in sorted(inputs.statuses.items()))
    return (f"{len(inputs.summary)} points, {len(inputs.rows)} records ({counts}), "
            f"{inputs.summary['prompts'].nunique()} prompt set(s).")


def problem_lines(inputs: ReportInputs, limit: int = 20) -> list[str]:
    lines = []
    for row in inputs.problems[:limit]:
        where = f"{row.get('mode')} k={row.get('k')} thr={row.get('entropy_threshold')} policy={row.get('policy')}"
        lines.append(f"{row.get('status')}: {where}, prompt {row.get('id')}: {row.get('error', '')}")
    if len(inputs.problems) > limit:
        lines.append(f"… and {len(inputs.problems) - limit} more (see results.jsonl)")
    return lines


def table_html(frame: pd.DataFrame, classes: str = "") -> str:
    """pandas escapes every cell and header (escape=True)."""
    return frame.to_html(index=False, escape=True, border=0, classes=classes or None, na_rep="")


def recommendations_html(recommendations: pd.DataFrame) -> str:
    shown = pd.DataFrame({
        "prompt set": recommendations["set"],
        "rule": recommendations["rule_text"],
        "recommended point": recommendations["label"].fillna("— none —"),
        "why": recommendations["why"],
    })
    return table_html(shown)


def image_src(path: Path, out: Path, embed: bool) -> str:
    """A relative link (the folder can be moved or zipped), or a data: URI with `embed`."""
    if embed:
        return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")
    return path.relative_to(out).as_posix()


def samples_blocks(samples: list[dict], labels: pd.Series) -> list[dict]:
    blocks = []
    for entry in samples:
        heads = [labels[p] for p in entry["points"]]
        rows = []
        for sample in entry["rows"]:
            cells: list[dict | None] = []
            for cell in sample["cells"]:
                if cell is None:
                    cells.append(None)
                    continue
                chrf = "" if cell["chrf_vs_cloud"] is None else f"chrF {cell['chrf_vs_cloud']:.1f} · "
                cells.append({"text": cell["text"], "numbers": f"{chrf}punct {cell['punct_density']:.0%}"})
            rows.append({"id": sample["id"], "prompt": sample["prompt"], "cells": cells})
        blocks.append({"set": set_name(entry["prompts"]), "heads": heads, "rows": rows})
    return blocks


def profile_block(copied: list[Path], out: Path, source: Path) -> dict:
    links = [{"name": p.name, "href": p.relative_to(out).as_posix()} for p in copied]
    block: dict[str, Any] = {"links": links, "note": f"copied from {source}", "ops": None}
    ops = next((p for p in copied if p.name == "torch_ops.csv"), None)
    if ops is not None:
        top = pd.read_csv(ops).head(12)
        block["ops"] = table_html(top, "points")
    status = next((p for p in copied if p.name == "profile.json"), None)
    if status is not None:
        py_spy = json.loads(status.read_text(encoding="utf-8")).get("py_spy", {})
        if py_spy.get("status") not in (None, "ok"):
            block["note"] += f" · py-spy: {py_spy.get('status')} ({py_spy.get('reason', '')})"
    return block


def render_index(context: dict) -> str:
    """The report's index.html, carrying a subset of Noto Sans SC for the CJK characters it shows
    (bench/read/report/fonts.py): rendered once to learn them, then again with the @font-face rule."""
    page = render({**context, "font_face": ""})
    face = font_face_css(page)
    return render({**context, "font_face": face}) if face else page


def render(context: dict, template: str = "index.html.j2") -> str:
    """A page from bench/read/report/templates (the report's index.html, or `specbench compare`'s page)."""
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    return env.get_template(template).render(**context)
