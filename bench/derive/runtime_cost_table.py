"""The runtime cost table, derived from the raw timings `bench/measure/runtime_costs.py` writes
(OUT/costs.jsonl, one line per configuration and round): per (model, runtime, threads) the ms of a
token step (median over rounds, p10-p90) and what a k+1-token verify block costs in token steps
(the ratio taken within each round, so a slow round slows both; median and p10-p90 over rounds); with prefills
timed, their tokens/s. `against_table` sets each runtime beside a reference runtime timed in the same rounds.
"""
from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from pathlib import Path

from specdec.errors import InputError

BLOCKS = range(2, 10)  # k + 1 for k = 1..8


def spread(values: list[float]) -> tuple[float, float, float]:
    """(median, p10, p90) of `values` (one value: itself three times)."""
    values = sorted(values)
    if len(values) == 1:
        return values[0], values[0], values[0]
    deciles = statistics.quantiles(values, n=10, method="inclusive")
    return statistics.median(values), deciles[0], deciles[-1]


def step_seconds(rounds: list[dict]) -> list[float]:
    """Each round's token step: the median of its timed steps (`step_s`)."""
    return [statistics.median(r["step_s"]) for r in rounds]


def block_steps(rounds: list[dict]) -> dict[int, list[float]]:
    """Per block of n = k + 1 tokens: its cost in token steps in each round, block_s[n] / that round's step."""
    steps = step_seconds(rounds)
    return {n: [r["block_s"][str(n)] / s for r, s in zip(rounds, steps)] for n in BLOCKS}


def read_rows(path: Path) -> list[dict]:
    """Every timing row of a costs.jsonl; a line that is not a row is one InputError naming it and the fix."""
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        try:
            row = json.loads(line)
            if not isinstance(row, dict) or not {"model", "runtime", "threads", "round"} <= row.keys():
                raise ValueError("not a timing row")
        except ValueError as e:
            raise InputError(f"{path}:{number} is not a runtime_costs timing row ({e}): delete that line (its round is "
                             "timed again) or give another --out") from None
        rows.append(row)
    return rows


def grouped(path: Path, keep: Callable[[dict], bool]) -> dict[tuple, list[dict]]:
    """The rows `keep` keeps, per (model, runtime, threads): each round's newest (a round timed again replaces the
    earlier timing), in round order."""
    latest: dict[tuple, dict[int, dict]] = {}
    for row in read_rows(path):
        if keep(row):
            latest.setdefault((row["model"], row["runtime"], row["threads"]), {})[row["round"]] = row
    return {config: [rounds[r] for r in sorted(rounds)] for config, rounds in latest.items()}


def table(path: Path, keep: Callable[[dict], bool] = lambda row: True) -> str:
    """Per (model, runtime, threads): step ms and each k+1 block in token steps, median [p10-p90] over rounds, of the
    rows `keep` keeps (runtime_costs: this run's configurations at their current version); a prefill column where
    the rows timed one."""
    rows = grouped(path, keep)
    prefills = any("prefill_s" in row for group in rows.values() for row in group)
    lines = ["model | runtime | threads | rounds | ms per token step | tok/s | "
             + " | ".join(f"k={n - 1} block (steps)" for n in BLOCKS) + (" | prefill tok/s" if prefills else ""),
             "--- | --- | --- | --- | --- | --- | " + " | ".join("---" for _ in BLOCKS) + (" | ---" if prefills else "")]
    for (model, runtime, threads), group in rows.items():
        step, low, high = spread(step_seconds(group))
        cells = []
        for ratios in block_steps(group).values():
            ratio, r_low, r_high = spread(ratios)
            cells.append(f"{ratio:.2f} [{r_low:.2f}-{r_high:.2f}]")
        if prefills:
            rates = [r["prefill_tokens"] / r["prefill_s"] for r in group if "prefill_s" in r]
            rate, r_low, r_high = spread(rates) if rates else (float("nan"),) * 3
            cells.append(f"{rate:.1f} [{r_low:.1f}-{r_high:.1f}]")
        lines.append(f"{model} | {runtime} | {threads} | {len(group)} | {step * 1e3:.1f} [{low * 1e3:.1f}-{high * 1e3:.1f}] | "
                     f"{1 / step:.1f} | " + " | ".join(cells))
    return "\n".join(lines)


def _ratio_cell(values: list[float]) -> str:
    if not values:
        return "-"
    values = sorted(values)
    return f"{statistics.median(values):.2f} [{values[0]:.2f}-{values[-1]:.2f}]"


def against_table(path: Path, reference: str, keep: Callable[[dict], bool] = lambda row: True, block: int = 5) -> str:
    """Per (model, runtime, threads) other than `reference`: against `reference`'s rows of the same model, threads,
    round and run (each ratio taken within a round, never across two runs' rows; median [min-max] over the rounds
    both timed), the step's time over the reference's, a `block`-token block in the reference's steps, and the
    prefill's speed-up (reference time / own)."""
    rows = grouped(path, keep)
    lines = [f"model | runtime | threads | rounds | step / {reference}'s | {block}-token block in {reference} steps | "
             f"prefill × {reference}", "--- | --- | --- | --- | --- | --- | ---"]
    for (model, runtime, threads), group in rows.items():
        if runtime == reference:
            continue
        base = {r["round"]: r for r in rows.get((model, reference, threads), [])}
        pairs = [(r, base[r["round"]]) for r in group if r["round"] in base and r.get("run") == base[r["round"]].get("run")]
        if not pairs:
            continue
        steps = [statistics.median(r["step_s"]) / statistics.median(b["step_s"]) for r, b in pairs]
        blocks = [r["block_s"][str(block)] / statistics.median(b["step_s"]) for r, b in pairs]
        prefill = [b["prefill_s"] / r["prefill_s"] for r, b in pairs if "prefill_s" in r and "prefill_s" in b]
        lines.append(f"{model} | {runtime} | {threads} | {len(pairs)} | {_ratio_cell(steps)} | {_ratio_cell(blocks)} | "
                     f"{_ratio_cell(prefill)}")
    return "\n".join(lines)
