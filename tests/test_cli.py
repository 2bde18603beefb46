"""The `specbench run` contract: records, edge-only never touching the cloud, resume, bad input."""
import json
import subprocess
import sys

import pytest

from bench.cli import main
from specdec.engine import Engine
from specdec.models.loading import load

pytestmark = pytest.mark.subprocess  # see CONTRIBUTING.md: the quick loop leaves these out

REQUIRED = (
    "id mode policy k entropy_threshold accept_threshold dtype tokens text new_tokens latency_s ttft_s cycles "
    "cloud_calls num_drafts num_draft_tokens num_accepted_tokens accepted_per_position acceptance_rate "
    "punct_density peak_rss_bytes"
).split()


@pytest.fixture
def prompts(tmp_path):
    path = tmp_path / "prompts.jsonl"
    texts = ["hello world", "what is one two", "yes no . ,", "say three"]
    lines = [{"id": f"p{i}", "prompt": text} for i, text in enumerate(texts)]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return path


def run_cli(*args):
    return main(["run", *map(str, args)])


def read(out):
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]


def test_spec_run_writes_contract_fields(pair, prompts, tmp_path):
    out = tmp_path / "spec"
    code = run_cli("--mode", "spec", "--edge", pair["edge"], "--cloud", pair["cloud"], "--prompts", prompts,
                   "--out", out, "--max-new-tokens", 12, "--k", 3, "--entropy-threshold", 0, "--policy", "greedy",
                   "--dtype", "float32")
    assert code == 0
    rows = read(out)
    assert [r["id"] for r in rows] == ["p0", "p1", "p2", "p3"]
    for row in rows:
        assert set(REQUIRED) <= set(row)
        assert row["new_tokens"] == len(row["tokens"]) and row["cloud_calls"] == row["cycles"]
    run_info = json.loads((out / "run.json").read_text())
    assert run_info["point"]["k"] == 3 and run_info["environment"]["torch"]


def test_spec_greedy_equals_cloud_mode_through_the_cli(pair, prompts, tmp_path):
    common = ["--prompts", prompts, "--max-new-tokens", 12, "--dtype", "float32"]
    assert run_cli("--mode", "cloud", "--cloud", pair["cloud"], "--out", tmp_path / "c", *common) == 0
    assert run_cli("--mode", "spec", "--edge", pair["edge"], "--cloud", pair["cloud"], "--policy", "greedy",
                   "--entropy-threshold", 0, "--out", tmp_path / "s", *common) == 0
    assert [r["tokens"] for r in read(tmp_path / "c")] == [r["tokens"] for r in read(tmp_path / "s")]


def test_edge_mode_never_loads_the_cloud(pair, prompts, tmp_path):
    # Through the CLI: a cloud that does not exist is never resolved.
    assert run_cli("--mode", "edge", "--edge", pair["edge"], "--cloud", tmp_path / "no-such-model",
                   "--prompts", prompts, "--out", tmp_path / "e", "--max-new-tokens", 5) == 0
    rows = read(tmp_path / "e")
    assert all(r["cloud_calls"] == 0 and r["cloud_s"] == 0 for r in rows)
    # Through the engine: the loader is asked for the edge only.
    asked = []

    def spy(name, settings, log=print):
        asked.append(name)
        return load(name, settings, log)

    engine = Engine(mode="edge", edge=pair["edge"], cloud=pair["cloud"], loader=spy)
    engine.generate("hello world")
    assert asked == [pair["edge"]]


def test_rerun_resumes_and_a_different_config_is_refused(pair, prompts, tmp_path, capsys):
    out = tmp_path / "r"
    args = ["--mode", "edge", "--edge", pair["edge"], "--prompts", prompts, "--out", out, "--max-new-tokens", 4]
    assert run_cli(*args) == 0
    rows = read(out)
    # Simulate a kill after two prompts, the second one cut mid-write.
    (out / "results.jsonl").write_text("\n".join(json.dumps(r) for r in rows[:2]) + "\n" + json.dumps(rows[2])[:30])
    assert run_cli(*args) == 0
    ids = [r["id"] for r in read(out) if True]
    assert ids == ["p0", "p1", "p2", "p3"]  # p0, p1 kept, the cut line redone, nothing recomputed twice
    assert run_cli(*args) == 0
    assert "nothing to do" in capsys.readouterr().err
    assert run_cli(*args[:-1], 9) == 2
    assert "different run configuration (differs in max_new_tokens: 4 there, 9 here)" in capsys.readouterr().err
    assert len(read(out)) == 4  # nothing lost


def _write(tmp_path, text, name="bad.jsonl"):
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    "case,extra,message",
    [
        ("unknown model", ["--mode", "edge", "--edge", "no-such-model"], "unknown model 'no-such-model'"),
        ("missing prompts", ["--mode", "edge", "--edge", "EDGE", "--prompts", "missing.jsonl"],
         "prompts file 'missing.jsonl' not found"),
        ("malformed line", ["--mode", "edge", "--edge", "EDGE", "--prompts", "MALFORMED"], "line 2 is not valid JSON"),
        ("empty prompt", ["--mode", "edge", "--edge", "EDGE", "--prompts", "EMPTY"], "has an empty prompt"),
        ("k < 1", ["--mode", "spec", "--edge", "EDGE", "--cloud", "CLOUD", "--k", "0"], "k must be >= 1, got 0"),
        ("accept threshold", ["--mode", "spec", "--edge", "EDGE", "--cloud", "CLOUD", "--accept-threshold", "1.5"],
         "must be in [0, 1], got 1.5"),
        ("negative entropy", ["--mode", "spec", "--edge", "EDGE", "--cloud", "CLOUD", "--entropy-threshold", "-1"],
         "entropy_threshold must be >= 0"),
        ("nan entropy", ["--mode", "spec", "--edge", "EDGE", "--cloud", "CLOUD", "--entropy-threshold", "nan"],
         "entropy_threshold must be >= 0"),
        ("spec without cloud", ["--mode", "spec", "--edge", "EDGE"], "--mode spec needs --cloud MODEL"),
        ("spec without models", ["--mode", "spec"], "--mode spec needs --edge MODEL and --cloud MODEL"),
        ("audio to text model", ["--mode", "edge", "--edge", "EDGE", "--prompts", "AUDIO"],
         "is text-only but the prompt has audio"),
        ("sample policy greedy", ["--mode", "spec", "--edge", "EDGE", "--cloud", "CLOUD", "--policy", "sample"],
         "needs temperature > 0"),
    ],
)
def test_bad_input_is_one_clear_line_and_exit_2(pair, prompts, tmp_path, capsys, case, extra, message):
    import numpy as np
    import soundfile

    soundfile.write(tmp_path / "clip.wav", np.zeros(1600, dtype="float32"), 16000)
    files = {
        "MALFORMED": _write(tmp_path, '{"id": "a", "prompt": "hello"}\n{"id": "b", "prompt": \n'),
        "EMPTY": _write(tmp_path, '{"id": "a", "prompt": "   "}\n', "empty.jsonl"),
        "AUDIO": _write(tmp_path, '{"id": "a", "prompt": "hello", "audio": "clip.wav"}\n', "audio.jsonl"),
        "EDGE": pair["edge"], "CLOUD": pair["cloud"],
    }
    argv = [str(files.get(a, a)) for a in extra]
    if "--prompts" not in argv:
        argv += ["--prompts", str(prompts)]
    assert main(["run", *argv, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err


def test_console_script_exits_2_without_traceback(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "bench.cli", "run", "--mode", "spec", "--edge", "x", "--cloud", "y", "--k", "0",
         "--prompts", "missing.jsonl", "--out", str(tmp_path)],
        capture_output=True, text=True,
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr and result.stderr.startswith("error: ")
