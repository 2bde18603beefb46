"""The Spec-Bench table (Xia et al. 2024, "Unlocking Efficiency in Large Language Model Inference"):
one row per way of decoding (drafter × k × policy × runtime pairing × deployment; plain decodings of the
cloud model as rows too), one column per task category present, and `overall`.

Each cell is the speed-up over the fastest plain decoding of the verifier's model measured on *that*
category (`summary.fastest_plain`), its 95 % paired bootstrap interval over questions, and the mean
tokens per verify call, Spec-Bench's "mean accepted tokens" τ:

    τ = (accepted draft tokens + the cloud's own token of each call) / verify calls
      = (num_accepted_tokens + corrections + bonus_tokens) / cloud_calls        (plain decoding: 1)

`overall` pools every question of the row's categories: sum(tokens) / sum(seconds) over the same sum
for each question's own category baseline, paired per question. Only Spec-Bench prompt sets count
(`spec-bench:PATH:CATEGORY`, bench/core/prompts.py)."""
from __future__ import annotations

import math

import pandas as pd

from bench.core.point import COLUMNS
from bench.core.prompts import SPEC_BENCH, prompt_set_name
from bench.derive import metrics
from bench.derive.summary import fastest_plain, load_rows, plain_label, runtime_name

METHOD = [c for c in COLUMNS if c != "prompts"]  # what a row is: every axis but the prompt set
OVERALL = "overall"


def tokens_per_verify(t) -> float:
    """Spec-Bench's τ from pooled counts (a mapping or a pandas row)."""
    return metrics.ratio(t["num_accepted_tokens"] + t["corrections"] + t["bonus_tokens"], t["cloud_calls"])


def method_name(point) -> str:
    """`prompt-lookup k=4 greedy · llamacpp → torch-int8` or `cloud-only in llamacpp`."""
    if point["mode"] != "spec":
        return plain_label(point)
    pairing = f"{runtime_name(point['edge_runtime'])} → {runtime_name(point['cloud_runtime'])}"
    if str(point.get("drafter")) in ("prompt-lookup", "ngram"):
        pairing = f"→ {runtime_name(point['cloud_runtime'])}"  # nothing runs on the edge but the lookup
    where = "" if point.get("deployment") in ("inproc", "-", None) else f" · {point['deployment']}"
    threshold = "" if float(point["entropy_threshold"]) == 0 else f" thr={point['entropy_threshold']:g}"
    return f"{point.get('drafter', 'model')} k={int(float(point['k']))} {point['policy']}{threshold} · {pairing}{where}"


def spec_bench_table(rows: list[dict], summary: pd.DataFrame) -> pd.DataFrame:
    """One row per method measured on a Spec-Bench category (spec points and the cloud model's plain
    decodings), sorted by the overall speed-up; empty when no Spec-Bench prompt set was measured."""
    frame = load_rows(rows)
    sets = [p for p in dict.fromkeys(summary["prompts"]) if str(p).startswith(SPEC_BENCH)] if len(summary) else []
    if not sets:
        return pd.DataFrame()
    baselines = {p: fastest_plain(summary, p) for p in sets}
    sets = [p for p in sets if baselines[p] is not None]
    frame = frame[frame["prompts"].isin(sets) & frame["mode"].isin(["spec", "cloud"])]
    per_prompt = {key: group.set_index("id") for key, group in frame.groupby(COLUMNS, sort=False, dropna=False)}
    base_rows = {p: per_prompt[tuple(baselines[p][c] for c in COLUMNS)] for p in sets}
    table = []
    for method, group in frame.groupby(METHOD, sort=False, dropna=False):
        point = dict(zip(METHOD, method))
        row = {"method": method_name(point), **point}
        pooled = ([], [], [], [])  # tokens, seconds, baseline tokens, baseline seconds: aligned by question
        answered = []  # this method's rows on every category, for the overall τ
        for prompts in sets:
            mine = per_prompt.get((*method[:COLUMNS.index("prompts")], prompts, *method[COLUMNS.index("prompts"):]))
            name = prompt_set_name(prompts)
            if mine is None:
                row.update({f"{name}_speedup": math.nan, f"{name}_ci_low": math.nan, f"{name}_ci_high": math.nan,
                            f"{name}_tau": math.nan})
                continue
            base = base_rows[prompts]
            both = mine.index.intersection(base.index)
            columns = (mine.loc[both, "new_tokens"], mine.loc[both, "latency_s"],
                       base.loc[both, "new_tokens"], base.loc[both, "latency_s"])
            for pooled_column, column in zip(pooled, columns):
                pooled_column.extend(column.astype(float))
            answered.append(mine)
            row.update(_cell(name, columns, mine, point["mode"]))
        row.update(_cell(OVERALL, pooled, pd.concat(answered) if answered else None, point["mode"]))
        table.append(row)
    return pd.DataFrame(table).sort_values(f"{OVERALL}_speedup", ascending=False, ignore_index=True)


def _cell(name: str, columns, mine: pd.DataFrame | None, mode: str) -> dict:
    tokens, seconds, base_tokens, base_seconds = (pd.Series(c, dtype=float) for c in columns)
    speedup = metrics.speedup(metrics.ratio(tokens.sum(), seconds.sum()), metrics.ratio(base_tokens.sum(), base_seconds.sum()))
    low, high = metrics.speedup_ci(tokens, seconds, base_tokens, base_seconds)
    cell = {f"{name}_speedup": speedup, f"{name}_ci_low": low, f"{name}_ci_high": high}
    if mine is not None:
        counts = mine[["num_accepted_tokens", "corrections", "bonus_tokens", "cloud_calls"]].fillna(0).sum()
        cell[f"{name}_tau"] = tokens_per_verify(counts) if mode == "spec" else 1.0
    return cell


def categories(table: pd.DataFrame) -> list[str]:
    """The category columns of a table, in its order, `overall` last."""
    return [c.removesuffix("_speedup") for c in table.columns if c.endswith("_speedup")]


def fastest_per_category(table: pd.DataFrame) -> dict[str, str]:
    """Per category: the fastest way found (plain decoding included), by its speed-up."""
    return {c: table.loc[table[f"{c}_speedup"].astype(float).idxmax(), "method"]
            for c in categories(table) if table[f"{c}_speedup"].notna().any()}


def cell_text(row, category: str) -> str:
    """`1.52× [1.31–1.77] · τ 2.31`."""
    speedup = row[f"{category}_speedup"]
    if speedup != speedup:
        return "–"
    low, high = row[f"{category}_ci_low"], row[f"{category}_ci_high"]
    interval = f" [{low:.2f}–{high:.2f}]" if low == low else ""
    tau = row.get(f"{category}_tau", math.nan)
    return f"{speedup:.2f}×{interval}" + (f" · τ {tau:.2f}" if tau == tau else "")
