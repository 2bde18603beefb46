"""The fleet report's capacity against the closed forms, on a synthetic fleet folder whose numbers
are worked out by hand: the paper's saturated factor 1 + γ·t_d/t_v times the measured cloud-only
throughput, and our cost model's server of N edges, each against the measured spec throughput
(error = predicted / measured − 1); the report renders them per cloud runtime."""
from __future__ import annotations

import json

import pytest

from bench.cli import main
from bench.derive.capacity import distance_check, edge_profile, mean_acceptance
from bench.derive.fleet_summary import cost_curve, read_fleet, summarize_fleet

K = 3
# Forwards of 4, 8 and 14 token ids (and a cloud-only step of 2) at 10 ms + 1 ms per token: the fit is
# a = 10 ms, b = 1 ms exactly.
FORWARDS = [(4, 0.014), (8, 0.018), (14, 0.024)]


def spec_record(level: str, clients: int, client: int, runtime: str) -> dict:
    # 12 tokens in 4 verifies of 3 drafts + 1 (alpha 3, m 4); 0.4 s waiting on verdicts, 0.168 s its own
    # (g = 42 ms per verify, so t_d = g / k = 14 ms per drafted token).
    return {"id": f"p{client}", "mode": "spec", "clients": clients, "client": client, "repeat": 0, "level_run": level,
            "cloud_runtime": runtime, "status": "ok", "new_tokens": 12, "verifies": 4, "positions": 16,
            "prompt_tokens": 10, "latency_s": 0.568, "tokens_per_s": 12 / 0.568, "verify_wait_s": [0.1] * 4,
            "server_queue_s": [0.0] * 4, "server_compute_s": [0.02] * 4, "replay_mismatches": 0, "edge_kind": "replay"}


def cloud_record(level: str, clients: int, client: int, runtime: str) -> dict:
    return {"id": f"p{client}", "mode": "cloud", "clients": clients, "client": client, "repeat": 0, "level_run": level,
            "cloud_runtime": runtime, "status": "ok", "new_tokens": 12, "verifies": 12, "positions": 12,
            "prompt_tokens": 10, "latency_s": 1.0, "tokens_per_s": 12.0, "verify_wait_s": [0.05] * 12,
            "server_queue_s": [0.0] * 12, "server_compute_s": [0.05] * 12, "tokens_match": True}


def write_folder(out, runtimes=("torch-int8",)) -> None:
    """Per runtime: spec at N = 1, 2 (walls 1 s: 12 and 24 tok/s), cloud-only at N = 1, 2 (walls 2 s
    and 1.6 s: 6 and 15 tok/s), and four forwards."""
    out.mkdir()
    records, levels, batches = [], [], []
    for runtime in runtimes:
        for mode, clients, wall in (("spec", 1, 1.0), ("spec", 2, 1.0), ("cloud", 1, 2.0), ("cloud", 2, 1.6)):
            level = f"{runtime}-{mode}-{clients}"
            levels.append({"mode": mode, "clients": clients, "repeat": 0, "level_run": level, "cloud_runtime": runtime,
                           "wall_s": wall, "generations": clients})
            make = spec_record if mode == "spec" else cloud_record
            records += [make(level, clients, client, runtime) for client in range(clients)]
        batches += [{"mode": "spec", "clients": 1, "repeat": 0, "level_run": f"{runtime}-spec-1", "cloud_runtime": runtime,
                     "t_s": 0.0, "rows": 1, "tokens": tokens, "max_block": tokens, "positions": tokens, "forward_s": seconds}
                    for tokens, seconds in FORWARDS]
        batches.append({"mode": "cloud", "clients": 2, "repeat": 0, "level_run": f"{runtime}-cloud-2",
                        "cloud_runtime": runtime, "t_s": 0.0, "rows": 2, "tokens": 2, "max_block": 1, "positions": 2,
                        "forward_s": 0.012})  # on the same line: 10 ms + 2 · 1 ms
    for name, rows in (("results.jsonl", records), ("levels.jsonl", levels), ("batches.jsonl", batches)):
        (out / name).write_text("".join(json.dumps(row) + "\n" for row in rows))
    config = {"prompts": "p.jsonl", "clients": [1, 2], "cloud": "m", "cloud_url": None, "cloud_runtime": runtimes[0],
              "edge_replay": "recorded", "link": "none", "dtype": "float32", "k": K, "policy": "greedy"}
    (out / "fleet.json").write_text(json.dumps({"config": config, "environment": {}}))


def test_the_closed_forms_error_against_the_measured_throughput(tmp_path):
    write_folder(tmp_path / "f")
    records, _, batches = read_fleet(tmp_path / "f")
    summary = summarize_fleet(tmp_path / "f")
    fit = cost_curve(batches)
    assert (fit["a_s"], fit["b_s_per_token"]) == (pytest.approx(0.010), pytest.approx(0.001))
    edge = edge_profile(records, summary, "none", None)
    curve, table, inputs = distance_check(fit, edge, summary, K)
    # t_d = 0.042 / 3 = 0.014 s, t_v = a + b·m = 0.010 + 0.001·4 = 0.014 s: factor 1 + 3·0.014/0.014 = 4.
    assert "factor 1 + γ·t_d/t_v = 4.000" in inputs[0]
    # Paper: cloud-only 6 and 15 tok/s × 4 = 24 and 60, against spec's 12 and 24: errors 1.0 and 1.5.
    # Ours: a cycle of 3·0.014 + 0.010 + 0.001·N·4 s emits 3 tokens: N = 1 → 3/0.056 = 53.571 tok/s
    # (error 3.4643), N = 2 → 2·3/0.060 = 100 tok/s (error 3.1667).
    assert table["clients"].tolist() == [1, 2]
    assert table["server tok/s measured"].tolist() == pytest.approx([12, 24])
    assert table["paper: cloud-only × factor"].tolist() == pytest.approx([24, 60])
    assert table["paper error"].tolist() == pytest.approx([1.0, 1.5])
    assert table["ours: server_tokens_per_s"].tolist() == pytest.approx([3 / 0.056, 100])
    assert table["ours error"].tolist() == pytest.approx([3 / 0.056 / 12 - 1, 100 / 24 - 1])
    assert curve["clients"].tolist() == [1, 2] and curve["ours"].tolist() == pytest.approx([3 / 0.056, 100])


def test_mean_acceptance_mixes_the_two_whole_outcomes_around_the_mean():
    mixed = mean_acceptance(2.5, K)
    assert [(o.weight, o.accepted, o.emitted) for o in mixed.outcomes] == [(0.5, 1, 2), (0.5, 2, 3)]
    assert mixed.emitted_per_cycle == pytest.approx(2.5)
    assert mean_acceptance(9.0, K).emitted_per_cycle == K + 1 and mean_acceptance(0.2, K).emitted_per_cycle == 1


def test_without_edge_time_of_its_own_the_model_says_why_instead_of_drawing(tmp_path):
    write_folder(tmp_path / "f")
    records, _, batches = read_fleet(tmp_path / "f")
    summary = summarize_fleet(tmp_path / "f")
    edge = {**edge_profile(records, summary, "none", None), "g_s": 0.0}
    curve, table, inputs = distance_check(cost_curve(batches), edge, summary, K)
    assert curve.empty and table.empty and "draft_step_s must be a finite number > 0" in inputs[0]


def test_the_report_tables_the_closed_forms_per_cloud_runtime(tmp_path):
    write_folder(tmp_path / "one")
    assert main(["report", str(tmp_path / "one"), "--out", str(tmp_path / "r1")]) == 0
    html = (tmp_path / "r1" / "index.html").read_text()
    assert "Capacity against the closed forms" in html and "cloud runtime torch-int8" in html
    assert "factor 1 + γ·t_d/t_v = 4.000" in html and "paper error" in html and "ours error" in html
    assert (tmp_path / "r1" / "figures" / "capacity.png").is_file()
    # Two runtimes in one folder (two --cloud-url servers): each its own summary rows, fit and table.
    write_folder(tmp_path / "two", ("torch", "torch-int8"))
    summary = summarize_fleet(tmp_path / "two")
    assert sorted(zip(summary["cloud_runtime"], summary["mode"], summary["clients"])) == sorted(
        (r, m, n) for r in ("torch", "torch-int8") for m in ("spec", "cloud") for n in (1, 2))
    assert summary["throughput_vs_cloud_only"].dropna().tolist() == pytest.approx([2.0, 1.6, 2.0, 1.6])
    assert main(["report", str(tmp_path / "two"), "--out", str(tmp_path / "r2")]) == 0
    html = (tmp_path / "r2" / "index.html").read_text()
    assert html.count("<h3>cloud runtime ") == 2 and html.count("factor 1 + γ·t_d/t_v = 4.000") == 2
