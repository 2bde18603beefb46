"""Per-point statistics, derived from raw results only (measure, then derive); the speed and
acceptance formulas are bench/derive/metrics.py's.

Speed-ups compare the same prompts: a point's pooled tokens/s against the cloud-only point of its
own cloud runtime (or the edge-only point of its own edge runtime) with the same dtype and prompt
set (`baseline`), and against the fastest cloud-only point measured in the sweep on those prompts,
whatever its runtime and dtype (`speedup_vs_fastest_cloud`; `fastest_cloud` names it): speculation
that beats its own runtime's plain decoding may still lose to plain decoding in another runtime.
`speedup_vs_fastest_plain` (`fastest_plain` names it) is the one baseline every report states: the
fastest plain decoding of the verifier's (cloud) model measured on those prompts, in any runtime and
dtype, what a user who wants that model's output would run instead. The edge model alone is a
different model writing different text: a reference line, never the baseline (it once made every
point of the main job look 0.37-0.53x while the text said 1.12-1.18x over the 1.5B).
A split point is also compared with its co-located baseline (`speedup_vs_colocated`: the same pair
and settings in one process on the cloud's cores, bench/measure/sweep/sweep_config.py), paired per prompt:
drafting on a second machine must beat what the server alone does with both models.
The theoretical speed-up is Leviathan et al.'s
(`metrics.expected_speedup`), with the measured acceptance rate and c = edge step time / cloud
step time measured from the edge-only and cloud-only baselines.
WER and CER are means over the point's rows that carry a `reference` (see bench.derive.health.error_rates:
CER for Chinese-like languages, WER otherwise); NaN when none do. `cloud_nll` (nats per token of
the output under the cloud, bench/measure/nll.py) is there once the folder has been scored.

Every ratio and rate a user acts on carries a 95 % interval, `<metric>_ci_low` / `<metric>_ci_high`
(bench.derive.metrics: percentile bootstrap over prompts, fixed seed): speed-ups resample each prompt with
its baseline run (paired), acceptance and cloud-call rate recompute the pooled rate, chrF the mean.
A prompt timed several times (`--repeats`) counts once, with the median of its timings.
"""
from __future__ import annotations

from collections.abc import Callable

import pandas as pd

from bench.core.point import COLUMNS, RUNTIME_OF, Deployment
from bench.derive import metrics
from bench.derive.health import chrf, error_rates, text_health, token_match_rate
from bench.derive.scores import score_key
from specdec.runtime_registry import RuntimeChoices, declared, default_runtime
from specdec.settings import Mode


def load_rows(rows: list[dict]) -> pd.DataFrame:
    frame = pd.DataFrame([r for r in rows if r.get("status", "ok") == "ok"])
    if frame.empty:
        return frame
    for column in COLUMNS:  # results written before an axis existed lack it: "-" as for a spec-only axis
        values = frame[column] if column in frame else pd.Series(None, index=frame.index)
        frame[column] = values.astype(object).where(values.notna(), "-")
    health = frame["text"].map(text_health).apply(pd.Series)
    frame = pd.concat([frame, health.drop(columns=[c for c in health if c in frame])], axis=1)
    return pd.concat([frame.drop(columns=["wer", "cer"], errors="ignore"), _reference_rates(frame)], axis=1)


def _reference_rates(frame: pd.DataFrame) -> pd.DataFrame:
    """Per row: WER or CER of `text` against `reference` (NaN where a row has none)."""
    def text_or_none(column: str) -> list:
        values = frame[column] if column in frame else [None] * len(frame)
        return [v if isinstance(v, str) else None for v in values]

    rates = [error_rates(text, reference, language) for text, reference, language
             in zip(frame["text"], text_or_none("reference"), text_or_none("language"))]
    return pd.DataFrame(rates, index=frame.index, columns=["wer", "cer"])


def summarize(rows: list[dict], scores: dict[str, float] | None = None) -> pd.DataFrame:
    """One row per point. `scores`: bench.derive.scores.read_scores(DIR), the cloud NLL of each output."""
    if scores:
        rows = [{**r, "cloud_nll": scores.get(score_key(r), float("nan"))} for r in rows]
    frame = load_rows(rows)
    if frame.empty:
        return frame
    frame = _agreement_with_cloud(_median_over_repeats(frame))
    summary = frame.groupby(COLUMNS, sort=False, dropna=False).apply(_point_stats, include_groups=False).reset_index()
    # verify calls per token are speculation's cost (as in the gate's workload); cloud-only's every token is the cloud's
    summary.loc[summary["mode"] != Mode.SPEC, "cloud_calls_per_token"] = float("nan")
    return _intervals(_speedups(summary, frame), frame)


def _point_stats(group: pd.DataFrame) -> pd.Series:
    latency = group["latency_s"]
    totals = {key: group[key].sum() for key in metrics.COUNTS}  # per column: counts stay integers
    stats = {
        "n_prompts": len(group),
        "new_tokens": totals["new_tokens"],
        "latency_p50_s": latency.quantile(0.5), "latency_p90_s": latency.quantile(0.9), "latency_p99_s": latency.quantile(0.99),
        "latency_total_s": totals["latency_s"],
        "latency_with_network_p50_s": group.get("latency_with_network_s", latency).quantile(0.5),
        "ttft_p50_s": group["ttft_s"].quantile(0.5),
        "tpot_p50_s": group["tpot_s"].quantile(0.5),
        "tokens_per_s": metrics.tokens_per_s(totals),
        "acceptance_rate": metrics.acceptance_rate(totals),
        "cloud_call_rate": metrics.cloud_call_rate(totals),
        "cloud_calls_per_token": metrics.cloud_calls_per_token(totals),
        "cloud_calls_per_prompt": group["cloud_calls"].mean(),
        "uplink_bytes_per_prompt": group["uplink_bytes"].mean() if "uplink_bytes" in group else float("nan"),
        "edge_s": totals["edge_s"], "cloud_s": totals["cloud_s"],
        "overhead_fraction": metrics.overhead_fraction(totals),
        "punct_density": group["punct_density"].mean(),
        "punct_band_distance": group["punct_band_distance"].mean(),
        "repeat_3gram": group["repeat_3gram"].mean(),
        "immediate_repeats": group["immediate_repeats"].mean(),
        "chrf_vs_cloud": group["chrf_vs_cloud"].mean(),
        "token_match_vs_cloud": group["token_match_vs_cloud"].mean(),
        "wer": group["wer"].mean(), "cer": group["cer"].mean(),  # NaN rows (no reference) skipped
        "peak_rss_bytes": group["peak_rss_bytes"].max(),
        # mean over the point's scored outputs (`specbench score`); NaN when not scored
        "cloud_nll": group["cloud_nll"].mean() if "cloud_nll" in group else float("nan"),
        **_deployment_stats(group),
        "split_cores": _placement(group),
    }
    return pd.Series(stats)


def _placement(group: pd.DataFrame) -> str:
    """How a sweep with split points placed its processes (disjoint or shared cores), "-" where it had
    none or the records predate the field."""
    if "split_cores" not in group:
        return "-"
    values = group["split_cores"].dropna()
    return str(values.iloc[0]) if len(values) else "-"


def _mean(group: pd.DataFrame, column: str) -> float:
    return group[column].astype(float).mean() if column in group else float("nan")


def _deployment_stats(group: pd.DataFrame) -> dict:
    """Network and split-deployment columns: the modelled network time next to the time really
    spent in flight through the link (split points), what crossed, and how blocks were drafted."""
    return {
        "network_s_mean": _mean(group, "network_s"),  # modelled (bench/core/network.py)
        "link_s_mean": _mean(group, "link_s"),  # measured: waits minus server time
        "link_over_network": metrics.ratio(_mean(group, "link_s"), _mean(group, "network_s")),
        "wire_up_bytes_per_prompt": _mean(group, "wire_up_bytes"),
        "wire_down_bytes_per_prompt": _mean(group, "wire_down_bytes"),
        "server_queue_s_mean": _mean(group, "server_queue_s"),
        "edge_wait_s_mean": _mean(group, "edge_wait_s"),
        "overlap_kept_tokens": _mean(group, "overlap_kept_tokens"),
        "overlap_wasted_tokens": _mean(group, "overlap_wasted_tokens"),
        "block_len_mean": _mean(group, "block_len_mean"),
    }




def baseline(table: pd.DataFrame, mode: str, point) -> pd.DataFrame:
    """The rows of `table` (a summary, or records) of `mode`'s plain decoding that `point` is compared
    with: same dtype and prompts, and the runtime `point` runs that role in; a point that does not
    run the role ("-": an edge-only point's cloud) takes the torch runtime's, else the first. Among
    those, the ones with `point`'s KV cache where there are any (a sweep over kv_cache: each cache
    against its own plain decoding; a runtime that keeps its own cache was measured once)."""
    match = table[(table["mode"] == mode) & (table["dtype"] == point["dtype"]) & (table["prompts"] == point["prompts"])]
    if "constraints" in table and point.get("constraints", "-") not in ("-", None):  # the same decoding profile
        match = match[match["constraints"] == point["constraints"]]
    column = RUNTIME_OF[mode]
    if column in table and len(match):
        if point.get(column, "-") != "-":
            match = match[match[column] == point[column]]
        else:
            runtimes = list(dict.fromkeys(match[column]))
            default = default_runtime()
            match = match[match[column] == (default if default in runtimes else runtimes[0])]
    if "kv_cache" in table and point.get("kv_cache", "-") not in ("-", None):
        same = match[match["kv_cache"] == point["kv_cache"]]
        match = same if len(same) else match
    return match


def _agreement_with_cloud(frame: pd.DataFrame) -> pd.DataFrame:
    """chrF and token match of every output against the cloud-only output for the same prompt (of
    the point's cloud runtime)."""
    chrf_scores, matches, references = [], [], {}
    for _, row in frame.iterrows():
        which = (row["dtype"], row["prompts"], row.get("cloud_runtime", "-"), row.get("kv_cache", "-"))
        if which not in references:  # one lookup per (dtype, prompts, runtime, cache), not per row
            references[which] = baseline(frame, "cloud", row).drop_duplicates("id").set_index("id")
        refs = references[which]
        if row["id"] in refs.index:
            ref = refs.loc[row["id"]]
            chrf_scores.append(chrf(row["text"], ref["text"]))
            matches.append(token_match_rate(row["tokens"], ref["tokens"]))
        else:
            chrf_scores.append(float("nan"))
            matches.append(float("nan"))
    return frame.assign(chrf_vs_cloud=chrf_scores, token_match_vs_cloud=matches)


# The axes a split point and its co-located baseline may differ in: where the cloud ran and over what link.
PLACED = ("deployment", "link", "overlap")


def colocated(table: pd.DataFrame, point) -> pd.DataFrame:
    """The rows of `table` of a split point's co-located baseline: the same pair, k, policy and
    thresholds (every other axis equal) run in one process on the cloud's cores; empty for any
    other point, or a folder written before the sweep measured it."""
    if point.get("deployment") != Deployment.SPLIT or "deployment" not in table:
        return table.iloc[0:0]
    match = table["deployment"] == Deployment.COLOCATED
    for column in COLUMNS:
        if column not in PLACED:
            match &= table[column] == point[column]
    return table[match]


def fastest_cloud(summary: pd.DataFrame, prompts) -> pd.Series | None:
    """The fastest plain decoding of the cloud model measured on `prompts`, in any runtime and dtype."""
    plain = summary[(summary["mode"] == Mode.CLOUD) & (summary["prompts"] == prompts) & summary["tokens_per_s"].notna()]
    return plain.loc[plain["tokens_per_s"].astype(float).idxmax()] if len(plain) else None


def fastest_plain(summary: pd.DataFrame, prompts) -> pd.Series | None:
    """The baseline of every speed-up on `prompts`: the fastest plain decoding of the verifier's model
    (cloud-only, any runtime and dtype). Edge-only rows are references (`fastest_edge`), never this."""
    return fastest_cloud(summary, prompts)


def fastest_edge(summary: pd.DataFrame, prompts) -> pd.Series | None:
    """The fastest edge-only decoding on `prompts`: the small model alone, a reference line."""
    plain = summary[(summary["mode"] == Mode.EDGE) & (summary["prompts"] == prompts) & summary["tokens_per_s"].notna()]
    return plain.loc[plain["tokens_per_s"].astype(float).idxmax()] if len(plain) else None


def runtime_name(value) -> str:
    """A record's or summary's runtime field as a name: blank ("-", None, NaN: written before the runtime
    axes, or a role the point does not run) reads as torch."""
    return default_runtime() if str(value) in ("-", "None", "nan") else str(value)


def plain_name(point) -> str:
    """`torch bfloat16`, or a runtime's name alone: which plain decoding a row is, by runtime, and by dtype where
    the runtime takes one (torch's dynamic int8 computes in int8 and float32, llama.cpp in the GGUF's own types,
    whatever --dtype says); `torch bfloat16, static KV cache` where a cache was chosen (auto is a run's default)."""
    runtime = runtime_name(point.get(RUNTIME_OF[point["mode"]], "-"))
    if runtime not in RuntimeChoices() or not declared(runtime).dtyped:
        return runtime
    cache = point.get("kv_cache", "-")
    return f"{runtime} {point['dtype']}" + (f", {cache} KV cache" if cache not in ("-", None, "auto") else "")


def plain_label(point) -> str:
    """`cloud-only in torch bfloat16`: a plain decoding as a caption names it."""
    return f"{point['mode']}-only in {plain_name(point)}"


def _speedups(summary: pd.DataFrame, frame: pd.DataFrame) -> pd.DataFrame:
    def first(match: pd.DataFrame) -> pd.Series | None:
        return match.iloc[0] if len(match) else None

    rows = []
    for _, point in summary.iterrows():
        cloud, edge = first(baseline(summary, "cloud", point)), first(baseline(summary, "edge", point))
        fastest, quickest = fastest_cloud(summary, point["prompts"]), fastest_plain(summary, point["prompts"])
        extra = {"speedup_vs_cloud": float("nan"), "speedup_vs_edge": float("nan"), "speedup_vs_colocated": float("nan"),
                 "speedup_vs_fastest_cloud": float("nan"), "fastest_cloud": "-",
                 "speedup_vs_fastest_plain": float("nan"), "fastest_plain": "-",
                 "cost_ratio_c": float("nan"), "theoretical_speedup": float("nan"), "speedup_efficiency": float("nan")}
        if fastest is not None:
            extra["speedup_vs_fastest_cloud"] = metrics.speedup(point["tokens_per_s"], fastest["tokens_per_s"])
            extra["fastest_cloud"] = plain_name(fastest)
        if quickest is not None:
            extra["speedup_vs_fastest_plain"] = metrics.speedup(point["tokens_per_s"], quickest["tokens_per_s"])
            extra["fastest_plain"] = plain_label(quickest)
        if cloud is not None:
            extra["speedup_vs_cloud"] = metrics.speedup(point["tokens_per_s"], cloud["tokens_per_s"])
        if edge is not None:
            extra["speedup_vs_edge"] = metrics.speedup(point["tokens_per_s"], edge["tokens_per_s"])
        beside = first(colocated(summary, point))
        if beside is not None:
            extra["speedup_vs_colocated"] = metrics.speedup(point["tokens_per_s"], beside["tokens_per_s"])
        if (point["mode"] == Mode.SPEC and cloud is not None and edge is not None
                and point["acceptance_rate"] == point["acceptance_rate"]):  # not NaN
            c = metrics.cost_ratio(cloud["tokens_per_s"], edge["tokens_per_s"])
            theory = metrics.expected_speedup(point["acceptance_rate"], int(point["k"]), c)
            extra.update(cost_ratio_c=c, theoretical_speedup=theory,
                         speedup_efficiency=metrics.ratio(extra["speedup_vs_cloud"], theory))
        rows.append({**point.to_dict(), **extra})
    return pd.DataFrame(rows)


# --- repeats and intervals --------------------------------------------------------------------
TIMED = ("latency_s", "latency_with_network_s", "ttft_s", "tpot_s", "edge_s", "cloud_s", "overhead_s", "network_s")
# metric -> (how its interval is computed, the per-prompt columns it needs)
INTERVALS = {
    "tokens_per_s": ("pooled", ("new_tokens", "latency_s")),
    "acceptance_rate": ("pooled", ("num_accepted_tokens", "num_draft_tokens")),
    "cloud_call_rate": ("pooled", ("cloud_calls", "cycles")),
    "cloud_calls_per_token": ("pooled", ("cloud_calls", "new_tokens")),
    "chrf_vs_cloud": ("mean", ("chrf_vs_cloud",)),
    "token_match_vs_cloud": ("mean", ("token_match_vs_cloud",)),
    "ttft_p50_s": ("median", ("ttft_s",)),
}
INTERVAL_OF_KIND: dict[str, Callable[..., tuple[float, float]]] = {
    "pooled": metrics.pooled_ratio_ci, "mean": metrics.mean_ci, "median": metrics.median_ci}
# metric -> its baseline: the cloud-only or edge-only point of the same runtime, the fastest cloud-only, the
# fastest plain decoding of either model, or (a split point's) co-located speculation on the cloud's cores
SPEEDUPS = {"speedup_vs_cloud": Mode.CLOUD, "speedup_vs_edge": Mode.EDGE, "speedup_vs_fastest_cloud": "fastest_cloud",
            "speedup_vs_fastest_plain": "fastest_plain", "speedup_vs_colocated": Deployment.COLOCATED}
FASTEST = {"fastest_cloud": fastest_cloud, "fastest_plain": fastest_plain}


def ci_columns(metric: str) -> tuple[str, str]:
    return f"{metric}_ci_low", f"{metric}_ci_high"


def _median_over_repeats(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per (point, prompt): a prompt timed R times (`--repeats`) keeps its first output (greedy
    or seeded: the same every repeat) and the median of each timing; peak RSS is the largest."""
    if "repeat" not in frame or frame["repeat"].nunique() <= 1:
        return frame
    keys = COLUMNS + ["id"]
    how = {c: "median" if c in TIMED else "max" if c == "peak_rss_bytes" else "first" for c in frame if c not in keys}
    return frame.groupby(keys, sort=False, dropna=False, as_index=False).agg(how)


def _intervals(summary: pd.DataFrame, frame: pd.DataFrame) -> pd.DataFrame:
    """The `_ci_low` / `_ci_high` columns of every point (NaN where a metric or its baseline is undefined,
    or with fewer than 2 prompts)."""
    groups = {key: group.set_index("id") for key, group in frame.groupby(COLUMNS, sort=False, dropna=False)}
    columns: dict[str, list[float]] = {c: [] for metric in [*INTERVALS, *SPEEDUPS] for c in ci_columns(metric)}
    for _, point in summary.iterrows():
        rows = groups[tuple(point[c] for c in COLUMNS)]
        for metric, (kind, needed) in INTERVALS.items():
            low, high = float("nan"), float("nan")
            if all(c in rows for c in needed) and point[metric] == point[metric]:
                values = [rows[c].astype(float) for c in needed]
                low, high = INTERVAL_OF_KIND[kind](*values)
            columns[ci_columns(metric)[0]].append(low)
            columns[ci_columns(metric)[1]].append(high)
        for metric, mode in SPEEDUPS.items():
            low, high = float("nan"), float("nan")
            if mode in FASTEST:
                fastest = FASTEST[mode](summary, point["prompts"])
                base = summary.iloc[0:0] if fastest is None else fastest.to_frame().T
            elif mode == Deployment.COLOCATED:
                base = colocated(summary, point)
            else:
                base = baseline(summary, mode, point)
            if len(base) and point[metric] == point[metric]:
                base_rows = groups[tuple(base.iloc[0][c] for c in COLUMNS)]
                both = rows.index.intersection(base_rows.index)
                low, high = metrics.speedup_ci(rows.loc[both, "new_tokens"], rows.loc[both, "latency_s"],
                                               base_rows.loc[both, "new_tokens"], base_rows.loc[both, "latency_s"])
            columns[ci_columns(metric)[0]].append(low)
            columns[ci_columns(metric)[1]].append(high)
    return summary.assign(**columns)


def varying_axes(summary: pd.DataFrame) -> list[str]:
    """The point's axes that take more than one value in `summary` (mode always); "-" (the axis does
    not apply, e.g. k of a baseline) is not a value."""
    def values(column: str) -> set:
        return {str(v) for v in summary[column] if str(v) != "-"}
    return [c for c in COLUMNS if c == "mode" or (c in summary and len(values(c)) > 1)]


def terminal_table(summary: pd.DataFrame) -> str:
    """The sweep's closing table: every axis that varies (so no two rows look alike) and each
    ratio or rate with its 95 % interval."""
    shown = {"tokens_per_s": None, **{m: ci_columns(m) for m in ("speedup_vs_cloud", "speedup_vs_edge",
                                                                 "speedup_vs_fastest_cloud", "speedup_vs_colocated",
                                                                 "acceptance_rate",
                                                                 "cloud_call_rate", "chrf_vs_cloud")}}
    table = summary[varying_axes(summary)].copy()
    for metric, interval in shown.items():
        if metric not in summary or summary[metric].isna().all():  # e.g. no split point: no co-located column
            continue
        table[metric] = [_with_interval(row[metric], *(row[c] for c in interval) if interval else ())
                         for _, row in summary.iterrows()]
    if "fastest_cloud" in summary and (summary["mode"] == Mode.CLOUD).sum() > summary["prompts"].nunique():
        table["fastest_cloud"] = summary["fastest_cloud"]  # several cloud-only points: say which one is meant
    return table.to_string(index=False)


def _with_interval(value, low=float("nan"), high=float("nan")) -> str:
    if value != value:
        return "-"
    if low != low or high != high:
        return f"{value:.3g}"
    return f"{value:.3g} [{low:.3g}-{high:.3g}]"
