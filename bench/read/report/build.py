"""Assemble a report folder: read results, compute (pareto, recommend, views), draw (plots),
write index.html with the PNGs beside it (page). Nothing here measures."""
from __future__ import annotations

import datetime
import re
import shutil
from pathlib import Path

import pandas as pd

from bench.core.point import Deployment
from bench.core.prompts import SPEC_BENCH
from bench.derive.spec_bench import categories, cell_text, fastest_per_category, first_token_text, spec_bench_table
from bench.derive.summary import load_rows
from bench.read.report import cycles, deployment, fleet_report, page, pairings, paymap, plots, soak_report
from bench.read.report.inputs import ReportInputs, load_inputs
from bench.read.report.pareto import FRONTS, fronts_of, point_labels, set_name
from bench.read.report.recommend import node_notes, precision_notes, recommend
from bench.read.report.views import (
    per_position_acceptance,
    plain_decoding_notes,
    point_table,
    sample_points,
    side_by_side,
    split_notes,
)

PROFILE_FILES = ("flamegraph.svg", "speedscope.json", "torch_ops.csv", "torch_ops.txt", "torch_trace.json",
                 "profile.json")
MAX_COPY_BYTES = 50 << 20  # a profile file larger than this is linked by path, not copied

HEATMAP_READ = (
    "One grid per metric. Rows are the entropy threshold in nats (the edge asks the cloud when its uncertainty is at "
    "least this: 0 = every block, inf = never), columns are k, the tokens drafted per block; each row of panels is one "
    "policy. Speed-up: blue is faster than cloud-only, red slower, white the same. Acceptance: brighter keeps more of "
    "the draft. Cloud calls: brighter means fewer calls. \"—\" is undefined (no block was verified, so there is "
    "nothing to accept). Under a value, its 95 % interval over prompts.")
SPEEDUP_READ = (
    "Every point's speed-up over the fastest cloud-only decoding measured on the same prompts (in any runtime: "
    "named under each panel; the slower cloud-only points are drawn too), with its 95 % interval: a bootstrap over "
    "prompts that keeps each prompt's two runs together (paired), so a hard prompt slows both and cancels. Right of "
    "the dotted line is faster than that cloud-only. A speed-up over the cloud-only of the point's own runtime alone "
    "is `speedup_vs_cloud` in the tables. Two points whose bars overlap are not told apart by this many prompts: "
    "pick between them on something else (agreement, cloud calls), or rerun with a larger `limit` or `--repeats`.")
THEORY_READ = (
    "Each dot is a spec point: across, the speed-up Leviathan et al.'s formula predicts from its acceptance rate, k "
    "and the edge/cloud cost ratio c; up, the speed-up measured. On the solid line the engine delivers what the "
    "acceptance promises. Below it, time goes somewhere the formula does not see (engine overhead outside the model "
    "forwards, prefill, a cloud call dearer than c says): see the profile. Bars: the measured speed-up's 95 % interval. "
    "Above it is possible with a threshold > 0, since confident blocks skip the cloud and the formula assumes every "
    "block is verified. Below the dotted line a point is slower than cloud-only.")
PER_POSITION_READ = (
    "For each spec point, the probability that the i-th token of a verified draft block was accepted: "
    "accepted_per_position[i] / verified blocks, as vLLM reports it. Position i is only reached if 1..i−1 were "
    "accepted, so the curves fall. A steep early drop means most of a long block is wasted (a smaller k drafts less "
    "for nothing); a curve that stays high says a larger k would pay.")


def results_name(results_dir: Path) -> str:
    """The results folder's name; a profile's run (PROFILE/run) is named after its profile."""
    path = Path(results_dir).resolve()
    return f"{path.parent.name}-run" if path.name == "run" and path.parent.name else path.name


def default_out(results_dir: Path) -> Path:
    return Path("reports") / results_name(results_dir)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]+", "-", text).strip("-")[:40] or "set"


def _figures(inputs: ReportInputs, labels: pd.Series, per_position: pd.DataFrame, out: Path) -> tuple[list, list]:
    summary, figures_dir = inputs.summary, out / "figures"
    figures, notes = [], []

    def add(path: Path | None, name: str, title: str, how_to_read: str, missing: str) -> None:
        if path is None:
            notes.append(missing)
        else:
            figures.append({"name": name, "path": path, "title": title, "how_to_read": how_to_read})

    add(plots.plot_speedups(summary, labels, figures_dir / "speedup_intervals.png"), "speedup_intervals",
        "Speed-up vs the fastest cloud-only, with 95 % intervals", SPEEDUP_READ,
        "Speed-up intervals: needs a cloud-only baseline and at least one other point.")
    plain = pairings.plot_vs_fastest_plain(summary, labels, figures_dir / "speedup_vs_fastest_plain.png")
    add(plain.path, "vs_fastest_plain", plain.caption, pairings.READ,
        f"Speed-up over the fastest plain decoding, per runtime pairing: {plain.reason}")
    for front in FRONTS:
        add(plots.plot_front(summary, labels, front, figures_dir / f"front_{front.name}.png"), front.name,
            front.title, front.how_to_read, f"{front.title}: no point has both numbers.")
    sets = list(dict.fromkeys(summary["prompts"]))
    for number, prompts in enumerate(sets, start=1):
        name = f"heatmap_{number}_{_slug(set_name(prompts))}"
        add(plots.plot_heatmaps(summary, prompts, figures_dir / f"{name}.png"), name,
            f"Threshold × k heat maps, prompt set {set_name(prompts)}", HEATMAP_READ,
            f"Heat maps, prompt set {set_name(prompts)}: no spec points.")
    add(plots.plot_theory(summary, labels, figures_dir / "speedup_vs_theory.png"), "theory",
        "Measured vs theoretical speed-up", THEORY_READ,
        "Measured vs theoretical speed-up: needs spec points with verified blocks plus edge-only and cloud-only baselines.")
    add(plots.plot_per_position(per_position, summary, labels, figures_dir / "acceptance_per_position.png"),
        "per_position", "Acceptance by draft position", PER_POSITION_READ,
        "Acceptance by draft position: no spec point verified any block.")
    if any(str(p).startswith(SPEC_BENCH) for p in sets):
        add(cycles.plot_cycles(inputs.rows, figures_dir / "cycles.png"), "cycles",
            "Per-cycle timelines, one typical question per Spec-Bench category", cycles.READ,
            "Per-cycle timelines: needs a speculative and a plain decoding of one Spec-Bench question.")
    if "deployment" in summary and (summary["deployment"] == Deployment.SPLIT).any():
        add(deployment.plot_network(summary, labels, figures_dir / "network_modelled_vs_measured.png"), "network",
            "Network time: modelled vs measured", deployment.NETWORK_READ,
            "Network time: no split point crossed a shaped link.")
        add(deployment.plot_timeline(pd.DataFrame(inputs.rows), figures_dir / "timeline.png"), "timeline",
            "Timeline of one prompt: sequential vs overlapped", deployment.READ,
            "Timeline: needs a split point run both with and without overlap (sweep --overlap true,false).")
    return figures, notes


def _copy_profile(source: Path, out: Path) -> list[Path]:
    target = out / "profile"
    target.mkdir(parents=True, exist_ok=True)
    copied = []
    for name in PROFILE_FILES:
        path = source / name
        if path.is_file() and path.stat().st_size <= MAX_COPY_BYTES:
            shutil.copyfile(path, target / name)
            copied.append(target / name)
    return copied


def spec_bench_block(rows: list[dict], summary: pd.DataFrame, out: Path) -> dict | None:
    """The Spec-Bench table (bench/derive/spec_bench.py) as HTML, and as spec_bench.csv beside the page;
    None when no Spec-Bench category was measured."""
    table = spec_bench_table(rows, summary)
    if table.empty:
        return None
    table.to_csv(out / "spec_bench.csv", index=False)
    def shown(decoding: bool) -> str:
        cells = {c: [cell_text(row, c, decoding) for _, row in table.iterrows()] for c in categories(table)}
        return page.table_html(pd.DataFrame({"way of decoding": table["method"], **cells}), "points")

    first_tokens = {c: [first_token_text(row, c) for _, row in table.iterrows()] for c in categories(table)}
    first_token_html = page.table_html(pd.DataFrame({"way of decoding": table["method"], **first_tokens}), "points")
    fastest = "; ".join(f"{c}: {m}" for c, m in fastest_per_category(table).items())
    return {"html": shown(False), "decoding_html": shown(True), "first_token_html": first_token_html,
            "fastest": fastest, "csv": "spec_bench.csv"}


def build_report(results_dir: Path, out: Path | None = None, profile: Path | None = None,
                 embed: bool = False, samples_per_set: int = 3) -> Path:
    """Write the report for `results_dir` into `out` (default reports/<results dir name>) and
    return the path of its index.html. `embed` puts the PNGs inside the HTML as data: URIs."""
    out = Path(out) if out is not None else default_out(results_dir)
    if fleet_report.is_fleet_folder(results_dir):  # `specbench fleet`: its own page (capacity, batches, cost curve)
        return fleet_report.build_fleet_report(Path(results_dir), out, embed=embed)
    if soak_report.is_soak_folder(results_dir):  # a soak (bench/measure/serving/soak.py): its checks and the server over time
        return soak_report.build_soak_report(Path(results_dir), out, embed=embed)
    inputs = load_inputs(Path(results_dir), profile)
    out.mkdir(parents=True, exist_ok=True)
    for stale in (out / "figures").glob("*.png"):  # figures of an earlier report into the same folder
        stale.unlink()

    summary = inputs.summary
    labels = point_labels(summary)
    on_front = fronts_of(summary)
    recommendations = recommend(summary)
    frame = load_rows(inputs.rows)
    per_position = per_position_acceptance(frame, summary)
    figures, notes = _figures(inputs, labels, per_position, out)

    point_tables, samples = [], []
    for prompts, points in summary.groupby("prompts", sort=False):
        table = point_table(points, labels[points.index], on_front.loc[points.index])
        point_tables.append({"set": set_name(prompts), "html": page.table_html(table, "points")})
        shown = sample_points(summary, recommendations, prompts)
        samples.append({"prompts": prompts, "points": shown,
                        "rows": side_by_side(frame, summary, shown, prompts, samples_per_set)})

    profile_block = None
    if inputs.profile is not None:
        profile_block = page.profile_block(_copy_profile(inputs.profile, out), out, inputs.profile)

    context = {
        "title": f"specbench report: {results_name(inputs.source)}",
        "kind_text": "a sweep" if inputs.kind == "sweep" else "a single run",
        "source": str(inputs.source),
        "generated": datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"),
        "status_text": page.status_text(inputs),
        "machine": page.machine_block(inputs),
        "problems": page.problem_lines(inputs),
        "recommendations": page.recommendations_html(recommendations),
        "plain_decoding": plain_decoding_notes(summary, labels) + split_notes(summary, labels),
        "precision_notes": precision_notes(summary) + node_notes(inputs.rows),
        "figures": [{**f, "src": page.image_src(f["path"], out, embed)} for f in figures],
        "figure_notes": notes,
        "pays": paymap.section(inputs, labels, out, embed),
        "point_tables": point_tables,
        "spec_bench": spec_bench_block(inputs.rows, summary, out),
        "samples": page.samples_blocks([s for s in samples if s["rows"]], labels),
        "profile": profile_block,
        "metadata": page.metadata_sections(inputs),
    }
    index = out / "index.html"
    index.write_text(page.render_index(context), encoding="utf-8")
    return index
