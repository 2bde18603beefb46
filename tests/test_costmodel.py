"""The cost model (bench/derive/costmodel.py) on hand-computed answers, and `specbench predict` on a
synthetic results folder written with the code's own record writer (bench/core/records.py)."""
from __future__ import annotations

import math
from dataclasses import replace

import pandas as pd
import pytest

from bench.cli import main
from bench.core.network import profile
from bench.core.point import Point, blank
from bench.core.records import ResultsFile, result_record
from bench.derive.costfit import fit_inputs, point_key, predict_point, spec_points
from bench.derive.costmodel import (
    Acceptance,
    CostInputs,
    Link,
    Outcome,
    cloud_only,
    cloud_server_tokens_per_s,
    colocated,
    distance_capacity_factor,
    drafting_ahead,
    expected_emitted,
    sequential,
    server_tokens_per_s,
    split,
)
from specdec.core.trace import Counters, Cycle, Generation
from specdec.errors import ConfigError

T_D, A, B, T_O = 0.01, 0.02, 0.005, 0.001  # edge step, verify a + b·T, verify overhead (seconds)


def inputs(alpha=0.5, k=2, rtt_s=0.05, **extra) -> CostInputs:
    return CostInputs(draft_step_s=T_D, verify_a_s=A, verify_b_s_per_token=B, verify_overhead_s=T_O,
                      acceptance=Acceptance.geometric(alpha, k), link=Link(rtt_s), **extra)


# --- the formulas -------------------------------------------------------------------------------
def test_the_textbook_expected_length_is_a_special_case():
    assert expected_emitted(0.5, 3) == pytest.approx((1 - 0.5 ** 4) / 0.5) == pytest.approx(1.875)
    assert Acceptance.geometric(0.5, 3).emitted_per_cycle == pytest.approx(1.875)
    assert Acceptance.geometric(0.8, 4).emitted_per_cycle == pytest.approx(expected_emitted(0.8, 4))
    assert Acceptance.geometric(1.0, 4).emitted_per_cycle == expected_emitted(1.0, 4) == 5
    assert Acceptance.geometric(0.0, 4).emitted_per_cycle == 1


def test_sequential_split_and_co_located_cycles():
    x = inputs()  # E = (1 - 0.5^3) / 0.5 = 1.75 tokens per cycle
    seq = sequential(x)
    assert seq.cycle_s == pytest.approx(2 * T_D + T_O + 0.05 + A + B * 3)  # 0.106
    assert seq.time_per_token_s == pytest.approx(0.106 / 1.75)
    assert seq.tokens_per_s == pytest.approx(1.75 / 0.106)  # no prefill given
    assert seq.cloud_calls_per_token == pytest.approx(1 / 1.75)
    near = colocated(x)
    assert near.cycle_s == pytest.approx(2 * T_D + T_O + A + B * 3)  # 0.056: no link
    assert near.uplink_bytes_per_token == 0
    assert cloud_only(x).time_per_token_s == pytest.approx(A + B + T_O)


def test_prefill_is_paid_once_per_generation():
    x = inputs(edge_prefill_extra_s=0.04, cloud_prefill_extra_s=0.06, output_tokens=35.0)
    # 35 tokens = 20 cycles of 1.75 tokens, 0.056 s each, plus 0.1 s of prefill
    assert colocated(x).tokens_per_s == pytest.approx(35 / (0.1 + 20 * 0.056))


def test_drafting_ahead_keeps_a_block_only_when_whole_and_guessed():
    x = inputs(overlap=True, up_bytes_per_call=100.0)
    ahead = drafting_ahead(x)
    # wait W = 0.05 + 0.001 + 0.035 = 0.086 s: the guess and 2 ahead tokens fit (3 steps of 0.01);
    # kept with pi = P(both accepted) * P(guess) = 0.25 * 0.5 = 0.125
    assert ahead.ahead_kept_per_cycle == pytest.approx(0.125 * 2)
    assert ahead.ahead_wasted_per_cycle == pytest.approx(0.875 * 2)
    assert ahead.cycle_s == pytest.approx((2 - 0.25) * T_D + 0.086)
    assert ahead.uplink_bytes_per_token == pytest.approx(100 / 1.75)
    # shared cores: the 3 steps (0.03 s) outlast the 0.01 s link, the server is slowed by 0.02 s
    short = inputs(rtt_s=0.01, overlap=True)
    assert drafting_ahead(short).cycle_s == pytest.approx(0.0175 + 0.046)
    shared = inputs(rtt_s=0.01, overlap=True, cores_shared=True)
    assert drafting_ahead(shared).cycle_s == pytest.approx(0.0175 + 0.046 + 0.02)
    # nothing ever kept (a guess that is never right): drafting ahead costs nothing, gains nothing
    never = CostInputs(draft_step_s=T_D, verify_a_s=A, verify_b_s_per_token=B, verify_overhead_s=T_O, link=Link(0.05),
                       acceptance=Acceptance.geometric(0.5, 2, guess_rate=0.0))
    assert drafting_ahead(never).cycle_s == pytest.approx(sequential(never).cycle_s)


def test_a_short_last_block_counts_as_measured():
    accept = Acceptance((Outcome(0.5, 2, 2, 3), Outcome(0.5, 1, 1, 1)))  # a full block, and a last one of 1
    x = CostInputs(draft_step_s=T_D, verify_a_s=A, verify_b_s_per_token=B, acceptance=accept)
    assert colocated(x).cycle_s == pytest.approx(0.5 * (2 * T_D + A + 3 * B) + 0.5 * (T_D + A + 2 * B))
    assert colocated(x).time_per_token_s == pytest.approx(colocated(x).cycle_s / 2)


def test_a_server_of_n_edges_and_the_papers_capacity_factor():
    x = inputs(rtt_s=0.0)
    per_edge, server = server_tokens_per_s(x, 4)
    assert per_edge == pytest.approx(1.75 / (2 * T_D + T_O + A + B * 4 * 3))
    assert server == pytest.approx(4 * per_edge)
    assert cloud_server_tokens_per_s(x, 4) == pytest.approx(4 / (A + B * 4 + T_O))
    assert distance_capacity_factor(4, 0.01, 0.025) == pytest.approx(2.6)


def test_an_empty_block_is_a_plain_step_in_the_plain_runtime_of_a_two_runtime_cloud():
    """A draft-free drafter (t_d = 0): a 4-token block with 2 accepted half the time, an empty block (a
    plain step) the other half. One runtime: the empty block costs V(1) + o; two: the plain runtime's step."""
    outcomes = Acceptance((Outcome(0.5, 4, 2, 3), Outcome(0.5, 0, 0, 1)), 0.0)
    one = CostInputs(draft_step_s=0.0, verify_a_s=A, verify_b_s_per_token=B, verify_overhead_s=T_O, acceptance=outcomes)
    assert colocated(one).cycle_s == pytest.approx(0.5 * (T_O + A + 5 * B) + 0.5 * (T_O + A + B))
    assert colocated(one).time_per_token_s == pytest.approx(colocated(one).cycle_s / 2)
    two = replace(one, plain_step_s=0.004)
    assert colocated(two).cycle_s == pytest.approx(0.5 * (T_O + A + 5 * B) + 0.5 * 0.004)
    with pytest.raises(ConfigError, match="an empty block escalated"):
        Outcome(1.0, 0, 0, 0, escalated=False)


@pytest.mark.parametrize("bad", [dict(draft_step_s=-1.0), dict(draft_step_s=math.nan),
                                 dict(verify_a_s=0.0, verify_b_s_per_token=0.0), dict(output_tokens=0.0)])
def test_inputs_check_themselves(bad):
    values = dict(draft_step_s=T_D, verify_a_s=A, verify_b_s_per_token=B, acceptance=Acceptance.geometric(0.5, 2))
    with pytest.raises(ConfigError):
        CostInputs(**{**values, **bad})


# --- a synthetic results folder -----------------------------------------------------------------
PROMPT_TOKENS, EDGE_TTFT_S, CLOUD_PREFILL_S, N_PROMPTS = 20, 0.05, 0.1, 3
LINK = "rtt=20ms,up=1mbit,down=2mbit"
PROTOCOL_S, UP_BYTES, DOWN_BYTES = 0.003, 200, 80


def point(mode: str, **values) -> dict:
    base = {"mode": mode, "dtype": "float32", "prompts": "code", "edge": "e", "cloud": "c", "deployment": "inproc",
            "edge_runtime": "torch", "cloud_runtime": "torch", "max_new_tokens": 16, "policy": "greedy",
            "entropy_threshold": 0.0}
    return Point.from_row(blank({**base, **values})).record(sweep=True)


def plain(mode: str, prompt: int) -> dict:
    """Edge-only (t_d per token) or cloud-only (V(1) forward + o per token) decoding of 9 tokens."""
    n = 9
    if mode == "edge":
        gen = Generation(tokens=[5] * n, counters=Counters(cycles=n), text="one two", prefill_s=0.03,
                         ttft_s=EDGE_TTFT_S, decode_s=EDGE_TTFT_S + (n - 1) * T_D, edge_s=0.03 + (n - 1) * 0.008)
    else:
        gen = Generation(tokens=[5] * n, counters=Counters(cycles=n), text="one two", prefill_s=CLOUD_PREFILL_S,
                         ttft_s=CLOUD_PREFILL_S + T_O, decode_s=CLOUD_PREFILL_S + T_O + (n - 1) * (A + B + T_O),
                         cloud_s=CLOUD_PREFILL_S + (n - 1) * (A + B))
    return result_record(gen, point(mode), f"p{prompt}", gen.decode_s, 1)


def spec(k: int, prompt: int, deployment: str = "inproc", overlap: bool = False) -> dict:
    """A spec generation whose timeline is exactly the model's: per cycle n·t_d + o + V(n + 1) (+ the link)."""
    split = deployment == "split"
    shape = profile(LINK)
    link_s = shape.transfer_s(UP_BYTES, DOWN_BYTES) + PROTOCOL_S if split else 0.0
    pattern = [k, 0, k, 1][prompt % 2:] + [k]  # accepted per cycle; varies by prompt
    cycles, latency = [], (EDGE_TTFT_S - T_D) + (CLOUD_PREFILL_S - (A + B))  # the prefill's extra
    for i, accepted in enumerate(pattern):
        fed = PROMPT_TOKENS + k if i == 0 else k + 1
        verify_s = A + B * (k + 1) + CLOUD_PREFILL_S - (A + B) if i == 0 else A + B * fed
        wait_s = verify_s + link_s if split else 0.0
        cycles.append(Cycle(draft_tokens=[7] * k, entropies_nats=[0.1] * k, escalated=True, accepted=accepted,
                            extra_token=9, extra_kind="bonus" if accepted == k else "correction", edge_s=k * T_D,
                            cloud_s=verify_s, cloud_tokens_in=fed, wait_s=wait_s,
                            wire_up_bytes=UP_BYTES if split else 0, wire_down_bytes=DOWN_BYTES if split else 0))
        latency += k * T_D + T_O + link_s + A + B * (k + 1)
    counters = Counters(accepted_per_position=[0] * k)
    for c in cycles:
        counters.add(c)
    tokens = [7] * sum(c.accepted + 1 for c in cycles)
    gen = Generation(tokens=tokens, counters=counters, cycles=cycles, text="one two three", prompt_tokens=PROMPT_TOKENS,
                     prefill_s=0.03, ttft_s=0.2, decode_s=latency,
                     edge_s=(EDGE_TTFT_S - T_D) + sum(c.edge_s for c in cycles),  # the edge's prefill is edge time
                     cloud_s=sum(c.cloud_s for c in cycles))
    extra = {"link": LINK, "overlap": overlap} if split else {}
    return result_record(gen, point("spec", k=k, deployment=deployment, **extra), f"p{prompt}", latency, 1)


def write_folder(folder, records) -> None:
    folder.mkdir(exist_ok=True)
    results = ResultsFile(folder / "results.jsonl")
    for r in records:
        results.append(r)


def synthetic(split: bool = False) -> list[dict]:
    records = [plain(mode, i) for mode in ("edge", "cloud") for i in range(N_PROMPTS)]
    deployments = ("inproc", "split") if split else ("inproc",)
    return records + [spec(k, i, d) for d in deployments for k in (2, 4) for i in range(N_PROMPTS)]


def measured_tokens_per_s(records: list[dict], key: dict) -> float:
    own = [r for r in records if all(r.get(n) == v for n, v in key.items())]
    return sum(r["new_tokens"] for r in own) / sum(r["latency_s"] for r in own)


def test_predict_reproduces_a_known_configuration_exactly(tmp_path, capsys):
    records = synthetic(split=True)
    for key in ({"mode": "spec", "k": 2, "deployment": "inproc"}, {"mode": "spec", "k": 4, "deployment": "inproc"},
                {"mode": "spec", "k": 2, "deployment": "split"}, {"mode": "spec", "k": 4, "deployment": "split"}):
        rep = next(r for r in spec_points(records) if all(r.get(n) == v for n, v in key.items()))
        assert predict_point(records, rep) == pytest.approx(measured_tokens_per_s(records, key), rel=1e-9)
    write_folder(tmp_path / "r", records)
    assert main(["predict", str(tmp_path / "r")]) == 0
    table = pd.read_csv(tmp_path / "r" / "predictions.csv")
    assert len(table) == 4 and table["error"].abs().max() < 1e-9
    assert {"measured_tokens_per_s_ci_low", "measured_tokens_per_s_ci_high", "k", "deployment"} <= set(table)
    assert "median |error| 0.0%, largest 0.0%" in capsys.readouterr().out


def scaled(records: list[dict], key: dict, factor: float) -> list[dict]:
    """`records` with every timing of the records matching `key` multiplied by `factor`."""
    timed = ("latency_s", "ttft_s", "tpot_s", "edge_s", "cloud_s", "prefill_s", "link_s", "overhead_s")

    def change(r: dict) -> dict:
        if not all(r.get(n) == v for n, v in key.items()):
            return r
        trace = [{**c, "edge_s": c["edge_s"] * factor, "cloud_s": c["cloud_s"] * factor, "wait_s": c["wait_s"] * factor}
                 for c in r["trace"]]
        return {**r, **{t: r[t] * factor for t in timed if isinstance(r.get(t), (int, float))}, "trace": trace}

    return [change(r) for r in records]


@pytest.mark.parametrize("deployment", ["inproc", "split"])
def test_a_points_own_timings_never_enter_its_prediction(deployment):
    records = synthetic(split=True)
    own = {"mode": "spec", "k": 2, "deployment": deployment}
    rep = next(r for r in spec_points(records) if all(r.get(n) == v for n, v in own.items()))
    before = predict_point(records, rep)
    assert predict_point(scaled(records, own, 3.0), rep) == before
    # ... while another point's timings do move it (the curve is fitted on them): the test can fail
    other = {"mode": "spec", "k": 4, "deployment": deployment}
    assert predict_point(scaled(records, other, 3.0), rep) != pytest.approx(before)


@pytest.mark.parametrize("drop, fix", [("edge", "--mode edge,cloud,spec"), ("cloud", "--mode edge,cloud,spec")])
def test_a_missing_baseline_is_one_line(tmp_path, capsys, drop, fix):
    write_folder(tmp_path / "r", [r for r in synthetic() if r["mode"] != drop])
    assert main(["predict", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and len(err.splitlines()) == 1 and f"no {drop}-only baseline" in err and fix in err


def test_one_block_size_is_not_enough_for_the_verify_curve(tmp_path, capsys):
    write_folder(tmp_path / "r", [r for r in synthetic() if r.get("k") in (None, 2)])
    assert main(["predict", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--k 2,4" in err


USER = ["--edge-ms-per-token", "10", "--verify-cost", "20,5", "--rtt-ms", "5,200", "--bandwidth-mbps", "10"]


def test_predict_on_a_users_numbers(tmp_path, capsys):
    write_folder(tmp_path / "r", synthetic())
    assert main(["predict", *USER, "--acceptance-from", str(tmp_path / "r")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("rtt 5 ms: best k = ") and "vs cloud-only" in lines[0] and "co-located" in lines[0]
    assert lines[1].startswith("rtt 200 ms: best k = ") and "drafting ahead pays" in lines[1]  # a long wait to fill
    flat = [*USER[:2], "--verify-cost", "20,0", *USER[4:]]  # a verify that costs the same for any block
    assert main(["predict", *flat, "--acceptance-from", str(tmp_path / "r")]) == 0


@pytest.mark.parametrize("flag, value", [("--edge-ms-per-token", "-3"), ("--edge-ms-per-token", "0"),
                                         ("--edge-ms-per-token", "fast"), ("--verify-cost", "20"),
                                         ("--verify-cost", "20,-1"), ("--verify-cost", "0,2"), ("--rtt-ms", "nan"),
                                         ("--bandwidth-mbps", "0")])
def test_bad_user_numbers_are_one_line(tmp_path, capsys, flag, value):
    write_folder(tmp_path / "r", synthetic())
    args = list(USER)
    args[args.index(flag) + 1] = value
    assert main(["predict", *args, "--acceptance-from", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {flag} ") and len(err.splitlines()) == 1


def test_predict_needs_a_folder_or_all_numbers(tmp_path, capsys):
    assert main(["predict", "--edge-ms-per-token", "10"]) == 2
    assert main(["predict", str(tmp_path / "nothing")]) == 2
    assert [line.startswith("error:") for line in capsys.readouterr().err.strip().splitlines()] == [True, True]


def test_points_drafting_ahead_are_predicted_but_do_not_fit_the_verify_curve():
    """On shared cores an edge drafting ahead slows the verify it overlaps: those verify times stay out
    of the curve (the model adds the contention apart), and such points are predicted all the same."""
    records = synthetic(split=True)
    ahead = [spec(k, i, "split", overlap=True) for k in (2, 4) for i in range(N_PROMPTS)]
    sequential_point = next(r for r in spec_points(records) if r["deployment"] == "split" and r["k"] == 2)
    before = predict_point(records + ahead, sequential_point)
    assert predict_point(records + scaled(ahead, {"overlap": True}, 3.0), sequential_point) == before
    ahead_point = next(r for r in spec_points(ahead) if r["k"] == 2)
    assert predict_point(records + ahead, ahead_point) > 0


def test_an_auto_point_is_predicted_at_the_better_way_and_its_cycles_ahead_stay_out_of_the_curve():
    """overlap "auto" drafts ahead only on some cycles: its prediction is the better of sequential and
    drafting ahead (what its rule aims for), and only its sequential cycles fit the verify curve."""
    records = synthetic(split=True)
    auto = [{**r, "overlap": "auto", "trace": [{**c, "ahead_chosen": j % 2 == 1} for j, c in enumerate(r["trace"])]}
            for r in (spec(k, i, "split") for k in (2, 4) for i in range(N_PROMPTS))]
    auto_point = next(r for r in spec_points(auto) if r["k"] == 2)
    inputs = fit_inputs(records + auto, auto_point)
    both = [split(replace(inputs, overlap=way)).tokens_per_s for way in (False, True)]
    assert both[0] != both[1] and predict_point(records + auto, auto_point) == max(both)
    other = next(r for r in spec_points(records) if r["deployment"] == "split" and r["k"] == 2)
    before = predict_point(records + auto, other)
    slower_ahead = [{**r, "trace": [{**c, "cloud_s": c["cloud_s"] * (3.0 if c["ahead_chosen"] else 1.0)}
                                    for c in r["trace"]]} for r in auto]
    assert predict_point(records + slower_ahead, other) == before


def test_a_split_points_core_placement_comes_from_its_records():
    records = synthetic(split=True)
    ahead = [{**spec(k, i, "split", overlap=True), "split_cores": "disjoint"} for k in (2, 4) for i in range(N_PROMPTS)]
    point = next(r for r in spec_points(ahead) if r["k"] == 2)
    # the fit's link may differ, so compare with the same records fitted both ways
    assert predict_point(records + ahead, point) == predict_point(records + ahead, point, cores_shared=False)
    shared = {**point, "split_cores": "shared"}
    assert predict_point(records + ahead, shared) == predict_point(records + ahead, point, cores_shared=True)
    assert predict_point(records + ahead, shared) != predict_point(records + ahead, point)


def test_measured_verify_sizes_are_interpolated_and_the_line_carries_past_them():
    # One core, bf16: a 1-token step cost more than a 2-token verify (a matrix-vector path), so V is
    # the measured table, not one line. Between sizes: the chord; past them: the line's slope b.
    x = inputs(verify_points=((1.0, 0.364), (2.0, 0.336), (5.0, 0.375)))
    assert x.verify_s(1) == pytest.approx(0.364)
    assert x.verify_s(2) == pytest.approx(0.336)
    assert x.verify_s(3) == pytest.approx(0.336 + (0.375 - 0.336) / 3)
    assert x.verify_s(9) == pytest.approx(0.375 + B * 4)
    assert inputs().verify_s(3) == pytest.approx(A + 3 * B)  # no table: the line
    assert cloud_only(x).time_per_token_s == pytest.approx(0.364 + T_O)
    per_edge, server = server_tokens_per_s(x, 2)  # one forward of 2·(n + 1) tokens per lockstep cycle
    assert server == pytest.approx(2 * per_edge)
    with pytest.raises(ConfigError, match="increasing order"):
        inputs(verify_points=((2.0, 0.3), (1.0, 0.3)))
    with pytest.raises(ConfigError, match="verify_points seconds"):
        inputs(verify_points=((1.0, -0.1),))


def test_the_split_edges_own_time_per_call_adds_to_every_escalated_cycle():
    base, slow = inputs(), inputs(call_overhead_s=0.004)
    assert sequential(slow).cycle_s == pytest.approx(sequential(base).cycle_s + 0.004)  # every cycle escalates
    assert drafting_ahead(replace(slow, overlap=True)).cycle_s == pytest.approx(
        drafting_ahead(replace(base, overlap=True)).cycle_s + 0.004)
    assert colocated(slow).cycle_s == pytest.approx(colocated(base).cycle_s + 0.004)
    with pytest.raises(ConfigError, match="call_overhead_s"):
        inputs(call_overhead_s=-0.001)


def test_the_split_edges_own_time_per_call_is_fitted_from_the_other_split_points():
    records = synthetic(split=True)
    rep = next(r for r in spec_points(records) if r["k"] == 2 and r["deployment"] == "split")
    assert fit_inputs(records, rep).call_overhead_s == pytest.approx(0.0, abs=1e-12)  # the timeline has none
    slower = [{**r, "latency_s": r["latency_s"] + 0.004 * r["cloud_calls"]}
              if r["mode"] == "spec" and r["deployment"] == "split" and r["k"] == 4 else r for r in records]
    assert fit_inputs(slower, rep).call_overhead_s == pytest.approx(0.004)  # 4 ms per call on the k = 4 points
    assert fit_inputs(slower, next(r for r in spec_points(slower) if r["k"] == 2 and r["deployment"] == "inproc")
                      ).call_overhead_s == 0.0  # co-located: no link, no such term


def test_the_link_terms_come_from_sequential_split_points_when_the_folder_has_them():
    """An `overlap = "auto"` point's cycles ahead overlap the edge's time with the wait, so its per-call
    residue is not the protocol's or the bookkeeping's: with sequential split points beside it, it is left
    out; in a folder of auto points only, it is what there is."""
    records = synthetic(split=True)
    rep = next(r for r in spec_points(records) if r["k"] == 2 and r["deployment"] == "split")
    auto = [{**r, "overlap": "auto", "latency_s": r["latency_s"] + 0.02 * r["cloud_calls"],
             "link_s": r["link_s"] + 0.01 * r["cloud_calls"]}
            for r in (spec(k, i, "split") for k in (2, 4) for i in range(N_PROMPTS))]
    alone = fit_inputs(records, rep)
    beside = fit_inputs(records + auto, rep)
    assert beside.call_overhead_s == alone.call_overhead_s and beside.link.protocol_s == alone.link.protocol_s
    only_auto = [r for r in records if r.get("deployment") != "split" or point_key(r) == point_key(rep)] + auto
    fitted = fit_inputs(only_auto, rep)
    assert fitted.call_overhead_s == pytest.approx(0.01) and fitted.link.protocol_s == pytest.approx(alone.link.protocol_s + 0.01)


# --- draft-free drafters and a cloud held in two runtimes -----------------------------------------
P_FORWARD, P_O, P_PREFILL = 0.004, 0.0005, 0.2  # the plain runtime's step forward, its overhead, its prefill


def plain_in(runtime: str, prompt: int) -> dict:
    """Cloud-only decoding of 9 tokens in the plain runtime (its own step cost)."""
    n = 9
    gen = Generation(tokens=[5] * n, counters=Counters(cycles=n), text="one two", prefill_s=P_PREFILL,
                     ttft_s=P_PREFILL + P_O, decode_s=P_PREFILL + P_O + (n - 1) * (P_FORWARD + P_O),
                     cloud_s=P_PREFILL + (n - 1) * P_FORWARD)
    return result_record(gen, point("cloud", cloud_runtime=runtime), f"p{prompt}", gen.decode_s, 1)


def draft_free(prompt: int, cloud_runtime: str = "torch") -> dict:
    """Prompt lookup or auto: 3-token blocks and empty ones (plain steps), no drafting time. In one runtime
    every cycle costs o + V(n + 1); with two, an empty block costs the plain runtime's step."""
    two = "+" in cloud_runtime
    pattern = [(3, 3), (0, 0), (3, 1), (0, 0)][prompt % 2:] + [(3, 2)]  # (drafted, accepted)
    latency = (P_PREFILL - P_FORWARD) if two else (CLOUD_PREFILL_S - (A + B))
    cycles = []
    for drafted, accepted in pattern:
        if drafted == 0 and two:
            seconds, cloud_s = P_FORWARD + P_O, P_FORWARD
        else:
            seconds, cloud_s = T_O + A + B * (drafted + 1), A + B * (drafted + 1)
        cycles.append(Cycle(draft_tokens=[7] * drafted, entropies_nats=[], escalated=True, accepted=accepted,
                            extra_token=9, extra_kind="bonus" if accepted == drafted else "correction",
                            cloud_s=cloud_s, cloud_tokens_in=drafted + 1, drafter="auto" if two else "prompt-lookup"))
        latency += seconds
    counters = Counters(accepted_per_position=[0] * 3)
    for c in cycles:
        counters.add(c)
    gen = Generation(tokens=[7] * sum(c.accepted + 1 for c in cycles), counters=counters, cycles=cycles, text="one two",
                     prompt_tokens=PROMPT_TOKENS, ttft_s=0.2, decode_s=latency, cloud_s=sum(c.cloud_s for c in cycles))
    drafter = "auto" if two else "prompt-lookup"
    return result_record(gen, point("spec", k=3, drafter=drafter, cloud_runtime=cloud_runtime), f"p{prompt}", latency, 1)


def test_predict_reproduces_draft_free_points_in_one_runtime_and_in_two():
    """Exact on timelines that are the model's: no drafting time, empty blocks as plain steps, in the
    plain runtime's step cost and prefill where the cloud is held in two runtimes."""
    records = synthetic() + [plain_in("llamacpp", i) for i in range(N_PROMPTS)]
    records += [draft_free(i) for i in range(N_PROMPTS)] + [draft_free(i, "llamacpp+torch") for i in range(N_PROMPTS)]
    for key in ({"drafter": "prompt-lookup"}, {"drafter": "auto"}):
        rep = next(r for r in spec_points(records) if r.get("drafter") == key["drafter"])
        assert fit_inputs(records, rep).draft_step_s == 0.0
        assert predict_point(records, rep) == pytest.approx(measured_tokens_per_s(records, key), rel=1e-9)


def test_points_the_folder_has_no_inputs_for_are_left_out_by_name(tmp_path, capsys):
    """A Spec-Bench sweep has draft-free points (no edge model) and a model drafter's (no edge-only
    decoding measured): the first are predicted, the second named with what is missing."""
    records = [r for r in synthetic() if r["mode"] != "edge"] + [draft_free(i) for i in range(N_PROMPTS)]
    write_folder(tmp_path / "r", records)
    assert main(["predict", str(tmp_path / "r")]) == 0
    out = capsys.readouterr().out
    assert "1 spec points: median |error| 0.0%" in out
    assert out.count("left out spec float32 code greedy k=") == 2 and "no edge-only baseline" in out
    assert len(pd.read_csv(tmp_path / "r" / "predictions.csv")) == 1
