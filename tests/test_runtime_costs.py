"""bench/measure/runtime_costs.py on tiny models: every (model, runtime, threads, round) is timed
once and written as it is taken, a rerun adds only the missing rounds, the table derives from the
raw lines, and an unknown runtime is one line. No timing is asserted: only what was recorded."""
from __future__ import annotations

import json
import os
import statistics

import pytest

from bench.derive.runtime_cost_table import BLOCKS, against_table, table
from bench.measure.runtime_costs import main

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def test_every_configuration_is_timed_once_per_round_and_a_rerun_adds_only_missing_rounds(pair, tmp_path, capsys):
    out = tmp_path / "costs"
    args = ["--models", f"{pair['edge']},{pair['cloud']}", "--runtimes", "torch,torch-int8", "--threads", "1,2",
            "--dtype", "float32", "--context", "16", "--out", str(out)]
    assert main([*args, "--rounds", "1"]) == 0
    first = (out / "costs.jsonl").read_text().splitlines()
    assert len(first) == 2 * 2 * 2  # models x runtimes x threads, one round
    assert main([*args, "--rounds", "2"]) == 0
    lines = (out / "costs.jsonl").read_text().splitlines()
    assert lines[: len(first)] == first and len(lines) == 2 * len(first)  # earlier lines kept byte for byte
    rows = [json.loads(line) for line in lines]
    assert {(r["model"], r["runtime"], r["threads"], r["round"]) for r in rows} == {
        (m, r, t, n) for m in (pair["edge"], pair["cloud"]) for r in ("torch", "torch-int8") for t in (1, 2) for n in (0, 1)}
    assert all(len(r["step_s"]) == 3 and set(r["block_s"]) == {str(n) for n in BLOCKS} for r in rows)
    for r in rows:  # each block size timed 3 times a round (the default), the round keeping their median
        assert all(len(r["block_runs"][str(n)]) == 3 and r["block_s"][str(n)] == statistics.median(r["block_runs"][str(n)])
                   for n in BLOCKS)
    derived = table(out / "costs.jsonl")
    assert len(derived.splitlines()) == 2 + 8 and "| torch-int8 | 2 | 2 |" in derived
    assert derived in capsys.readouterr().out


def test_an_unknown_runtime_is_one_line(pair, tmp_path, capsys):
    assert main(["--models", pair["edge"], "--runtimes", "onnx", "--threads", "1", "--out", str(tmp_path / "c")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: unknown runtime 'onnx'")


def test_threads_that_are_not_counts_are_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--threads", "a", "--out", str(tmp_path / "c")])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "--threads must list whole numbers >= 1" in err and "Traceback" not in err


def test_timings_of_another_version_are_timed_anew_and_left_out_of_the_table(pair, tmp_path, capsys):
    """A rerun after the runtime changed (a package upgraded, the kernels' sources edited) does not take the old
    rounds as done, and the table shows only this run's configurations at their current version."""
    out = tmp_path / "costs"
    args = ["--models", pair["edge"], "--runtimes", "torch", "--threads", "1", "--dtype", "float32", "--context", "8",
            "--rounds", "1", "--out", str(out)]
    assert main(args) == 0
    path = out / "costs.jsonl"
    old = json.loads(path.read_text().splitlines()[0])
    assert "torch" in old["version"] and "machine" in old["version"]
    path.write_text(json.dumps({**old, "version": "torch 0.0; machine elsewhere"}) + "\n"
                    + json.dumps({**old, "runtime": "torch-int8"}) + "\n")  # another version; a runtime not asked for
    capsys.readouterr()
    assert main(args) == 0
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(rows) == 3 and rows[-1]["version"] == old["version"]  # timed again at the current version
    printed = capsys.readouterr().out
    assert "| torch | 1 | 1 |" in printed and "torch-int8" not in printed


def test_a_kernels_path_is_timed_under_its_own_name_and_version(pair, tmp_path, capsys):
    """`K:PATH` (the kernels on one instruction-set path) is timed and named so, and its version is the path's sources."""
    from specdec.kernels import runnable_paths, source_digest

    if "avx2" not in runnable_paths():
        pytest.skip("this CPU runs no AVX2 path")
    out = tmp_path / "costs"
    assert main(["--models", pair["edge"], "--runtimes", "kernels-int8:avx2", "--threads", "1", "--context", "8",
                 "--rounds", "1", "--out", str(out)]) == 0
    row = json.loads((out / "costs.jsonl").read_text().splitlines()[0])
    assert row["runtime"] == "kernels-int8:avx2" and f"kernels avx2 {source_digest('avx2')}" in row["version"]
    assert "| kernels-int8:avx2 | 1 | 1 |" in capsys.readouterr().out


def test_prefills_are_timed_each_round_and_set_beside_the_reference(pair, tmp_path, capsys):
    """`--prefill N` times one N-token prefill per configuration and round; `--against` sets every other runtime
    beside the reference's rounds; a rerun without prefills does not take the prefill rows as its own."""
    out = tmp_path / "costs"
    args = ["--models", pair["edge"], "--runtimes", "torch,torch-int8", "--threads", "1", "--dtype", "float32",
            "--context", "8", "--rounds", "2", "--out", str(out), "--against", "torch"]
    assert main([*args, "--prefill", "24"]) == 0
    rows = [json.loads(line) for line in (out / "costs.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and all(r["prefill_tokens"] == 24 and r["prefill_s"] > 0 for r in rows)
    printed = capsys.readouterr().out
    assert "prefill tok/s" in printed and "prefill × torch" in printed
    assert "| torch-int8 | 1 | 2 |" in printed.split("prefill × torch")[1]  # both rounds paired with torch's
    assert main(args) == 0  # no prefill asked: the prefill rounds are another measurement, timed anew
    assert len((out / "costs.jsonl").read_text().splitlines()) == 8
    assert "prefill tok/s" not in capsys.readouterr().out


def test_the_reference_table_takes_each_ratio_within_a_round(tmp_path):
    """Step over the reference's, a 5-token block in the reference's steps, prefill speed-up: per round, then
    median [min-max]; a round the reference did not time is left out."""
    def row(runtime, round_, step, block5, prefill):
        return {"model": "m", "runtime": runtime, "threads": 2, "round": round_, "step_s": [step] * 3,
                "block_s": {str(n): block5 for n in BLOCKS}, "prefill_s": prefill, "prefill_tokens": 800}
    rows = [row("llamacpp", 0, 0.040, 0.16, 8.0), row("k", 0, 0.020, 0.060, 4.0),
            row("llamacpp", 1, 0.050, 0.20, 10.0), row("k", 1, 0.025, 0.050, 4.0), row("k", 2, 0.030, 0.030, 1.0)]
    path = tmp_path / "costs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    line = against_table(path, "llamacpp").splitlines()[-1]
    assert line == "m | k | 2 | 2 | 0.50 [0.50-0.50] | 1.25 [1.00-1.50] | 2.25 [2.00-2.50]"
    derived = table(path)
    assert "| 90.0 [" in derived and "| 200.0 [" in derived  # llamacpp: 800 tokens in 8 s and 10 s; k: 4, 4, 1 s


def test_a_round_is_timed_whole_and_ratios_pair_rows_of_one_run(tmp_path, capsys):
    """A configuration re-timed (its version changed) takes its round again for every configuration, so the reference
    beside it is timed in the same run; a ratio never pairs two runs' rows, and a round's newest rows are its own."""
    def row(runtime, round_, step, run):
        return {"model": "m", "runtime": runtime, "threads": 2, "round": round_, "step_s": [step] * 3, "run": run,
                "block_s": {str(n): 2 * step for n in BLOCKS}}
    path = tmp_path / "costs.jsonl"
    rows = [row("llamacpp", 0, 0.040, "a"), row("k", 0, 0.080, "a"),  # run a: k at 2x llama.cpp's step
            row("k", 0, 0.020, "b"),  # run b re-timed k alone: not beside run a's llama.cpp
            row("llamacpp", 1, 0.040, "c"), row("k", 1, 0.020, "c")]  # run c: round 1 whole, k at 0.5x
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    line = against_table(path, "llamacpp").splitlines()[-1]
    assert line.startswith("m | k | 2 | 1 | 0.50 [0.50-0.50] |")  # round 0's newest k (run b) has no partner
    assert "| k | 2 | 2 | 20.0 [" in table(path)  # k's rounds: run b's 20 ms and run c's 20 ms


def test_a_rerun_times_every_configuration_of_a_round_one_lacks(pair, tmp_path):
    out = tmp_path / "costs"
    args = ["--models", pair["edge"], "--runtimes", "torch,torch-int8", "--threads", "1", "--dtype", "float32",
            "--context", "8", "--rounds", "1", "--out", str(out), "--block-repeats", "1"]
    assert main(args) == 0
    path = out / "costs.jsonl"
    first = [json.loads(line) for line in path.read_text().splitlines()]
    path.write_text(json.dumps(first[0]) + "\n")  # torch-int8's round 0 lost: the round is incomplete
    assert main(args) == 0
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert sorted(r["runtime"] for r in rows[1:]) == ["torch", "torch-int8"]
    assert rows[1]["run"] == rows[2]["run"] != rows[0]["run"]  # both timed again, in one run


def test_block_repeats_below_one_are_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["--block-repeats", "0", "--out", str(tmp_path)])
    assert e.value.code == 2 and "--block-repeats must be >= 1" in capsys.readouterr().err


def test_a_negative_prefill_is_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--prefill", "-1", "--out", str(tmp_path / "c")])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "--prefill must be a token count >= 0" in err and "Traceback" not in err


def test_a_reference_that_is_not_timed_is_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--runtimes", "torch,torch-int8", "--against", "llamacpp", "--out", str(tmp_path / "c")])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "--against 'llamacpp' is not among --runtimes" in err and "Traceback" not in err


def test_a_damaged_timings_file_is_one_line_and_kept(tmp_path, capsys):
    out = tmp_path / "c"
    out.mkdir()
    (out / "costs.jsonl").write_text('{"model": broken\n')
    assert main(["--models", "x", "--runtimes", "torch", "--threads", "1", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "costs.jsonl:1 is not a runtime_costs timing row" in err[0] and "delete that line" in err[0]
    assert (out / "costs.jsonl").read_text() == '{"model": broken\n'  # nothing lost or rewritten
