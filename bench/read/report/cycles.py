"""Per-cycle timelines of the Spec-Bench categories: why a drafter pays on one task and not another.

One panel per category, one typical question (the median of that category's questions by the
tokens per verify call τ its speculative rows reached): tokens emitted after the first token against
seconds after it. Each speculative way of decoding is a staircase from its record's trace, one step
per cycle (width: the cycle's time to its verdict; height: the draft tokens kept plus the cloud's
own token). The fastest plain decoding of the verifier's model on that category, on the same
question, is a straight line at its mean rate (its records keep no per-token clock). A staircase
above the plain line is ahead; steps of height 1 that are wider than the plain line's time per token
are blocks that cost more than they gave."""
from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
from matplotlib.lines import Line2D

from bench.core.point import COLUMNS
from bench.core.prompts import SPEC_BENCH, prompt_set_name
from bench.derive.spec_bench import METHOD, after_first_token, fastest_decoding, method_name, tokens_per_verify
from bench.derive.summary import load_rows, plain_label
from bench.read.report.fonts import subplots
from specdec.settings import Mode

READ = (
    "One typical question per category (the median by tokens per verify call), after its first token: every "
    "speculative way of decoding as a staircase, one step per cycle (across: the time to its verdict; up: the tokens it "
    "emitted, the kept draft plus the cloud's own token); the fastest plain decoding of the verifier's model on that "
    "category on the same question as a dashed line at its mean rate. A staircase that stays left of the dashed line "
    "is faster. Steps of height 1 wider than the plain line's time per token are blocks that cost more than they "
    "gave: where lookup finds nothing to copy, each verify still costs about one step of the verifier's runtime.")


def staircase(trace: list[dict]) -> tuple[list[float], list[float]]:
    """(seconds, tokens) after the first cycle's verdict, one point per later cycle (a step plot's corners)."""
    if not trace:
        return [], []
    start = trace[0]["t_reply_s"]
    xs, ys, emitted = [0.0], [0.0], 0
    for cycle in trace[1:]:
        emitted += cycle["accepted"] + (cycle.get("extra_token") is not None)
        xs.append(cycle["t_reply_s"] - start)
        ys.append(float(emitted))
    return xs, ys


def panels(rows: list[dict]) -> list[dict]:
    """Per Spec-Bench category: its question, the plain line (label, seconds and tokens after the first
    token) and each spec method's staircase (label, seconds, tokens)."""
    frame = load_rows(rows)
    if frame.empty or "prompts" not in frame:
        return []
    frame = frame[frame["status"] == "ok"]
    frame = frame[frame["prompts"].astype(str).str.startswith(SPEC_BENCH) & frame["mode"].isin(["spec", "cloud"])]
    if frame.empty:
        return []
    decoding = [after_first_token(row) for _, row in frame.iterrows()]
    frame = frame.assign(decode_tokens=[t for t, _ in decoding], decode_s=[s for _, s in decoding])
    out = []
    for prompts in dict.fromkeys(frame["prompts"]):
        here = frame[frame["prompts"] == prompts]
        plain_key = fastest_decoding(here, prompts)
        spec = here[here["mode"] == Mode.SPEC]
        if plain_key is None or spec.empty:
            continue
        plain = here[here[COLUMNS].apply(tuple, axis=1) == plain_key].set_index("id")
        taus = spec.groupby("id").apply(lambda g: tokens_per_verify(
            g[["num_accepted_tokens", "corrections", "bonus_tokens", "cloud_calls"]].fillna(0).sum()))
        taus = taus[taus.index.isin(plain.index)].sort_values()
        if taus.empty:
            continue
        question = taus.index[(len(taus) - 1) // 2]
        base = plain.loc[question]
        stairs = []
        for method, group in spec[spec["id"] == question].groupby(METHOD, sort=False, dropna=False):
            record = group.iloc[0]
            stairs.append((method_name(dict(zip(METHOD, method))), *staircase(record.get("trace") or [])))
        out.append({"category": prompt_set_name(prompts), "question": question, "tau": float(taus[question]),
                    "plain": (plain_label(dict(zip(COLUMNS, plain_key))), float(base["decode_s"]),
                              float(base["decode_tokens"])), "stairs": stairs})
    return out


def plot_cycles(rows: list[dict], path: Path) -> Path | None:
    found = panels(rows)
    if not found:
        return None
    columns = min(3, len(found))
    lines = math.ceil(len(found) / columns)
    fig, axes = subplots(lines, columns, figsize=(5.2 * columns, 3.9 * lines), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    handles: dict[str, Line2D] = {}
    for ax, panel in zip(axes.flat, found):
        for number, (label, xs, ys) in enumerate(panel["stairs"]):
            if xs:
                (line,) = ax.step(xs, ys, where="post", color=colors[number % len(colors)], linewidth=1.2)
                ax.plot(xs, ys, ".", color=colors[number % len(colors)], markersize=2.5)
                handles.setdefault(label, line)
        label, seconds, tokens = panel["plain"]
        (line,) = ax.plot([0, seconds], [0, tokens], "--", color="black", linewidth=1)
        handles.setdefault(f"plain: {label}", line)
        ax.set_title(f"{panel['category']} · {panel['question']} (τ {panel['tau']:.2f})", fontsize=9)
        ax.set_xlabel("seconds after the first token")
        ax.set_ylabel("tokens emitted")
    for ax in list(axes.flat)[len(found):]:
        ax.axis("off")
    fig.legend(handles.values(), handles.keys(), loc="lower center", ncol=2, fontsize=8, frameon=False,
               bbox_to_anchor=(0.5, -0.02 - 0.03 * math.ceil(len(handles) / 2)))
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path
