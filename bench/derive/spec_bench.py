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
(`spec-bench:PATH:CATEGORY`, bench/core/prompts.py).

Spec-Bench times the whole generation, prompt included; on a GPU the prompt's prefill is a few per
cent of it. On a 2-core CPU it is most of it on long inputs (a ~1,000-token article: ~15 s of prefill
against ~4 s for 128 tokens), so the same cell is also given after the first token (`{category}_decode_*`):

    decoding speed-up = (tokens after the first cycle / seconds after the first token)
                        over the same for the plain decoding whose decoding is fastest on that category

which is what a drafter can change; the end-to-end cell is what a user waits for. Each category also carries
the first token's time (`{category}_ttft_s`: the median over questions, with its 95 % bootstrap interval), what
the prompt's prefill costs in the runtime that made it."""
from __future__ import annotations

import math

import pandas as pd

from bench.core.point import COLUMNS, Deployment
from bench.core.prompts import SPEC_BENCH, prompt_set_name
from bench.derive import metrics
from bench.derive.summary import fastest_plain, load_rows, plain_label, runtime_name
from specdec.settings import Mode

METHOD = [c for c in COLUMNS if c != "prompts"]  # what a row is: every axis but the prompt set
OVERALL = "overall"


def tokens_per_verify(t) -> float:
    """Spec-Bench's τ from pooled counts (a mapping or a pandas row)."""
    return metrics.ratio(t["num_accepted_tokens"] + t["corrections"] + t["bonus_tokens"], t["cloud_calls"])


def method_name(point) -> str:
    """`prompt-lookup k=4 greedy · A → B` (the edge's runtime → the cloud's), `prompt-lookup[branches=4] k=4 greedy
    · → B` (the drafter's own settings where it has any) or `cloud-only in torch bfloat16`."""
    if point["mode"] != Mode.SPEC:
        return plain_label(point)
    pairing = f"{runtime_name(point['edge_runtime'])} → {runtime_name(point['cloud_runtime'])}"
    if str(point.get("drafter")) in ("prompt-lookup", "ngram"):
        pairing = f"→ {runtime_name(point['cloud_runtime'])}"  # nothing runs on the edge but the lookup
    where = "" if point.get("deployment") in (Deployment.INPROC, "-", None) else f" · {point['deployment']}"
    threshold = "" if float(point["entropy_threshold"]) == 0 else f" thr={point['entropy_threshold']:g}"
    options = str(point.get("drafter_options") or "").strip("-")
    drafter = f"{point.get('drafter', 'model')}" + (f"[{options}]" if options else "")
    return f"{drafter} k={int(float(point['k']))} {point['policy']}{threshold} · {pairing}{where}"


def after_first_token(row) -> tuple[float, float]:
    """(tokens, seconds) of a record after its first emitted token: what the prompt's prefill is not in.
    The first cycle emits its kept draft and the cloud's token (plain decoding: one token)."""
    trace = row.get("trace")
    first = trace[0] if isinstance(trace, list) and trace else None
    emitted = 1 if first is None else first["accepted"] + (first.get("extra_token") is not None)
    return float(row["new_tokens"]) - emitted, float(row["latency_s"]) - float(row["ttft_s"])


def fastest_decoding(frame: pd.DataFrame, prompts) -> tuple | None:
    """The key (COLUMNS values) of the cloud-only decoding with the most tokens a second after the first token."""
    plain = frame[(frame["mode"] == Mode.CLOUD) & (frame["prompts"] == prompts)]
    rates = {key: metrics.ratio(group["decode_tokens"].sum(), group["decode_s"].sum())
             for key, group in plain.groupby(COLUMNS, sort=False, dropna=False)}
    return max(rates, key=lambda key: rates[key]) if rates else None


def spec_bench_table(rows: list[dict], summary: pd.DataFrame) -> pd.DataFrame:
    """One row per method measured on a Spec-Bench category (spec points and the cloud model's plain
    decodings), sorted by the overall speed-up; empty when no Spec-Bench prompt set was measured."""
    frame = load_rows(rows)
    sets = [p for p in dict.fromkeys(summary["prompts"]) if str(p).startswith(SPEC_BENCH)] if len(summary) else []
    if not sets:
        return pd.DataFrame()
    baselines = {p: base for p in sets if (base := fastest_plain(summary, p)) is not None}
    sets = [p for p in sets if p in baselines]
    frame = frame[frame["prompts"].isin(sets) & frame["mode"].isin(["spec", "cloud"])]
    decoding = [after_first_token(row) for _, row in frame.iterrows()]
    frame = frame.assign(decode_tokens=[t for t, _ in decoding], decode_s=[s for _, s in decoding])
    per_prompt = {key: group.set_index("id") for key, group in frame.groupby(COLUMNS, sort=False, dropna=False)}
    base_rows = {p: per_prompt[tuple(baselines[p][c] for c in COLUMNS)] for p in sets}
    decode_base = {p: per_prompt[fastest_decoding(frame, p)] for p in sets}
    table = []
    for method, _group in frame.groupby(METHOD, sort=False, dropna=False):
        point = dict(zip(METHOD, method))
        row = {"method": method_name(point), **point}
        # tokens, seconds, baseline tokens, baseline seconds: aligned by question
        pooled: tuple[list[float], ...] = ([], [], [], [])
        pooled_decode: tuple[list[float], ...] = ([], [], [], [])  # the same after the first token
        answered = []  # this method's rows on every category, for the overall τ
        for prompts in sets:
            mine = per_prompt.get((*method[:COLUMNS.index("prompts")], prompts, *method[COLUMNS.index("prompts"):]))
            name = prompt_set_name(prompts)
            if mine is None:
                row.update({f"{name}_{column}": math.nan for column in ("speedup", "ci_low", "ci_high", "tau",
                                                                       "decode_speedup", "decode_ci_low", "decode_ci_high",
                                                                       *FIRST_TOKEN)})
                continue
            columns = _aligned(mine, base_rows[prompts], "new_tokens", "latency_s")
            decode_columns = _aligned(mine, decode_base[prompts], "decode_tokens", "decode_s")
            for pooled_column, column in (*zip(pooled, columns), *zip(pooled_decode, decode_columns)):
                pooled_column.extend(column.astype(float))
            answered.append(mine)
            row.update(_cell(name, columns, mine, point["mode"]))
            row.update(_cell(f"{name}_decode", decode_columns, None, point["mode"]))
            row.update(_first_token(name, mine))
        row.update(_cell(OVERALL, pooled, pd.concat(answered) if answered else None, point["mode"]))
        row.update(_cell(f"{OVERALL}_decode", pooled_decode, None, point["mode"]))
        row.update(_first_token(OVERALL, pd.concat(answered) if answered else None))
        table.append(row)
    return pd.DataFrame(table).sort_values(f"{OVERALL}_speedup", ascending=False, ignore_index=True)


def _aligned(mine: pd.DataFrame, base: pd.DataFrame, tokens: str, seconds: str) -> tuple:
    """(tokens, seconds, baseline tokens, baseline seconds) over the questions both answered, in one order."""
    both = mine.index.intersection(base.index)
    return mine.loc[both, tokens], mine.loc[both, seconds], base.loc[both, tokens], base.loc[both, seconds]


FIRST_TOKEN = ("ttft_s", "ttft_ci_low", "ttft_ci_high")


def _first_token(name: str, mine: pd.DataFrame | None) -> dict:
    """The median time to the first token over the questions and its 95 % interval."""
    if mine is None or mine.empty:
        return {f"{name}_{column}": math.nan for column in FIRST_TOKEN}
    seconds = mine["ttft_s"].astype(float)
    low, high = metrics.median_ci(seconds)
    return {f"{name}_ttft_s": float(seconds.median()), f"{name}_ttft_ci_low": low, f"{name}_ttft_ci_high": high}


def _cell(name: str, columns, mine: pd.DataFrame | None, mode: str) -> dict:
    tokens, seconds, base_tokens, base_seconds = (pd.Series(c, dtype=float) for c in columns)
    speedup = metrics.speedup(metrics.ratio(tokens.sum(), seconds.sum()), metrics.ratio(base_tokens.sum(), base_seconds.sum()))
    low, high = metrics.speedup_ci(tokens, seconds, base_tokens, base_seconds)
    cell = {f"{name}_speedup": speedup, f"{name}_ci_low": low, f"{name}_ci_high": high}
    if mine is not None:
        counts = mine[["num_accepted_tokens", "corrections", "bonus_tokens", "cloud_calls"]].fillna(0).sum()
        cell[f"{name}_tau"] = tokens_per_verify(counts) if mode == Mode.SPEC else 1.0
    return cell


def categories(table: pd.DataFrame) -> list[str]:
    """The category columns of a table, in its order, `overall` last."""
    return [c.removesuffix("_speedup") for c in table.columns
            if c.endswith("_speedup") and not c.endswith("_decode_speedup")]


def fastest_per_category(table: pd.DataFrame) -> dict[str, str]:
    """Per category: the fastest way found (plain decoding included), by its speed-up."""
    return {c: table.loc[table[f"{c}_speedup"].astype(float).idxmax(), "method"]
            for c in categories(table) if table[f"{c}_speedup"].notna().any()}


def first_token_text(row, category: str) -> str:
    """`4.53 s [4.12–4.90]`: the median first token and its interval; `–` where the row has none."""
    seconds = row.get(f"{category}_ttft_s", math.nan)
    if seconds != seconds:
        return "–"
    low, high = row[f"{category}_ttft_ci_low"], row[f"{category}_ttft_ci_high"]
    return f"{seconds:.2f} s" + (f" [{low:.2f}–{high:.2f}]" if low == low else "")


def cell_text(row, category: str, decoding: bool = False) -> str:
    """`1.52× [1.31–1.77] · τ 2.31` (end to end); `decoding`: the speed-up after the first token, no τ."""
    name = f"{category}_decode" if decoding else category
    speedup = row.get(f"{name}_speedup", math.nan)
    if speedup != speedup:
        return "–"
    low, high = row[f"{name}_ci_low"], row[f"{name}_ci_high"]
    interval = f" [{low:.2f}–{high:.2f}]" if low == low else ""
    tau = math.nan if decoding else row.get(f"{category}_tau", math.nan)
    return f"{speedup:.2f}×{interval}" + (f" · τ {tau:.2f}" if tau == tau else "")
