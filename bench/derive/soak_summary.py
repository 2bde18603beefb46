"""What a soak's rows say (bench/measure/serving/soak.py writes them): the checks the soak is judged by,
each with its figure and its rule. Measures nothing.

  nothing lost        every generation an edge started has an outcome row: its sequence numbers
                      run 0, 1, 2... without a gap in every incarnation of every edge
  verdicts            every finished generation got the recorded verdicts (0 replay mismatches);
                      a failed one names its reason (counted by reason)
  memory              the server's median RSS in `after` within 10 % of `before`'s
  end state           after the clients stop: 0 sessions, 0 connections (the sampler's own aside),
                      and the FDs and asyncio tasks the idle server had before the first client
  recovery            after each fault ends, the first sample whose FDs and sessions are back
                      within `before`'s range; a fault never recovered from fails
  p99 verify wait     `after` / `before` of the block verifies, with a bootstrap 95 % interval over
                      generations; within 20 % (the point estimate; the interval says how sure). A
                      generation's first verify carries its prompt (prefill and verify in one forward)
                      and is another population: its p99 is reported beside, not judged. Pooled, the
                      tail was the prefills' and followed how the edges' starts lined up: the first
                      20-minute real soak's edges started together and their prefills coincided before
                      the faults (p99 7.3 s) and not after the kills had scattered them (3.8 s), while
                      the block verifies' p99 stayed level (3.68 -> 3.51 s).
"""
from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import numpy as np

from bench.core.records import read_records

RSS_GROWTH = 0.10
P99_BAND = 0.20
RECOVERY_LIMIT_S = 60.0  # a vanished client's session goes at the ping timeout (20 s + 20 s) at the latest
BOOTSTRAP = 2000


def last_run(rows: list[dict]) -> list[dict]:
    """The rows of the last run that reached its end (an interrupted run's rows stay in the file)."""
    ended = [r["run"] for r in rows if r["kind"] == "end"]
    if not ended:
        return []
    return [r for r in rows if r["run"] == ended[-1]]


def read_soak(out: Path) -> list[dict]:
    return last_run(read_records(Path(out) / "results.jsonl", required=("kind", "run")))


def p99(values: list[float]) -> float:
    return float(np.percentile(values, 99)) if values else float("nan")


def flat(generations: list[list[float]]) -> list[float]:
    return [w for waits in generations for w in waits]


def p99_ratio(before: list[list[float]], after: list[list[float]], seed: int = 0) -> tuple[float, float, float]:
    """p99 of every verify wait in `after` over `before`'s; the interval resamples generations (a
    generation's waits move together) with replacement."""
    point = p99(flat(after)) / p99(flat(before))
    draw = random.Random(seed)
    ratios = sorted(p99(flat(draw.choices(after, k=len(after)))) / p99(flat(draw.choices(before, k=len(before))))
                    for _ in range(BOOTSTRAP))
    return point, ratios[int(0.025 * BOOTSTRAP)], ratios[int(0.975 * BOOTSTRAP) - 1]


def recoveries(samples: list[dict], faults: list[dict], fds_max: float, sessions_max: float) -> list[dict]:
    """Per fault, seconds from its end to the first sample back within `before`'s range (None: never)."""
    out = []
    for end in faults:
        back = next((s["t"] for s in samples if s["t"] >= end["at"] and s["sessions"] is not None
                     and s["fds"] <= fds_max and s["sessions"] <= sessions_max), None)
        out.append({"fault": end["fault"], "t": end["t"], "ended_s": end["at"],
                    "recovered_after_s": None if back is None else back - end["at"]})
    return out


def summarize_soak(rows: list[dict]) -> dict:
    """The checks (name -> {ok, figure, rule}) and the figures behind them."""
    samples = [r for r in rows if r["kind"] == "sample"]
    generations = [r for r in rows if r["kind"] == "generation"]
    ended = [r for r in rows if r["kind"] == "fault_end"]
    idle = next(r for r in rows if r["kind"] == "baseline")
    end = next(r for r in rows if r["kind"] == "end")
    phase = {name: [s for s in samples if s["phase"] == name] for name in ("before", "faults", "after")}
    if not phase["before"] or not phase["after"]:
        raise ValueError("a soak needs samples before and after its faults: run it longer")

    gaps = []
    by_edge: dict[tuple, list[int]] = {}
    for g in generations:
        by_edge.setdefault((g["client"], g["incarnation"]), []).append(g["seq"])
    for key, seqs in sorted(by_edge.items()):
        if sorted(seqs) != list(range(len(seqs))):
            gaps.append(f"edge {key[0]} incarnation {key[1]}: {sorted(seqs)}")
    ok = [g for g in generations if g["status"] == "ok"]
    failed = Counter(g["error"] for g in generations if g["status"] != "ok")
    mismatches = sum(g["replay_mismatches"] for g in ok)

    rss = {name: float(np.median([s["rss_bytes"] for s in phase[name]])) for name in ("before", "after")}
    growth = rss["after"] / rss["before"] - 1
    fds_max = max(s["fds"] for s in phase["before"])
    sessions_max = max(s["sessions"] for s in phase["before"] if s["sessions"] is not None)
    recovered = recoveries(samples, ended, fds_max, sessions_max)
    waits = {name: [g["verify_wait_s"][1:] for g in ok if g["phase"] == name and len(g["verify_wait_s"]) > 1]
             for name in ("before", "after")}
    firsts = {name: [g["verify_wait_s"][0] for g in ok if g["phase"] == name and g["verify_wait_s"]]
              for name in ("before", "after")}
    ratio, low, high = p99_ratio(waits["before"], waits["after"]) if all(waits.values()) else (float("nan"),) * 3
    first_p99 = {name: p99(values) * 1e3 if values else float("nan") for name, values in firsts.items()}
    end_state = {"sessions": end["sessions"], "connections": end["connections"],
                 "fds": f"{idle['fds']} -> {end['fds']}", "tasks": f"{idle['tasks']} -> {end['tasks']}"}

    checks = {
        "nothing lost": {"ok": not gaps, "figure": f"{len(generations)} generations, {len(by_edge)} edge incarnations"
                         + (f"; gaps: {'; '.join(gaps)}" if gaps else ""),
                         "rule": "every started generation has an outcome row"},
        "verdicts": {"ok": mismatches == 0 and bool(ok),
                     "figure": f"{len(ok)} finished, {mismatches} replay mismatches; failed: "
                               + (", ".join(f"{n} x {why}" for why, n in failed.most_common()) or "none"),
                     "rule": "every finished generation got the recorded verdicts; every failed one names why"},
        "memory": {"ok": growth < RSS_GROWTH, "figure": f"RSS {rss['before'] / 2**20:.0f} -> {rss['after'] / 2**20:.0f} MiB "
                                                      f"({growth:+.1%})",
                   "rule": f"median RSS after the faults within {RSS_GROWTH:.0%} of before"},
        "end state": {"ok": end["sessions"] == 0 and end["connections"] == 0 and end["fds"] == idle["fds"]
                      and end["tasks"] == idle["tasks"],
                      "figure": ", ".join(f"{k} {v}" for k, v in end_state.items()),
                      "rule": "clients gone: 0 sessions and connections, the idle server's FDs and tasks"},
        "recovery": {"ok": all(r["recovered_after_s"] is not None and r["recovered_after_s"] <= RECOVERY_LIMIT_S
                               for r in recovered),
                     "figure": ", ".join(f"{r['fault']} " + ("never" if r["recovered_after_s"] is None else
                                                             f"{r['recovered_after_s']:.0f} s") for r in recovered),
                     "rule": f"FDs <= {fds_max} and sessions <= {sessions_max} (before's maxima) within "
                             f"{RECOVERY_LIMIT_S:.0f} s of each fault's end"},
        "p99 verify wait": {"ok": abs(ratio - 1) <= P99_BAND,
                            "figure": f"block verifies after/before x{ratio:.2f} (95% CI {low:.2f}-{high:.2f}); "
                                      f"{p99(flat(waits['before'])) * 1e3:.0f} -> {p99(flat(waits['after'])) * 1e3:.0f} ms"
                                      if all(waits.values()) else "no block verify before or after the faults",
                            "rule": f"within {P99_BAND:.0%}; first verifies (with the prompt) "
                                    f"{first_p99['before']:.0f} -> {first_p99['after']:.0f} ms, not judged"},
    }
    return {"checks": checks, "recoveries": recovered, "generations": len(generations), "finished": len(ok),
            "failed": dict(failed), "rss_growth": growth, "p99_ratio": [ratio, low, high], "end": end, "idle": idle,
            "duration_s": max((s["t"] for s in samples), default=0.0)}
