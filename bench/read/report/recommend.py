"""Recommended operating points: for each prompt set, the point each rule picks, with the rule
and the numbers that made it win. Pure functions on the per-point summary.

Thresholds are the ones people used when they compared settings by hand: acceptance > 0.6 was
"good"; a healthy punctuation density is 10–25 % of characters.

A winner is only named as such when the sweep can tell it from the runner-up: when their 95 %
intervals (bench/derive/summary.py) on the rule's objective overlap, the "why" says the two are not
separable and `separable` is False. Speed is judged on the interval of the speed-up against one
baseline per prompt set, the fastest plain decoding measured (`speedup_vs_fastest_plain`): it ranks
the points as tokens/s does whatever runtimes the sweep has, and its paired bootstrap is the tighter
one. `speedup_vs_cloud` would compare points of different cloud runtimes against different
baselines; a summary without the fastest-plain columns is judged on it.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd

from bench.core.metric_registry import lower_is_better
from bench.read.report.pareto import point_labels, set_name
from specdec.core.policies import policies_that
from specdec.core.text import PUNCT_DENSITY_HEALTHY
from specdec.runtime_registry import default_runtime, runtimes
from specdec.settings import Mode

CHRF_TOLERANCE = 1.0  # chrF points (0–100 scale) a point may lose against cloud-only
# objective -> the summary metric whose 95 % interval says whether the winner beats the runner-up
# (the first of a tuple that the summary has)
INTERVAL_OF = {"tokens_per_s": ("speedup_vs_fastest_plain", "speedup_vs_cloud"), "cloud_call_rate": ("cloud_call_rate",)}
GOOD_ACCEPTANCE = 0.6  # accepted / verified draft tokens

# How a column is named in a "why" line, and how its value is written.
SHOWN = {
    "tokens_per_s": ("tokens/s", "{:.1f}"),
    "latency_with_network_p50_s": ("p50 latency with network", "{:.3f} s"),
    "chrf_vs_cloud": ("chrF vs cloud", "{:.1f}"),
    "acceptance_rate": ("acceptance", "{:.2f}"),
    "cloud_call_rate": ("cloud calls per block", "{:.2f}"),
    "speedup_vs_cloud": ("speed-up vs cloud-only", "{:.2f}×"),
    "speedup_vs_fastest_plain": ("speed-up vs the fastest plain decoding", "{:.2f}×"),
    "punct_density": ("punctuation density", "{:.1%}"),
}


@dataclass(frozen=True)
class Rule:
    name: str  # short id
    text: str  # the rule, as a reader reads it
    objective: str  # summary column optimised among the points that pass `condition`
    condition: Callable[[pd.DataFrame, pd.Series | None], pd.Series]  # (one set's points, its cloud-only point) -> mask
    condition_columns: tuple[str, ...] = ()  # columns the condition reads, shown in the "why"
    needs_cloud_baseline: bool = False


def _everything(points: pd.DataFrame, cloud: pd.Series | None) -> pd.Series:
    return pd.Series(True, index=points.index)


def _near_cloud(points: pd.DataFrame, cloud: pd.Series | None) -> pd.Series:
    assert cloud is not None  # its rules need the cloud baseline: `recommend` skips a set without one
    return points["chrf_vs_cloud"] >= cloud["chrf_vs_cloud"] - CHRF_TOLERANCE


def _good_acceptance(points: pd.DataFrame, cloud: pd.Series | None) -> pd.Series:
    return points["acceptance_rate"] >= GOOD_ACCEPTANCE


def _punct_in_band(points: pd.DataFrame, cloud: pd.Series | None) -> pd.Series:
    low, high = PUNCT_DENSITY_HEALTHY
    return points["punct_density"].between(low, high)


RULES = (
    Rule("fastest", "fastest overall, quality ignored (a reference: what the speed costs; edge-only, another "
                    "model, is never a pick)",
         "tokens_per_s", _everything),
    Rule("fastest_near_cloud", f"fastest within {CHRF_TOLERANCE:g} chrF point of cloud-only",
         "tokens_per_s", _near_cloud, ("chrf_vs_cloud",), needs_cloud_baseline=True),
    Rule("fastest_near_cloud_network",
         f"lowest median latency with the network, within {CHRF_TOLERANCE:g} chrF point of cloud-only",
         "latency_with_network_p50_s", _near_cloud, ("chrf_vs_cloud",), needs_cloud_baseline=True),
    Rule("fewest_calls", f"fewest cloud calls with acceptance ≥ {GOOD_ACCEPTANCE:g}",
         "cloud_call_rate", _good_acceptance, ("acceptance_rate",)),
    Rule("fastest_punct_band",
         "fastest with mean punctuation density in the {:.0%}–{:.0%} band".format(*PUNCT_DENSITY_HEALTHY),
         "tokens_per_s", _punct_in_band, ("punct_density",)),
)


def _shown(column: str, value) -> str:
    name, fmt = SHOWN.get(column, (column, "{:.3g}"))
    return f"{name} {fmt.format(value)}"


def recommend(summary: pd.DataFrame, rules: tuple[Rule, ...] = RULES) -> pd.DataFrame:
    """One row per (prompt set, rule): the chosen point (`label`, its summary index as `point`)
    and `why`. Ties on the objective go to more tokens/s, then higher chrF, then the earlier
    point. A rule nothing passes gets `label` None and the reason in `why`."""
    labels = point_labels(summary)
    rows = []
    for prompts, points in summary.groupby("prompts", sort=False):
        # edge-only is another model writing another text: a reference line in the figures, never a pick
        points = points[points["mode"] != Mode.EDGE]
        cloud_points = points[points["mode"] == Mode.CLOUD]
        cloud = cloud_points.iloc[0] if len(cloud_points) else None
        for rule in rules:
            row = {"prompts": prompts, "set": set_name(prompts), "rule": rule.name, "rule_text": rule.text,
                   "point": None, "label": None, "why": "", "separable": None}
            if rule.needs_cloud_baseline and cloud is None:
                why = "no cloud-only point for this prompt set to compare with (sweep with --mode cloud,...)"
                rows.append({**row, "why": why})
                continue
            passing = points[rule.condition(points, cloud).fillna(False).astype(bool) & points[rule.objective].notna()]
            if passing.empty:
                rows.append({**row, "why": "no point satisfies the rule"})
                continue
            ranked = passing.assign(_tps=passing["tokens_per_s"].fillna(float("-inf")),
                                    _chrf=passing["chrf_vs_cloud"].fillna(float("-inf")))
            ranked = ranked.sort_values([rule.objective, "_tps", "_chrf"],
                                        ascending=[lower_is_better(rule.objective), False, False], kind="stable")
            best = ranked.index[0]
            shown = dict.fromkeys((rule.objective, *rule.condition_columns, "tokens_per_s"))
            why = "; ".join(_shown(c, summary.at[best, c]) for c in shown)
            if rule.needs_cloud_baseline and cloud is not None:  # (a set without one was skipped above)
                why += f" (cloud-only chrF {cloud['chrf_vs_cloud']:.1f})"
            separable, against = _separable(summary, rule.objective, best, ranked.index[1] if len(ranked) > 1 else None)
            if separable is False:
                why += f"; NOT separable from the runner-up {labels[ranked.index[1]]}: {against}"
            rows.append({**row, "point": best, "label": labels[best], "why": why, "separable": separable})
    # object dtype: `point` stays an index label and a missing pick stays None (not NaN)
    return pd.DataFrame(rows, columns=["prompts", "set", "rule", "rule_text", "point", "label", "why", "separable"],
                        dtype=object)


def _separable(summary: pd.DataFrame, objective: str, best, runner_up) -> tuple[bool | None, str]:
    """(whether the 95 % intervals of winner and runner-up on the objective are disjoint, the two
    intervals in words); None when there is no runner-up or no interval to judge by."""
    metric = next((m for m in INTERVAL_OF.get(objective, ()) if f"{m}_ci_low" in summary), None)
    if runner_up is None or metric is None:
        return None, ""
    (b_low, b_high), (r_low, r_high) = ((summary.at[i, f"{metric}_ci_low"], summary.at[i, f"{metric}_ci_high"])
                                        for i in (best, runner_up))
    if any(v != v for v in (b_low, b_high, r_low, r_high)):
        return None, ""
    name = SHOWN.get(metric, (metric.replace("_", " "), ""))[0]
    words = (f"95 % intervals of {name} overlap ({summary.at[best, metric]:.2f} [{b_low:.2f}–{b_high:.2f}] vs "
             f"{summary.at[runner_up, metric]:.2f} [{r_low:.2f}–{r_high:.2f}])")
    return bool(b_high < r_low or r_high < b_low), words


def drifting_runtimes() -> dict[str, str]:
    """A quantized cloud runtime -> why its greedy verify and its own one-token decoding part (its declaration's
    block_drift; bench/derive/summary.py compares a spec point's text with the cloud-only output of its own runtime)."""
    return {r.name: r.block_drift for r in runtimes() if r.block_drift}


def precision_notes(summary: pd.DataFrame) -> list[str]:
    """Plain words for greedy spec points whose text is not their cloud's own: in bf16 torch, and with a
    quantized cloud runtime, that is the arithmetic, not the acceptance rule, and fp32 torch shows it."""
    greedy = summary[(summary["mode"] == Mode.SPEC) & (summary["policy"].isin(policies_that("argmax")))]
    drifting, default = drifting_runtimes(), default_runtime()
    runtime = greedy["cloud_runtime"].where(greedy["cloud_runtime"].isin(drifting), default) \
        if "cloud_runtime" in greedy else pd.Series(default, index=greedy.index)
    notes = []
    torch_bf16 = greedy[(runtime == default) & (greedy["dtype"] == "bfloat16")]
    drifted = torch_bf16[torch_bf16["chrf_vs_cloud"] < 100]
    if len(drifted):
        low, high = drifted["chrf_vs_cloud"].min(), drifted["chrf_vs_cloud"].max()
        notes.append(f"bf16 greedy drifts: {len(drifted)} of {len(torch_bf16)} greedy spec points "
                     f"score chrF {low:.0f}–{high:.0f} against cloud-only, not 100. Greedy verification keeps "
                     "exactly the cloud's argmax, but in bf16 a (k+1)-token verify forward and one-token decoding "
                     "steps round differently, so a near-tie argmax can flip and the texts part from there. Exactness "
                     "holds in fp32: spec greedy equals cloud-only token for token (tests/test_lossless.py); rerun "
                     "with --dtype float32 to see it on these prompts.")
    for name, why in drifting.items():
        points = greedy[runtime == name]
        drifted = points[points["chrf_vs_cloud"] < 100]
        if len(drifted):
            low, high = drifted["chrf_vs_cloud"].min(), drifted["chrf_vs_cloud"].max()
            notes.append(f"{name} cloud greedy drifts: {len(drifted)} of {len(points)} greedy spec points verified in {name} "
                         f"score chrF {low:.0f}–{high:.0f} against that cloud decoding alone, not 100: {why}. The output is "
                         "the greedy output of the cloud's block verifier, not of its one-token decoding; read chrF below "
                         "100 as this drift, and verify in torch float32 where the cloud's own text must come back exactly.")
    return notes


def node_notes(rows: list[dict]) -> list[str]:
    """A comparison (the points of one prompt set and dtype, each speed-up taken against their
    baselines) whose timings come from more than one machine (records of `--executor ray` say which):
    a cluster's nodes differ in speed, so tokens/s and latencies mix machines. Speed-ups stay paired
    per prompt, and a prompt's points run on one node."""
    nodes: dict[tuple, set] = {}
    for row in rows:
        if row.get("status", "ok") == "ok" and isinstance(row.get("node"), dict):
            node = (row["node"].get("hostname"), row["node"].get("cpu_model"))
            nodes.setdefault((row.get("prompts"), row.get("dtype")), set()).add(node)
    return [f"{set_name(prompts)} ({dtype}): timing points come from {len(found)} different nodes "
            f"({'; '.join(f'{host}: {cpu}' for host, cpu in sorted(found, key=str))}). Tokens/s and latencies mix "
            "machines of different speed; speed-ups pair each prompt with its baselines on one node. Rerun on one "
            "node (or one machine type) before comparing absolute speeds."
            for (prompts, dtype), found in nodes.items() if len(found) > 1]
