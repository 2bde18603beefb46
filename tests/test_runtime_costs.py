"""bench/measure/runtime_costs.py on tiny models: every (model, runtime, threads, round) is timed
once and written as it is taken, a rerun adds only the missing rounds, the table derives from the
raw lines, and an unknown runtime is one line. No timing is asserted: only what was recorded."""
from __future__ import annotations

import json
import os

import pytest

from bench.derive.runtime_cost_table import BLOCKS, table
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
