"""`specbench profile` on the tiny pair: torch.profiler operator table always, py-spy flame graph
and speedscope file where ptrace is permitted; the report links the profile of its run."""
import argparse
import json
import re

import pandas as pd
import pytest

from bench.commands.options import add_run_options, run_argv
from bench.commands.profile import add_profile_parser
from bench.read.report import build_report
from specdec.errors import InputError
from tests.tiny import save_tiny_pair

pytestmark = pytest.mark.subprocess  # see CONTRIBUTING.md: the quick loop leaves these out


def profile_command(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="specbench")
    add_profile_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def test_run_argv_round_trips_the_run_options(tmp_path):
    parser = argparse.ArgumentParser()
    add_profile_parser(parser.add_subparsers(dest="command"))
    argv = ["--mode", "spec", "--edge", "e", "--cloud", "c", "--prompts", "p.jsonl", "--out", "prof", "--k", "3",
            "--entropy-threshold", "inf", "--no-chat-template", "--limit", "2", "--native", "--rate", "50"]
    args = parser.parse_args(["profile", *argv])
    rerun = argparse.ArgumentParser()
    add_run_options(rerun)
    again = rerun.parse_args(run_argv(args, tmp_path / "run"))
    for key, value in vars(again).items():
        assert value == (tmp_path / "run" if key == "out" else getattr(args, key)), key
    assert "--native" not in run_argv(args, tmp_path)  # profile options stay with py-spy


def test_profile_of_a_tiny_run(tmp_path, capsys):
    pair = save_tiny_pair(tmp_path / "models")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "prompt": t}) + "\n" for i, t in enumerate(["hi there", "one two"])))
    out = tmp_path / "profiles" / "tiny"
    run = ["--mode", "spec", "--edge", pair["edge"], "--cloud", pair["cloud"], "--prompts", str(prompts), "--out", str(out),
           "--k", "3", "--entropy-threshold", "0", "--policy", "greedy", "--dtype", "float32", "--max-new-tokens", "48"]
    with pytest.raises(InputError, match="--op-prompts must be >= 1, got 0"):
        profile_command(["profile", *run, "--op-prompts", "0"])
    # A sampling profiler must land samples inside the engine: a long enough run, sampled often.
    assert profile_command(["profile", *run, "--rate", "250"]) == 0
    assert capsys.readouterr().out.strip() == str(out)

    ops = pd.read_csv(out / "torch_ops.csv")
    assert list(ops.columns) == ["op", "calls", "self_cpu_us", "total_cpu_us", "self_cpu_percent"]
    assert ops["op"].str.startswith("aten::").any() and (ops["calls"] > 0).all()
    assert ops["self_cpu_us"].is_monotonic_decreasing
    assert (ops["total_cpu_us"] >= ops["self_cpu_us"] - 1e-3).all()
    assert abs(ops["self_cpu_percent"].sum() - 100) < 0.1
    assert "aten::" in (out / "torch_ops.txt").read_text()
    rows = [json.loads(line) for line in (out / "run" / "results.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == ["p0", "p1"] and all(r["status"] == "ok" for r in rows)
    status = json.loads((out / "profile.json").read_text())
    split = status["time_split"]
    assert split["prompts"] == 2 and split["cloud_calls"] == sum(r["cloud_calls"] for r in rows) > 0
    assert split["cloud_s_per_call"] == pytest.approx(split["cloud_s"] / split["cloud_calls"])

    page = build_report(out / "run", tmp_path / "report").read_text(encoding="utf-8")
    assert 'href="profile/torch_ops.csv"' in page and (tmp_path / "report" / "profile" / "torch_ops.csv").is_file()
    assert "aten::" in page  # the top operators are in the report

    py_spy = status["py_spy"]
    if py_spy["status"] != "ok":
        pytest.skip(f"py-spy could not sample here ({py_spy['status']}: {py_spy['reason']}); the operator table was checked")
    svg = (out / "flamegraph.svg").read_text()
    assert svg.lstrip().startswith("<?xml") and "<svg" in svg
    assert re.search(r"speculative_decode \(specdec/core/decode\.py:\d+\)", svg)  # the engine's frames were sampled
    speedscope = json.loads((out / "speedscope.json").read_text())
    assert speedscope["$schema"].startswith("https://www.speedscope.app/")
    assert any(frame["name"] == "speculative_decode" for frame in speedscope["shared"]["frames"])
    assert 'href="profile/flamegraph.svg"' in page


def test_profile_goes_on_when_py_spy_may_not_attach(tmp_path, monkeypatch, capsys):
    """In a container without CAP_SYS_PTRACE py-spy fails to read the process: the profile says
    so and still writes the run and the operator table."""
    import bench.measure.profiling

    fake = tmp_path / "py-spy"
    fake.write_text("#!/bin/sh\necho 'Error: Operation not permitted (os error 1)' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setattr(bench.measure.profiling, "_py_spy_executable", lambda: str(fake))
    pair = save_tiny_pair(tmp_path / "models")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "p0", "prompt": "hi there"}) + "\n")
    out = tmp_path / "prof"
    assert profile_command(["profile", "--mode", "edge", "--edge", pair["edge"], "--prompts", str(prompts),
                            "--out", str(out), "--dtype", "float32", "--max-new-tokens", "4"]) == 0
    assert "py-spy skipped: py-spy may not read the process's memory (ptrace" in capsys.readouterr().err
    status = json.loads((out / "profile.json").read_text())["py_spy"]
    assert status["status"] == "skipped" and "SYS_PTRACE" in status["reason"]
    assert (out / "torch_ops.csv").is_file() and (out / "run" / "results.jsonl").is_file()
    assert not (out / "flamegraph.svg").exists()
