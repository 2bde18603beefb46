"""The fleet's capacity model: how many edges one server carries at a target per-edge rate, derived
from a fleet folder's measured inputs (the per-forward cost curve of bench/derive/fleet_summary.py
and what one edge does alone). The fleet report prints it beside its error against the measured
fleet sizes; this module only computes.

The capacity model (on paper, from measured inputs; printed beside it with its error against the
measured fleet sizes). A forward feeding T token ids costs tau = a + b·T (the fitted cost curve).
A spec generation of n tokens takes V = n/alpha verifies of m tokens each and one prefill of its P
prompt tokens; its edge spends E = V·(g + rtt) of its own. With N edges, B of them in each forward:

  server work per generation   W(B) = V·(a/B + b·m) + a/B + b·P
  generation time              L = max(E + q·(V·(a + b·m·B) + a + b·P),  N·W(B))
                               (the edge's own time plus its waits, q = 1 + rho·(1 - 1/N)/2 for
                               the half forward it finds running; or the server's saturation bound)
  rows per forward             B = N·(L - E)/L   (edges waiting), solved with L by iteration
  per-edge rate n/L, server throughput N·n/L.

Cloud-only serving is the same with E = 0, V = n verifies of m = 1 token and alpha = 1 (tokens are
streamed: no round trip per token).

Beside it, two closed forms from the same measured inputs (`distance_check`), each against the
measured spec throughput at every measured N (error = predicted / measured − 1):

  paper   measured cloud-only throughput at N × (1 + γ·t_d / t_v)       ("Speculation at a Distance",
          arXiv 2606.25091, bench/derive/costmodel.py's distance_capacity_factor: the saturated server)
  ours    costmodel.server_tokens_per_s(x, N): N edges in lockstep, one forward of N rows a + b·N·(k + 1)
          per cycle of k·t_d + rtt + that forward

with γ = k, t_d = g / k (one edge's own time per verify spread over its k drafts, so k·t_d is what it
measured), t_v = a + b·m (one verify alone on the fitted curve), and the cycle outcomes mixed from the
two whole ones around alpha tokens per verify (`mean_acceptance`).
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from bench.core.network import profile
from bench.core.records import read_records
from bench.derive.costmodel import Acceptance, CostInputs, Link, Outcome, distance_capacity_factor, server_tokens_per_s
from specdec.errors import ConfigError
from specdec.settings import Mode

FLEET_SIZES = (100, 1000)
TARGETS = (0.8, 0.5)  # target per-edge rates, as fractions of one edge's measured rate alone


def edge_profile(records: list[dict], summary: pd.DataFrame, link: str, replay: str | None) -> dict | None:
    """What one edge does alone (spec at the smallest N): tokens per verify (alpha), tokens fed per
    verify (m), its own time per verify (g: drafting, outside the wait), prompt and output lengths
    (P, n), and the link's RTT."""
    smallest = summary[summary["mode"] == Mode.SPEC]["clients"].min()
    alone = [r for r in records if r["mode"] == Mode.SPEC and r["status"] == "ok" and r["clients"] == smallest]
    verifies = sum(r["verifies"] for r in alone)
    if not verifies:
        return None
    prompts = [r["prompt_tokens"] for r in alone if r.get("prompt_tokens")]
    if not prompts and replay and (Path(replay) / "results.jsonl").is_file():  # older fleet records: the recording's
        prompts = [r["prompt_tokens"] for r in read_records(Path(replay) / "results.jsonl") if r.get("prompt_tokens")]
    edge_s = sum(r["latency_s"] - sum(r["verify_wait_s"]) for r in alone)
    return {"alpha": sum(r["new_tokens"] for r in alone) / verifies,
            "m": sum(r["positions"] for r in alone) / verifies,
            "g_s": max(edge_s, 0.0) / verifies, "rtt_s": profile(link).rtt_s,
            "P": float(np.mean(prompts)) if prompts else 0.0,
            "n": sum(r["new_tokens"] for r in alone) / len(alone)}


def predict(clients: int, fit: dict, edge: dict, cloud_only: bool = False) -> tuple[float, float]:
    """(per-edge tokens/s, server tokens/s) the model gives for `clients` at once (module docstring)."""
    a, b, n, P = fit["a_s"], fit["b_s_per_token"], edge["n"], edge["P"]
    alpha, m, own = (1.0, 1.0, 0.0) if cloud_only else (edge["alpha"], edge["m"], edge["g_s"] + edge["rtt_s"])
    verifies = n / alpha
    mine = verifies * own
    length = mine + verifies * (a + b * m) + a + b * P  # alone
    for _ in range(500):
        rows = min(max(clients * (length - mine) / length, 1.0), clients)
        work = verifies * (a / rows + b * m) + a / rows + b * P
        rho = min(clients * work / length, 1.0)
        waits = (1 + rho * (1 - 1 / clients) / 2) * (verifies * (a + b * m * rows) + a + b * P)
        length = 0.5 * length + 0.5 * max(mine + waits, clients * work)
    return n / length, clients * n / length


def capacity_model(fit: dict, edge: dict | None, summary: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame, list[str]]:
    """(the model against the measured fleet sizes, edges per server at target rates with the
    servers 100 / 1,000 edges need, the assumptions)."""
    if edge is None or math.isnan(fit["a_s"]) or fit["b_s_per_token"] <= 0:
        return pd.DataFrame(), pd.DataFrame(), []
    check = []
    for _, row in summary.sort_values(["mode", "clients"]).iterrows():
        rate, server = predict(int(row["clients"]), fit, edge, cloud_only=row["mode"] == Mode.CLOUD)
        check.append({"mode": row["mode"], "clients": int(row["clients"]),
                      "per-edge tok/s measured": round(row["edge_tokens_per_s_p50"], 2),
                      "per-edge tok/s model": round(rate, 2),
                      "server tok/s measured": round(row["server_accepted_tokens_per_s"], 1),
                      "server tok/s model": round(server, 1),
                      "model / measured (server)": round(server / row["server_accepted_tokens_per_s"], 2)})
    alone = predict(1, fit, edge)[0]
    rows = []
    for share in TARGETS:
        target = share * alone
        row = {"target per-edge tok/s": f"{target:.2f} ({share:.0%} of one edge alone, modelled)"}
        for name, cloud_only in (("spec", False), ("cloud-only", True)):
            most = max_clients(fit, edge, target, cloud_only)
            row[f"edges per server ({name})"] = most
            for fleet in FLEET_SIZES:
                row[f"servers for {fleet:,} ({name})"] = math.ceil(fleet / most) if most else "—"
        rows.append(row)
    assumptions = [
        f"a forward costs a + b·tokens with a = {fit['a_s'] * 1e3:.1f} ms, b = {fit['b_s_per_token'] * 1e3:.3f} ms per "
        f"token (least squares over {fit['forwards']} measured forwards of up to {fit['tokens_max']:.0f} tokens, R² "
        f"{fit['r2']:.2f}); beyond that it is a straight line (compute-bound)",
        f"one edge alone: alpha = {edge['alpha']:.2f} tokens per verify, m = {edge['m']:.2f} tokens fed per verify, "
        f"g = {edge['g_s'] * 1e3:.0f} ms of its own per verify, rtt = {edge['rtt_s'] * 1e3:.0f} ms, prompts of "
        f"P = {edge['P']:.0f} tokens, generations of n = {edge['n']:.0f} tokens (this fleet's settings and prompts)",
        "closed loop; an edge waits for the forward it finds running (half of one on average, in proportion to the "
        "server's load) and then its own; unlimited --max-batch; KV-cache memory and the server's own overheads "
        "(protocol, sampling, policy) left out; one server = one copy of this machine",
        "cloud-only: one token per step per user, streamed (no round trip per token), the same cost curve",
        "the first table says how far the model is from what this fleet measured: trust the extrapolation no more",
    ]
    crossing = next((n for n in range(1, 4097) if predict(n, fit, edge, True)[1] >= predict(n, fit, edge)[1]), None)
    assumptions.append(f"by the model, cloud-only serving's throughput reaches speculative serving's at N = {crossing}"
                       if crossing else "by the model, cloud-only serving's throughput stays below speculative "
                                        "serving's up to N = 4,096")
    return pd.DataFrame(check), pd.DataFrame(rows), assumptions


def max_clients(fit: dict, edge: dict, target: float, cloud_only: bool, limit: int = 1 << 20) -> int:
    """The most clients whose modelled per-edge rate still reaches `target` (0: not even one)."""
    if predict(1, fit, edge, cloud_only)[0] < target:
        return 0
    low, high = 1, 2
    while high < limit and predict(high, fit, edge, cloud_only)[0] >= target:
        low, high = high, high * 2
    while high - low > 1:  # the rate falls with N: bisect
        middle = (low + high) // 2
        low, high = (middle, high) if predict(middle, fit, edge, cloud_only)[0] >= target else (low, middle)
    return low


def mean_acceptance(tokens_per_verify: float, k: int) -> Acceptance:
    """Blocks of k drafts emitting `tokens_per_verify` on average: the two whole outcomes around it
    (j and j + 1 accepted, each plus its correction or bonus), mixed to that mean."""
    emitted = min(max(tokens_per_verify, 1.0), k + 1.0)
    low = min(math.floor(emitted), k)  # emits `low` (low − 1 accepted) or low + 1
    share = emitted - low
    outcomes = [Outcome(1 - share, k, low - 1, low)] + ([Outcome(share, k, low, low + 1)] if share > 0 else [])
    return Acceptance(tuple(outcomes))


def fleet_cost_inputs(fit: dict, edge: dict, k: int) -> CostInputs:
    """bench/derive/costmodel.py's inputs from a fleet's fitted cost curve and one edge alone (module docstring).
    The cost model takes t_d = 0 (a draft-free drafter); the paper's factor 1 + γ·t_d / t_v would read it as
    no gain, so a fleet's edge must have spent time of its own."""
    if not (isinstance(edge["g_s"], (int, float)) and edge["g_s"] > 0):
        raise ConfigError(f"draft_step_s must be a finite number > 0 (the edge's own time per drafted token), "
                          f"got {edge['g_s'] / k!r}")
    return CostInputs(draft_step_s=edge["g_s"] / k, verify_a_s=fit["a_s"], verify_b_s_per_token=fit["b_s_per_token"],
                      acceptance=mean_acceptance(edge["alpha"], k), output_tokens=edge["n"], link=Link(rtt_s=edge["rtt_s"]))


def distance_check(fit: dict, edge: dict | None, summary: pd.DataFrame, k: int) -> tuple[pd.DataFrame, pd.DataFrame, list[str]]:
    """(the two closed forms for N = 1 .. the largest measured N, their error against the measured
    spec throughput at each measured N, the inputs they read); empty with the reason where an input
    is missing (module docstring)."""
    spec = summary[summary["mode"] == Mode.SPEC].set_index("clients")["server_accepted_tokens_per_s"]
    cloud = summary[summary["mode"] == Mode.CLOUD].set_index("clients")["server_accepted_tokens_per_s"]
    if edge is None or spec.empty or math.isnan(fit["a_s"]):
        return pd.DataFrame(), pd.DataFrame(), ["needs spec levels and a fitted cost curve"]
    try:
        x = fleet_cost_inputs(fit, edge, k)
    except ConfigError as e:  # a fit below zero, an edge that spent no time of its own: no model to draw
        return pd.DataFrame(), pd.DataFrame(), [f"the cost model cannot take this fleet's inputs: {e}"]
    verify_s = fit["a_s"] + fit["b_s_per_token"] * edge["m"]
    factor = distance_capacity_factor(k, x.draft_step_s, verify_s)
    largest = int(max(spec.index.max(), cloud.index.max() if not cloud.empty else 1))
    curve = pd.DataFrame({"clients": range(1, largest + 1)})
    curve["ours"] = [server_tokens_per_s(x, int(n))[1] for n in curve["clients"]]
    curve["paper"] = [cloud.get(n, math.nan) * factor for n in curve["clients"]]
    rows = []
    for n, measured in spec.items():
        ours, paper = curve.loc[curve["clients"] == n, ["ours", "paper"]].iloc[0]
        rows.append({"clients": int(n), "server tok/s measured": measured,
                     "paper: cloud-only × factor": paper, "paper error": paper / measured - 1,
                     "ours: server_tokens_per_s": ours, "ours error": ours / measured - 1})
    inputs = [f"γ = k = {k}, t_d = {x.draft_step_s * 1e3:.2f} ms per drafted token, t_v = a + b·m = "
              f"{verify_s * 1e3:.2f} ms: factor 1 + γ·t_d/t_v = {factor:.3f}",
              f"ours: {edge['alpha']:.2f} tokens per verify, rtt {edge['rtt_s'] * 1e3:.0f} ms, a = {fit['a_s'] * 1e3:.2f} "
              f"ms, b = {fit['b_s_per_token'] * 1e3:.3f} ms per token; no queueing, no prefill, edges in lockstep"]
    return curve, pd.DataFrame(rows), inputs
