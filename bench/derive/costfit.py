"""The cost model's inputs (bench/derive/costmodel.py) fitted from a results folder's raw records, and
every speculative point predicted **without its own timings**.

Where each input comes from:
  t_d, edge prefill   the edge-only baseline (same edge model, runtime, dtype, prompts): decode wall
                      seconds per token after the first, Σ(latency_s − ttft_s) / Σ(new_tokens − 1);
                      its ttft_s − t_d is the first draft step's extra (the prompt); a draft-free drafter: 0
  two runtimes        a `PLAIN+BLOCKS` cloud: V(T) and o as below in the blocks' runtime, the empty blocks'
                      step V_plain(1) + o_plain and the prefill from the plain runtime's cloud-only baseline
  V(1), o, prefill    the cloud-only baseline: forward seconds per token (cloud_s − prefill_s) / (new_tokens
                      − 1), the rest of its decode time per token is o; prefill_s − V(1) the first verify's extra
  V(T) = a + b·T      least squares over the cloud-only step (T = 1) and the verify forwards (trace
                      `cloud_tokens_in`, `cloud_s`; each generation's first call, which carries the prompt,
                      left out) of the *other* spec points on the same cloud model, runtime, dtype and
                      deployment that do not draft ahead (an edge drafting on shared cores slows the verify
                      it overlaps; the model adds that contention apart): leave-one-out, so a point's own
                      timings never enter its prediction
  link                the point's `link` (bench/core/network.py: RTT, rates) + the protocol's cost per call
                      (link_s per call minus the modelled transfer) of the *other* split points that do not
                      draft ahead (there a verdict landing mid-forward waits for it); bytes per
                      call (wire_up_bytes, wire_down_bytes per cloud call: counts, not timings) from the
                      acceptance group's split records, else network.escalation_bytes
  acceptance          the trace of every point with the same settings but the deployment (deployment, link,
                      overlap): drafted, accepted, correction/bonus per cycle; the guess rate from drafted-ahead
                      cycles (`ahead_guess` against the bonus), else the deepest position's conditional acceptance
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import replace

import numpy as np

from bench.core.network import NO_LINK, escalation_bytes, profile
from bench.core.point import FIELDS, Deployment, SplitCores
from bench.derive.costmodel import Acceptance, CostInputs, Link, Outcome, colocated, split
from specdec.core.drafters import NEEDS_MODEL
from specdec.errors import InputError
from specdec.settings import Mode, Overlap

DEPLOYMENT = ("deployment", "link", "overlap")  # what acceptance does not depend on
BASELINE_FIX = "rerun the sweep with --mode edge,cloud,spec"
EDGE_SIDE = ("edge", "dtype", "edge_runtime", "prompts")
CLOUD_SIDE = ("cloud", "dtype", "cloud_runtime", "prompts")


def point_key(record: dict) -> tuple:
    return tuple(str(record.get(name)) for name in FIELDS)


def columns_key(values) -> tuple:
    """A point's summary columns as text, to find a record's row in a summary: a record's None and a
    summary's "-" alike, a k of 2 and 2.0 alike."""
    def text(v) -> str:
        if v is None or (isinstance(v, float) and math.isnan(v)):
            return "-"
        return f"{float(v):g}" if isinstance(v, (int, float)) and not isinstance(v, bool) else str(v)
    return tuple(text(v) for v in values)


def _same(record: dict, point: dict, names: tuple[str, ...]) -> bool:
    return all(str(record.get(n)) == str(point.get(n)) for n in names)


def _ok(records: list[dict]) -> list[dict]:
    return [r for r in records if r.get("status", "ok") == "ok"]


def _label(point: dict) -> str:
    return " ".join(f"{n}={point.get(n)}" for n in ("mode", "k", "edge_runtime", "cloud_runtime", "dtype", "prompts",
                                                    "deployment", "link", "overlap") if point.get(n) is not None)


def _baseline(records: list[dict], point: dict, mode: str) -> list[dict]:
    side = EDGE_SIDE if mode == Mode.EDGE else CLOUD_SIDE
    runtime = "edge_runtime" if mode == Mode.EDGE else "cloud_runtime"
    found = [r for r in records if r["mode"] == mode and _same(r, point, side)
             and (r.get("new_tokens") or 0) > 1]
    if not found:
        raise InputError(f"no {mode}-only baseline for {_label(point)} ({mode} {point.get(mode)}, {runtime} "
                         f"{point.get(runtime)}, dtype {point.get('dtype')}, prompts {point.get('prompts')}): {BASELINE_FIX}")
    return found


def _decode_per_token_s(records: list[dict], seconds) -> float:
    return sum(seconds(r) for r in records) / sum(r["new_tokens"] - 1 for r in records)


def edge_inputs(records: list[dict], point: dict) -> dict:
    edge = _baseline(records, point, "edge")
    step_s = _decode_per_token_s(edge, lambda r: r["latency_s"] - r["ttft_s"])
    return {"draft_step_s": step_s, "edge_prefill_extra_s": max(float(np.mean([r["ttft_s"] for r in edge])) - step_s, 0.0)}


def verify_curve(records: list[dict], point: dict) -> dict:
    """The verify cost per tokens fed, V(T): the mean forward at each size measured (1 from cloud-only
    decoding, the others from the other spec points' verify calls) and the line a + b·T fitted through
    them (used past their ends); the overhead o and the cloud prefill's extra; without `point`'s records."""
    cloud = _baseline(records, point, "cloud")
    forward_s = _decode_per_token_s(cloud, lambda r: r["cloud_s"] - r["prefill_s"])
    overhead_s = max(_decode_per_token_s(cloud, lambda r: r["latency_s"] - r["ttft_s"]) - forward_s, 0.0)
    own, side = point_key(point), ("cloud", "dtype", "cloud_runtime", "deployment")
    by_tokens: dict[int, list[float]] = {1: [forward_s]}
    for r in records:
        if r["mode"] != Mode.SPEC or point_key(r) == own or not _same(r, point, side) or r.get("overlap") is True:
            continue  # drafting ahead on shared cores slows the verify it overlaps: the model adds that apart
        calls = [c for c in r.get("trace", []) if c["escalated"]]
        for c in calls[1:]:  # the first call carries the prompt: a prefill, not a verify
            if not c.get("ahead_chosen"):  # overlap "auto": only the cycles that ran sequentially
                by_tokens.setdefault(int(c["cloud_tokens_in"]), []).append(c["cloud_s"])
    if len(by_tokens) < 2:
        raise InputError(f"{_label(point)}: the verify cost curve needs verify times at another block size than this "
                         "point's own, from another spec point on the same cloud runtime and deployment: rerun the "
                         "sweep with two values of --k (e.g. --k 2,4) or both deployments")
    tokens = np.array(sorted(by_tokens), dtype=float)
    seconds = np.array([np.mean(by_tokens[int(t)]) for t in tokens])
    b, a = np.polyfit(tokens, seconds, 1)
    if b < 0 or a < 0:  # noise on a flat curve: a constant, or a line through the origin
        a, b = (float(seconds.mean()), 0.0) if b < 0 else (0.0, float(seconds @ tokens / (tokens @ tokens)))
    prefill_s = float(np.mean([r["prefill_s"] for r in cloud]))
    points = tuple((float(t), float(s)) for t, s in zip(tokens, seconds))
    return {"verify_a_s": float(a), "verify_b_s_per_token": float(b), "verify_points": points,
            "verify_overhead_s": overhead_s, "cloud_prefill_extra_s": max(prefill_s - forward_s, 0.0)}


def acceptance_group(records: list[dict], point: dict) -> list[dict]:
    names = tuple(n for n in FIELDS if n not in DEPLOYMENT)
    return [r for r in records if r["mode"] == Mode.SPEC and _same(r, point, names)]


def acceptance(group: list[dict]) -> Acceptance:
    """The group's cycle outcomes pooled over its records, and how often the edge guesses the bonus."""
    counts: Counter = Counter()
    guesses = right = 0
    per_position: list[int] = []
    for r in group:
        for c in r.get("trace", []):
            emitted = c["accepted"] + (c.get("extra_kind") is not None)
            counts[(len(c["draft_tokens"]), c["accepted"], emitted, bool(c["escalated"]))] += 1
            if c.get("ahead_guess") is not None and c.get("extra_kind") == "bonus":
                guesses, right = guesses + 1, right + (c["ahead_guess"] == c.get("extra_token"))
        for i, n in enumerate(r.get("accepted_per_position") or []):
            per_position += [0] * (i + 1 - len(per_position))
            per_position[i] += n
    total = sum(counts.values())
    if not total:
        raise InputError("no spec cycles recorded for this point's settings: its records have no trace")
    outcomes = tuple(Outcome(n / total, *key) for key, n in sorted(counts.items()))
    if guesses:
        guess_rate = right / guesses
    else:  # the guess is one more position: its conditional acceptance ≈ the deepest one measured
        deep = [n for n in per_position if n]
        blocks = sum(r.get("num_drafts") or 0 for r in group)
        guess_rate = deep[-1] / (deep[-2] if len(deep) > 1 else blocks) if deep and blocks else 0.0
    return Acceptance(outcomes, min(guess_rate, 1.0))


def _mean_per_call(group: list[dict], field: str) -> float | None:
    calls = sum(r.get("cloud_calls") or 0 for r in group if r.get(field) is not None)
    return sum(r[field] for r in group if r.get(field) is not None) / calls if calls else None


def link_inputs(records: list[dict], point: dict, group: list[dict], mean_drafted: float) -> dict:
    """The point's link (its `link` setting) with the protocol cost of the other split points."""
    if point.get("deployment") != Deployment.SPLIT:
        return {}
    shape = profile(str(point.get("link") or NO_LINK))
    split_group = [r for r in group if r.get("deployment") == Deployment.SPLIT]
    up, down = _mean_per_call(split_group, "wire_up_bytes"), _mean_per_call(split_group, "wire_down_bytes")
    if up is None or down is None:
        up, down = escalation_bytes(round(mean_drafted) + 1, 0, 2)
    own = point_key(point)
    # A verdict that lands mid-forward waits for it, which is not the link's time: never from points that
    # draft ahead on every cycle, and from `overlap = "auto"` points (whose ahead cycles overlap the edge's
    # time with the wait) only when the folder has no sequential split point to take it from.
    others = [r for r in records if r["mode"] == Mode.SPEC and r.get("deployment") == Deployment.SPLIT and point_key(r) != own
              and r.get("cloud_calls") and r.get("overlap") is not True]
    sequential = [r for r in others if r.get("overlap") is False]
    protocol: list[float] = []
    bookkeeping: dict[int | None, list[float]] = {}
    for r in sequential or others:
        other = profile(str(r.get("link") or NO_LINK))
        per_call = (r.get("link_s") or 0.0) / r["cloud_calls"]
        protocol.append(per_call - other.transfer_s(r.get("wire_up_bytes", 0) / r["cloud_calls"],
                                                    r.get("wire_down_bytes", 0) / r["cloud_calls"]))
        rest = r["latency_s"] - (r.get("edge_s") or 0.0) - (r.get("link_s") or 0.0) - (r.get("cloud_s") or 0.0)
        bookkeeping.setdefault(r.get("k"), []).append(rest / r["cloud_calls"])
    link = Link(shape.rtt_s, shape.uplink_bps, shape.downlink_bps, max(float(np.median(protocol)), 0.0) if protocol else 0.0)
    # The edge engine's own time per call that is neither drafting, the link nor the server (acceptance,
    # rollback, the message): it grows with the block (median 8 ms at k = 1, 19-24 ms at k = 8 on the
    # real pair), so it comes from the other split points at the same k, or at any k when none has it.
    same_k = bookkeeping.get(point.get("k")) or [v for values in bookkeeping.values() for v in values]
    call_overhead_s = max(float(np.median(same_k)), 0.0) if same_k else 0.0
    return {"link": link, "up_bytes_per_call": up, "down_bytes_per_call": down, "overlap": point.get("overlap") is True,
            "call_overhead_s": call_overhead_s}


def cores_shared_of(point: dict) -> bool:
    """Whether a split point's edge and server shared cores, as its record says (`split_cores`; records
    written before it existed: shared, the sweep's placement then)."""
    return point.get("split_cores", SplitCores.SHARED) != SplitCores.DISJOINT


def plain_runtime_inputs(records: list[dict], point: dict) -> tuple[dict, dict]:
    """(the point as its blocks' runtime sees it, the inputs a two-runtime cloud's plain runtime adds):
    for one runtime, (point, {})."""
    runtimes = str(point.get("cloud_runtime")).split("+")
    if len(runtimes) == 1:
        return point, {}
    plain = _baseline(records, {**point, "cloud_runtime": runtimes[0]}, "cloud")
    step_s = _decode_per_token_s(plain, lambda r: r["latency_s"] - r["ttft_s"])
    forward_s = _decode_per_token_s(plain, lambda r: r["cloud_s"] - r["prefill_s"])
    prefill_s = float(np.mean([r["prefill_s"] for r in plain]))
    return ({**point, "cloud_runtime": runtimes[-1]},
            {"plain_step_s": step_s, "cloud_prefill_extra_s": max(prefill_s - forward_s, 0.0)})


def fit_inputs(records: list[dict], point: dict, cores_shared: bool | None = None) -> CostInputs:
    """The model's inputs for `point` (a record or a row with the point's fields), from `records`
    without `point`'s own timings. cores_shared None: as the point's record says."""
    cores_shared = cores_shared_of(point) if cores_shared is None else cores_shared
    records = _ok(records)
    group = acceptance_group(records, point)
    accept = acceptance(group)
    mean_drafted = accept.mean(lambda o: o.drafted)
    output_tokens = float(np.mean([r["new_tokens"] for r in group]))
    blocks_point, plain = plain_runtime_inputs(records, point)
    verify, link = verify_curve(records, blocks_point), link_inputs(records, point, group, mean_drafted)
    if "call_overhead_s" in link:  # the cloud's own overhead o is a term of its own
        link["call_overhead_s"] = max(link["call_overhead_s"] - verify["verify_overhead_s"], 0.0)
    draft_free = str(point.get("drafter") or "model") not in NEEDS_MODEL  # no drafter field: written before plug-ins
    edge = {"draft_step_s": 0.0, "edge_prefill_extra_s": 0.0} if draft_free else edge_inputs(records, point)
    return CostInputs(acceptance=accept, output_tokens=output_tokens, cores_shared=cores_shared,
                      **edge, **{**verify, **plain}, **link)


def predict_point(records: list[dict], point: dict, cores_shared: bool | None = None) -> float:
    """Predicted tokens/s of a spec point: co-located in process, split (drafting ahead or not) over its
    link. A split point with `overlap = "auto"` is predicted at the better of the two ways, what its rule
    aims for (specdec/core/overlap.py), so its error also shows what the rule's warm-up and probes cost."""
    return predict_from(fit_inputs(records, point, cores_shared), point)


def predict_from(inputs: CostInputs, point: dict) -> float:
    """`predict_point` on inputs already fitted for `point`."""
    if point.get("deployment") != Deployment.SPLIT:
        return colocated(inputs).tokens_per_s
    if point.get("overlap") == Overlap.AUTO:
        return max(split(replace(inputs, overlap=False)).tokens_per_s, split(replace(inputs, overlap=True)).tokens_per_s)
    return split(inputs).tokens_per_s


def spec_points(records: list[dict]) -> list[dict]:
    """One representative record per spec point, in the folder's order."""
    seen: dict[tuple, dict] = {}
    for r in _ok(records):
        if r["mode"] == Mode.SPEC:
            seen.setdefault(point_key(r), r)
    return list(seen.values())
