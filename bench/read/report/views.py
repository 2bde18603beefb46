"""What the report's tables show, computed from results and the summary (no drawing, no HTML):
the per-point table, per-position acceptance, and a few prompts' outputs side by side."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from bench.core.point import COLUMNS, Deployment, SplitCores
from bench.core.prompts import load_prompts
from bench.derive import metrics
from bench.derive.health import chrf
from bench.derive.summary import plain_name
from bench.read.report.pareto import FRONTS, front_members, set_name
from specdec.core.policies import policies_that
from specdec.errors import InputError
from specdec.settings import Mode

GIB = 1 << 30

# (summary column, header, format): the per-point table, in reading order.
POINT_COLUMNS = (
    ("n_prompts", "prompts", "{:.0f}"),
    ("latency_p50_s", "p50 s", "{:.3f}"),
    ("latency_p90_s", "p90 s", "{:.3f}"),
    ("latency_p99_s", "p99 s", "{:.3f}"),
    ("latency_with_network_p50_s", "p50 s + net", "{:.3f}"),
    ("tokens_per_s", "tok/s", "{:.1f}"),
    ("ttft_p50_s", "first token p50 s", "{:.2f}"),  # with its 95 % interval: the prompt's prefill, mostly
    ("speedup_vs_cloud", "× cloud", "{:.2f}"),
    ("speedup_vs_edge", "× edge", "{:.2f}"),
    ("speedup_vs_fastest_cloud", "× fastest cloud", "{:.2f}"),
    ("speedup_vs_colocated", "× co-located", "{:.2f}"),  # split points: against both models on the cloud's cores
    ("theoretical_speedup", "theory × cloud", "{:.2f}"),
    ("acceptance_rate", "accept", "{:.2f}"),
    ("cloud_call_rate", "calls / block", "{:.2f}"),
    ("uplink_bytes_per_prompt", "uplink B / prompt", "{:,.0f}"),
    ("punct_density", "punct", "{:.1%}"),
    ("repeat_3gram", "3-gram rep", "{:.2f}"),
    ("immediate_repeats", "imm. rep", "{:.1f}"),
    ("chrf_vs_cloud", "chrF vs cloud", "{:.1f}"),
    ("cloud_nll", "cloud NLL nats/token", "{:.3f}"),  # after `specbench score`
    ("wer", "WER vs ref", "{:.2f}"),
    ("cer", "CER vs ref", "{:.2f}"),
    ("peak_rss_bytes", "peak RSS GiB", "{:.2f}"),
)


INTERVAL_SHOWN = ("ttft_p50_s",)  # columns whose cell carries its 95 % interval


def fmt(value, pattern: str) -> str:
    """A number for a table cell; blank for missing (NaN / None) values."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return pattern.format(value)


def point_table(summary: pd.DataFrame, labels: pd.Series, on_front: pd.DataFrame) -> pd.DataFrame:
    """Display strings, one row per point: label, the POINT_COLUMNS some point has, and the fronts
    it is on."""
    table = pd.DataFrame({"point": labels, "mode": summary["mode"]}, index=summary.index)
    for column, header, pattern in POINT_COLUMNS:
        if column not in summary:
            continue
        values = summary[column] / GIB if column == "peak_rss_bytes" else summary[column]
        cells = [fmt(v, pattern) for v in values]
        if column in INTERVAL_SHOWN:
            rows = (row for _, row in summary.iterrows())
            cells = [cell + _interval(row, column, pattern) if cell else cell for cell, row in zip(cells, rows)]
        if any(cells):  # a column no point has (no baseline, no reference) is left out
            table[header] = cells
    table["Pareto-optimal on"] = [", ".join(c for c in on_front.columns if on_front.at[i, c]) for i in summary.index]
    return table


def _interval(row: pd.Series, metric: str, pattern: str) -> str:
    low, high = row.get(f"{metric}_ci_low", float("nan")), row.get(f"{metric}_ci_high", float("nan"))
    return "" if low != low or high != high else f" [{pattern.format(low)}–{pattern.format(high)}]"


def plain_decoding_notes(summary: pd.DataFrame, labels: pd.Series) -> list[str]:
    """Per prompt set: the fastest plain (cloud-only) decoding measured, in any runtime and dtype, and
    whether any speculative point beats it (speedup_vs_fastest_cloud above 1, and how many beat it beyond the
    noise: the whole interval above 1), said plainly when none does."""
    notes = []
    for prompts, points in summary.groupby("prompts", sort=False):
        plain = points[points["mode"] == Mode.CLOUD]
        if not len(plain):
            continue
        fastest = plain.loc[plain["tokens_per_s"].astype(float).idxmax()]
        head = (f"{set_name(prompts)}: the fastest plain decoding measured is cloud-only in {plain_name(fastest)}, "
                f"{fastest['tokens_per_s']:.1f} tok/s{_interval(fastest, 'tokens_per_s', '{:.1f}')}.")
        spec = points[(points["mode"] == Mode.SPEC) & points["speedup_vs_fastest_cloud"].notna()]
        # A point whose gate sent no block to the cloud ran the edge's model alone: its speed is the drafter's and its
        # text the drafter's own, not speculation that verified anything. It is named apart, never counted a win.
        calls = spec["cloud_calls_per_prompt"] if "cloud_calls_per_prompt" in spec else pd.Series(1.0, index=spec.index)
        unverified, spec = spec[calls.astype(float) == 0], spec[~(calls.astype(float) == 0)]
        edge_note = ""
        if len(unverified):
            quickest = unverified.loc[unverified["speedup_vs_fastest_cloud"].astype(float).idxmax()]
            edge_note = (f" {len(unverified)} more point{'s' if len(unverified) > 1 else ''} never called the cloud: the "
                         f"edge's own text, not verified speculation (the quickest, {labels[quickest.name]}, at "
                         f"{quickest['speedup_vs_fastest_cloud']:.2f}×).")
        if not len(spec):
            notes.append(f"{head} The sweep has no speculative point that verified anything on these prompts.{edge_note}"
                         if edge_note else f"{head} The sweep has no speculative point on these prompts.")
            continue
        best = spec.loc[spec["speedup_vs_fastest_cloud"].astype(float).idxmax()]
        ratio = f"{best['speedup_vs_fastest_cloud']:.2f}×{_interval(best, 'speedup_vs_fastest_cloud', '{:.2f}')}"
        winners = int((spec["speedup_vs_fastest_cloud"] > 1).sum())
        clear = int((spec.get("speedup_vs_fastest_cloud_ci_low", pd.Series(dtype=float)) > 1).sum())  # NaN: not clear
        if winners:
            notes.append(f"{head} {winners} of {len(spec)} speculative points that verified their drafts are faster on "
                         f"these prompts, {clear} of them with the whole 95 % interval above 1; the fastest, "
                         f"{labels[best.name]}, runs at {ratio} its speed.{_lossless_note(spec, labels)}{edge_note}")
        else:
            notes.append(f"{head} No speculative point that verified its drafts beats it: the fastest, "
                         f"{labels[best.name]}, runs at {ratio} its speed. On this machine, decode plainly in that "
                         f"runtime.{edge_note}")
    return notes


LOSSLESS_POLICIES = policies_that("lossless")  # their text is the verifier's own (greedy) or its distribution (sample)


def _lossless_note(spec: pd.DataFrame, labels: pd.Series) -> str:
    """How many of the faster points keep the verifier's own text (a lossless policy), and the fastest of them: a
    lossy point's speed is bought with other text, so a user choosing by speed alone needs this apart."""
    lossless = spec[spec["policy"].isin(LOSSLESS_POLICIES)] if "policy" in spec else spec.iloc[0:0]
    if not len(lossless):
        return " None of them is lossless (the grid has no greedy or sample policy)."
    faster = int((lossless["speedup_vs_fastest_cloud"] > 1).sum())
    if not faster:
        return f" None of the {len(lossless)} lossless points (the verifier's own text) is faster."
    clear = int((lossless.get("speedup_vs_fastest_cloud_ci_low", pd.Series(dtype=float)) > 1).sum())
    best = lossless.loc[lossless["speedup_vs_fastest_cloud"].astype(float).idxmax()]
    return (f" Lossless (the verifier's own text): {faster} of {len(lossless)} faster, {clear} with the whole interval "
            f"above 1; the fastest, {labels[best.name]}, at {best['speedup_vs_fastest_cloud']:.2f}×"
            f"{_interval(best, 'speedup_vs_fastest_cloud', '{:.2f}')}.")


def per_position_acceptance(frame: pd.DataFrame, summary: pd.DataFrame) -> pd.DataFrame:
    """vLLM-style per-position acceptance of every spec point: P(accept position i) =
    sum(accepted_per_position[i]) / sum(num_drafts) over the point's prompts, i = 1..k (a block's
    position i is only reached when 1..i-1 were accepted, so the curve never rises).
    `frame` is `bench.derive.summary.load_rows(rows)`. Columns: point (summary index), position
    (1-based), p_accept, num_drafts."""
    out = []
    if frame.empty:
        return pd.DataFrame(columns=["point", "position", "p_accept", "num_drafts"])
    index = {tuple(r): i for i, r in zip(summary.index, summary[COLUMNS].itertuples(index=False))}
    for keys, group in frame[frame["mode"] == Mode.SPEC].groupby(COLUMNS, sort=False, dropna=False):
        drafts = int(group["num_drafts"].sum())
        if not drafts or tuple(keys) not in index:
            continue
        p_accept = metrics.position_acceptance(group["accepted_per_position"], drafts)
        for position, p in enumerate(p_accept, start=1):
            out.append({"point": index[tuple(keys)], "position": position, "p_accept": p, "num_drafts": drafts})
    return pd.DataFrame(out, columns=["point", "position", "p_accept", "num_drafts"])


def sample_points(summary: pd.DataFrame, recommendations: pd.DataFrame, prompts: str, max_spec: int = 3) -> list:
    """Summary indices to show side by side for one prompt set: edge-only, the recommended spec
    points (in rule order, at most `max_spec`; when no rule picked a spec point, the spec points on
    the latency / chrF front, fastest first), cloud-only last, as the reference."""
    points = summary[summary["prompts"] == prompts]
    recommended = recommendations[(recommendations["prompts"] == prompts) & recommendations["point"].notna()]
    spec = [p for p in dict.fromkeys(recommended["point"]) if summary.at[p, "mode"] == Mode.SPEC]
    if not spec:
        front = points[front_members(points, FRONTS[0]) & (points["mode"] == Mode.SPEC)]
        spec = list(front.sort_values("latency_p50_s", kind="stable").index)
    edge, cloud = points.index[points["mode"] == Mode.EDGE], points.index[points["mode"] == Mode.CLOUD]
    return [*edge[:1], *spec[:max_spec], *cloud[:1]]


def side_by_side(frame: pd.DataFrame, summary: pd.DataFrame, points: list, prompts: str,
                 n_prompts: int = 3) -> list[dict]:
    """Outputs of the first `n_prompts` prompts of a set under each of `points` (summary indices);
    `frame` is `bench.derive.summary.load_rows(rows)`. One dict per prompt:
    {id, prompt, cells: [{point, text, chrf_vs_cloud, punct_density} | None]}."""
    frame = frame[frame["prompts"] == prompts]
    if frame.empty:
        return []
    ids = list(dict.fromkeys(frame["id"]))[:n_prompts]
    by_point = {}
    for point in points:
        keys = summary.loc[point, COLUMNS]
        mask = np.logical_and.reduce([frame[c] == keys[c] for c in COLUMNS])
        by_point[point] = frame[mask].drop_duplicates("id", keep="last").set_index("id")
    cloud = frame[frame["mode"] == Mode.CLOUD].drop_duplicates("id", keep="last").set_index("id")
    texts = prompt_texts(prompts)
    samples = []
    for prompt_id in ids:
        cells: list[dict | None] = []
        for point in points:
            outputs = by_point[point]
            if prompt_id not in outputs.index:
                cells.append(None)
                continue
            text = outputs.at[prompt_id, "text"]
            reference = cloud.at[prompt_id, "text"] if prompt_id in cloud.index else None
            cells.append({"point": point, "text": text, "punct_density": outputs.at[prompt_id, "punct_density"],
                          "chrf_vs_cloud": chrf(text, reference) if reference is not None else None})
        samples.append({"id": prompt_id, "prompt": texts.get(prompt_id), "cells": cells})
    return samples


def prompt_texts(prompts: str) -> dict[str, str]:
    """id -> prompt text of a set, when its file is still where the sweep read it (else empty)."""
    try:
        return {r.id: r.prompt for r in load_prompts(prompts)}
    except (InputError, OSError):
        return {}


def split_notes(summary: pd.DataFrame, labels: pd.Series) -> list[str]:
    """Where split points ran (cores disjoint, as two machines, or shared, said as such) and, per split
    point, its speed-up against cloud-only and against its co-located point, each with its interval."""
    if "deployment" not in summary or not (summary["deployment"] == Deployment.SPLIT).any():
        return []
    split = summary[summary["deployment"] == Deployment.SPLIT]
    placements = {str(p) for p in split.get("split_cores", pd.Series(["-"])) if str(p) != "-"}
    notes = []
    if placements == {SplitCores.DISJOINT}:
        notes.append("Split points emulate two machines: the edge and the server ran on cores of their own "
                     "(disjoint), each with as many threads as cores.")
    elif SplitCores.SHARED in placements:
        notes.append("Split points ran with SHARED cores: the edge and the server competed for the same cores, so they "
                     "do not emulate two machines (drafting ahead then slows the server).")
    else:
        notes.append("Split points: these results do not record how the edge's and the server's cores were placed.")
    def versus(point: pd.Series, metric: str, what: str) -> str:
        value = point.get(metric, float("nan"))
        if value != value:
            return f"no {what} point measured"
        return f"{value:.2f}×{_interval(point, metric, '{:.2f}')} {what}"

    for index, point in split.iterrows():
        against = [versus(point, "speedup_vs_cloud", "cloud-only"),
                   versus(point, "speedup_vs_colocated", "co-located (both models on the cloud's cores)")]
        notes.append(f"{labels[index]}: {'; '.join(against)}.")
    return notes
