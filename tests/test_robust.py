"""No silent wrong result, no traceback: every bad input or bad luck a new user met (issue 11) is
one `error:` line and exit code 2, and the results already in a folder stay byte for byte as they
were. The cases are tables; what needs a process of its own (signals, a second writer) has its own
test below them."""
from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from bench.cli import main
from bench.core.folder import LOCK
from bench.core.records import ResultsFile
from specdec.models import integrity, registry

pytestmark = pytest.mark.subprocess  # see CONTRIBUTING.md: the quick loop leaves these out


def run_args(pair, prompts, out, *extra) -> list[str]:
    return ["run", "--mode", "edge", "--edge", pair["edge"], "--prompts", prompts, "--out", str(out),
            "--max-new-tokens", "8", "--dtype", "float32", *map(str, extra)]


@pytest.fixture(scope="module")
def earlier_run(pair, prompts, tmp_path_factory):
    """A finished 8-token edge run: the results a bad command must leave alone."""
    out = tmp_path_factory.mktemp("earlier") / "run"
    assert main(run_args(pair, prompts, out)) == 0
    return out


@pytest.fixture
def run_folder(earlier_run, tmp_path) -> Path:
    return Path(shutil.copytree(earlier_run, tmp_path / "run"))


def snapshot(folder: Path) -> dict:
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file() and p.name != LOCK}


def refused(argv: list[str], capsys, expect: str, folder: Path | None = None) -> str:
    """`specbench ARGV` exits 2 with one `error:` line holding `expect`, no traceback, and leaves
    `folder` as it was; returns that line."""
    before = snapshot(folder) if folder is not None else None
    capsys.readouterr()
    assert main([str(a) for a in argv]) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and expect in errors[0] and "Traceback" not in err, err
    if folder is not None:
        assert snapshot(folder) == before, "the earlier results changed"
    return errors[0]


# -- readers: run resume, compare, score and report read results with one reader ------------------------
def damage(folder: Path, how: str) -> None:
    path = folder / "results.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    if how == "middle line":
        lines[1] = '{"id": "p1", "mode": "edge", "tok\n'
    else:  # a record without a mode
        lines[1] = json.dumps({k: v for k, v in json.loads(lines[1]).items() if k != "mode"}) + "\n"
    path.write_text("".join(lines))


READERS = {
    "run resume": lambda pair, prompts, out, tmp: run_args(pair, prompts, out, "--limit", 3),
    "compare": lambda pair, prompts, out, tmp: ["compare", out, out, "--out", tmp / "cmp"],
    "score": lambda pair, prompts, out, tmp: ["score", out, "--model", pair["cloud"]],
    "report": lambda pair, prompts, out, tmp: ["report", out, "--out", tmp / "rep"],
}


@pytest.mark.parametrize("how,expect", [("middle line", "line 2 is not a JSON record"),
                                        ("no mode", "line 2 has no 'mode' field")])
@pytest.mark.parametrize("reader", sorted(READERS))
def test_a_damaged_results_file_is_one_line_naming_file_and_line(pair, prompts, run_folder, tmp_path, capsys, reader,
                                                                 how, expect):
    damage(run_folder, how)
    line = refused(READERS[reader](pair, prompts, run_folder, tmp_path), capsys, expect, run_folder)
    assert str(run_folder / "results.jsonl") in line


def test_a_torn_last_line_is_still_skipped_by_readers_and_redone_by_resume(pair, prompts, run_folder, tmp_path):
    path = run_folder / "results.jsonl"
    path.write_bytes(path.read_bytes()[:-20])  # killed mid-write
    assert main(["report", str(run_folder), "--out", str(tmp_path / "rep")]) == 0
    assert main(run_args(pair, prompts, run_folder)) == 0
    assert [r["id"] for r in ResultsFile(path).read()] == ["p0", "p1", "p2"]


# -- one folder, one identity ----------------------------------------------------------------------------
def sweep_args(pair, prompts, out, *extra) -> list[str]:
    return ["sweep", "--mode", "edge", "--edge", pair["edge"], "--cloud", pair["cloud"], "--prompts", prompts,
            "--out", str(out), "--max-new-tokens", "8", "--dtype", "float32", *map(str, extra)]


@pytest.fixture(scope="module")
def earlier_sweep(pair, prompts, tmp_path_factory):
    out = tmp_path_factory.mktemp("earlier") / "sweep"
    assert main(sweep_args(pair, prompts, out)) == 0
    return out


@pytest.fixture
def sweep_folder(earlier_sweep, tmp_path) -> Path:
    return Path(shutil.copytree(earlier_sweep, tmp_path / "sweep"))


IDENTITY = {  # case -> (command on the earlier folder, what the error says)
    "sweep into a run's folder": (lambda pair, prompts, run, sweep: sweep_args(pair, prompts, run),
                                  "holds the results of a `specbench run`; a sweep does not add to them"),
    "run into a sweep's folder": (lambda pair, prompts, run, sweep: run_args(pair, prompts, sweep, "--max-new-tokens", 4),
                                  "holds the results of a `specbench sweep`; a run does not add to them"),
    "run with another budget": (lambda pair, prompts, run, sweep: run_args(pair, prompts, run, "--max-new-tokens", 16),
                                "differs in max_new_tokens: 8 there, 16 here"),
    "run with another dtype and template": (
        lambda pair, prompts, run, sweep: run_args(pair, prompts, run, "--dtype", "bfloat16", "--no-chat-template"),
        'chat_template: true there, false here; dtype: "float32" there, "bfloat16" here'),
    "run with another model": (lambda pair, prompts, run, sweep: run_args(pair, prompts, run, "--edge", pair["cloud"]),
                               "differs in edge:"),
    "sweep with another budget": (lambda pair, prompts, run, sweep: sweep_args(pair, prompts, sweep, "--max-new-tokens", 16),
                                  "differs in max_new_tokens: 8 there, 16 here"),
}


@pytest.mark.parametrize("case", sorted(IDENTITY))
def test_a_folder_takes_results_of_one_kind_and_configuration(pair, prompts, run_folder, sweep_folder, capsys, case):
    command, expect = IDENTITY[case]
    argv = command(pair, prompts, run_folder, sweep_folder)
    refused(argv, capsys, expect, Path(argv[argv.index("--out") + 1]))


def test_relative_and_absolute_paths_are_one_configuration(pair, prompts, run_folder, monkeypatch, capsys):
    monkeypatch.chdir(Path(pair["edge"]).parent)
    argv = run_args(pair, prompts, run_folder)
    argv[argv.index("--edge") + 1] = "./edge"
    before = snapshot(run_folder)
    assert main(argv) == 0
    assert "nothing to do" in capsys.readouterr().err and snapshot(run_folder) == before


def test_records_say_whether_a_chat_template_was_really_used(pair, prompts, tmp_path):
    raw = Path(shutil.copytree(pair["edge"], tmp_path / "raw"))  # the same model, its tokenizer without a template
    (raw / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((raw / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (raw / "tokenizer_config.json").write_text(json.dumps(config))
    assert main(run_args(pair, prompts, tmp_path / "out", "--edge", raw)) == 0
    assert {r["chat_template"] for r in ResultsFile(tmp_path / "out" / "results.jsonl").read()} == {False}
    identity = json.loads((tmp_path / "out" / "run.json").read_text())
    assert identity["config"]["chat_template"] is True and identity["point"]["chat_template"] is False
    assert main(run_args(pair, prompts, tmp_path / "templated")) == 0
    assert {r["chat_template"] for r in ResultsFile(tmp_path / "templated" / "results.jsonl").read()} == {True}


def test_a_sweep_that_failed_before_its_first_result_does_not_refuse_the_corrected_one(pair, prompts, tmp_path, capsys):
    out = tmp_path / "s"
    refused(sweep_args(pair, prompts, out, "--edge-memory-gb", 100e3 / 2**30), capsys, "is below the edge model")
    assert (out / "sweep.json").is_file() and not (out / "results.jsonl").exists()
    assert main(sweep_args(pair, prompts, out)) == 0
    assert len(ResultsFile(out / "results.jsonl").read()) == 3


# -- settings: checked before anything loads or is written ------------------------------------------------
TOML = {
    "limit = 2.5": "limit must be an integer (or unset), got 2.5",
    "network = 5": "network must be text, got 5",
    'max_new_tokens = "eight"': "max_new_tokens must be an integer, got 'eight'",
    "max_new_tokens = 8.5": "max_new_tokens must be an integer, got 8.5",
    'seed = "x"': "seed must be an integer, got 'x'",
    "k = [2.5]": "k must be a list of integers, got [2.5]",
    "limit = 0": "limit must be >= 1",
    "chat_template = 1": "chat_template must be true or false, got 1",
}


@pytest.mark.parametrize("line", sorted(TOML))
def test_a_bad_toml_setting_is_named_and_nothing_is_written(pair, prompts, tmp_path, capsys, line):
    config = tmp_path / "sweep.toml"
    config.write_text(f"edge = '{pair['edge']}'\ncloud = '{pair['cloud']}'\nprompts = ['{prompts}']\n{line}\n")
    error = refused(["sweep", "--config", config, "--out", tmp_path / "o"], capsys, TOML[line])
    assert f"sweep config {config}" in error and not (tmp_path / "o").exists()


@pytest.mark.parametrize("limit", ["-3", "0"])
@pytest.mark.parametrize("command", ["run", "sweep"])
def test_limit_below_one_is_refused(pair, prompts, tmp_path, capsys, command, limit):
    args = run_args if command == "run" else sweep_args
    refused(args(pair, prompts, tmp_path / "o", f"--limit={limit}"), capsys,
            f"limit must be >= 1 (the first N prompts), got {limit}")
    assert not (tmp_path / "o").exists()


def test_a_budget_past_the_models_positions(pair, prompts, tmp_path, capsys):
    # The tiny models have 512 positions: no prompt fits 600 new tokens, refused once the model is known.
    refused(run_args(pair, prompts, tmp_path / "o", "--max-new-tokens", 600), capsys,
            "max_new_tokens 600 does not fit model")
    assert not (tmp_path / "o" / "results.jsonl").exists() and not (tmp_path / "o" / "run.json").exists()
    # 508 fits a 4-token prompt, not these: each is recorded failed with the reason, then one line.
    refused(run_args(pair, prompts, tmp_path / "o", "--max-new-tokens", 508), capsys, "3 of 3 samples failed")
    rows = ResultsFile(tmp_path / "o" / "results.jsonl").read()
    assert all(r["status"] == "failed" and "positions, but model" in r["error"] and "lower --max-new-tokens to" in r["error"]
               for r in rows)


# -- one writer at a time ----------------------------------------------------------------------------------
def test_a_second_writer_is_refused_with_the_holders_pid(pair, prompts, run_folder, sweep_folder, capsys):
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom pathlib import Path\nfrom bench.core.folder import writer\n"
         "with writer(Path(sys.argv[1])), writer(Path(sys.argv[2])):\n    print('held', flush=True)\n    time.sleep(60)",
         str(run_folder), str(sweep_folder)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        expect = f"is being written by another specbench process (pid {holder.pid})"
        refused(run_args(pair, prompts, run_folder), capsys, expect, run_folder)
        refused(sweep_args(pair, prompts, sweep_folder), capsys, expect, sweep_folder)
        refused(["score", sweep_folder, "--model", pair["cloud"]], capsys, expect, sweep_folder)
    finally:
        holder.kill()
        holder.wait()
    assert main(run_args(pair, prompts, run_folder)) == 0  # the lock went with its holder


# -- the filesystem at the edges ---------------------------------------------------------------------------
def test_an_out_that_is_a_file(pair, prompts, run_folder, tmp_path, capsys):
    path = tmp_path / "file"
    path.write_text("keep me")
    for argv in (run_args(pair, prompts, path), sweep_args(pair, prompts, path), ["report", run_folder, "--out", path],
                 ["compare", run_folder, run_folder, "--out", path]):
        refused(argv, capsys, f"{path} is a file, not a folder")
    assert path.read_text() == "keep me"
    refused(run_args(pair, prompts, path / "sub"), capsys, "part of that path is a file, not a folder")
    refused(["gate", "--save", path / "gate.json"], capsys, f"{path} is a file, not a folder")  # before measuring


@pytest.mark.parametrize("code,expect", [(errno.ENOSPC, "the disk is full; free some space and rerun"),
                                         (errno.EROFS, "is on a read-only filesystem"),
                                         (errno.EACCES, "permission denied")])
def test_a_disk_that_refuses_to_write(pair, prompts, run_folder, monkeypatch, capsys, code, expect):
    path = run_folder / "results.jsonl"
    earlier = path.read_bytes()
    path.write_bytes(earlier[: earlier.rfind(b"\n", 0, len(earlier) - 1) + 1])  # the last prompt still to do
    kept = path.read_bytes()

    def append(self, record):
        raise OSError(code, os.strerror(code), str(self.path))

    monkeypatch.setattr(ResultsFile, "append", append)
    line = refused(run_args(pair, prompts, run_folder), capsys, expect)
    assert str(path) in line and path.read_bytes() == kept


def test_specbench_home_naming_a_file(pair, prompts, tmp_path, monkeypatch, capsys):
    (tmp_path / "home").write_text("")
    monkeypatch.setenv("SPECBENCH_HOME", str(tmp_path / "home"))
    expect = f"the model cache {tmp_path / 'home'} (SPECBENCH_HOME) is a file, not a folder"
    refused(["models", "list"], capsys, expect)
    refused(["models", "fetch", "qwen2.5-coder-0.5b"], capsys, expect)
    refused(run_args(pair, prompts, tmp_path / "o", "--edge", "qwen2.5-coder-0.5b"), capsys, expect)


# -- models: a damaged cache, a folder that cannot load ------------------------------------------------------
ALIAS = "qwen2.5-coder-0.5b"


@pytest.fixture
def cached(pair, tmp_path, monkeypatch) -> Path:
    """A fake converted copy of a registry alias (the tiny edge) in a temporary SPECBENCH_HOME."""
    monkeypatch.setenv("SPECBENCH_HOME", str(tmp_path / "home"))
    folder = Path(shutil.copytree(pair["edge"], registry.model_dir(ALIAS)))
    marker = {"alias": ALIAS, "sha256": registry.get(ALIAS).sha256, "files": integrity.record(folder)}
    (folder / registry.MARKER).write_text(json.dumps(marker))
    return folder


def test_a_damaged_cache_is_reported_and_refused_with_the_repair(pair, prompts, cached, tmp_path, capsys):
    assert main(run_args(pair, prompts, tmp_path / "ok", "--edge", ALIAS)) == 0
    assert main(["models", "verify", ALIAS]) == 0 and f"{ALIAS:24} ok" in capsys.readouterr().out
    weights = cached / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))  # same size, other bytes: only a hash sees it
    assert registry.state(ALIAS) == "fetched"
    refused(["models", "verify", ALIAS], capsys, f"run `specbench models fetch {ALIAS}`")
    weights.write_bytes(data[: len(data) // 2])  # truncated: seen on every use
    main(["models", "list"])
    assert any(line.startswith(ALIAS) and "damaged" in line for line in capsys.readouterr().out.splitlines())
    refused(run_args(pair, prompts, tmp_path / "o", "--edge", ALIAS), capsys,
            f"the cached copy of '{ALIAS}' in {cached} is damaged (model.safetensors has {len(data) // 2} bytes, "
            f"{len(data)} when it was converted): run `specbench models fetch {ALIAS}` to fetch it again")


def test_a_damaged_bf16_copy_is_made_again(pair, prompts, cached, tmp_path, capsys):
    assert main(run_args(pair, prompts, tmp_path / "a", "--edge", ALIAS, "--dtype", "bfloat16")) == 0
    copy = cached / "bfloat16" / "model.safetensors"
    copy.write_bytes(copy.read_bytes()[:100])
    assert main(run_args(pair, prompts, tmp_path / "b", "--edge", ALIAS, "--dtype", "bfloat16")) == 0
    assert "copy of qwen2.5-coder-0.5b is damaged" in capsys.readouterr().err
    assert integrity.problems(cached / "bfloat16", None) == []


def model_folder(pair, tmp_path, how: str) -> Path:
    folder = Path(shutil.copytree(pair["edge"], tmp_path / how.replace(" ", "_")))
    weights = folder / "model.safetensors"
    if how == "truncated weights":
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    elif how == "no weights":
        weights.unlink()
    elif how == "config that does not fit":
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, "vocab_size": 96}))
    return folder


@pytest.mark.parametrize("how,expect", [
    ("truncated weights", "model.safetensors is truncated ("),
    ("no weights", "no file named model.safetensors"),
    ("config that does not fit", "its weights do not fit"),
])
def test_a_model_folder_that_cannot_load_is_one_line(pair, prompts, tmp_path, capsys, how, expect):
    folder = model_folder(pair, tmp_path, how)
    line = refused(run_args(pair, prompts, tmp_path / "o", "--edge", folder), capsys, expect)
    assert str(folder) in line
    if how == "config that does not fit":
        assert "lm_head.weight is [64, 64] in the weights, [96, 64] by the config" in line
    refused(["serve", "--model", folder], capsys, expect)


# -- serve and link ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("argv,expect", [
    (["serve", "--model", "CLOUD", "--port", "70000"], "port must be in [0, 65535], got 70000"),
    (["serve", "--model", "CLOUD", "--max-sessions", "0"], "max_sessions must be >= 1"),
    (["serve", "--model", "CLOUD", "--token-file", "/nonexistent/token"], "cannot read token file /nonexistent/token"),
    (["serve", "--model", "CLOUD", "--host", "no.such.host.invalid", "--token-file", "TOKEN"], "cannot serve on no.such.host"),
    (["link", "--to", "127.0.0.1:99999", "--preset", "4g"], "is not HOST:PORT"),
    (["link", "--to", "127.0.0.1:9", "--preset", "4g", "--jitter=-5ms"], "--jitter '-5ms' is not a duration"),
])
def test_serve_and_link_bad_input(pair, tmp_path, capsys, argv, expect):
    (tmp_path / "token").write_text("s3cret\n")
    files = {"CLOUD": pair["cloud"], "TOKEN": str(tmp_path / "token")}
    refused([files.get(a, a) for a in argv], capsys, expect)


# -- signals: a sweep stops its workers, and a killed sweep takes them with it --------------------------------
def start_sweep(pair, tmp_path) -> tuple[subprocess.Popen, Path, list]:
    """A sweep long enough to signal mid-way, once its worker has written a first record."""
    prompts = tmp_path / "many.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"b{i}", "prompt": f"hello number {i}"}) + "\n" for i in range(40)))
    out = tmp_path / "out"
    process = subprocess.Popen([sys.executable, "-m", "bench.cli", *sweep_args(pair, str(prompts), out, "--mode",
                                "cloud,edge,spec", "--max-new-tokens", 200)],
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    results, start = out / "results.jsonl", time.monotonic()
    while not (results.is_file() and results.stat().st_size):
        assert process.poll() is None and time.monotonic() - start < 120, process.stderr.read()
        time.sleep(0.05)
    return process, results, psutil.Process(process.pid).children(recursive=True)


@pytest.mark.parametrize("how", ["SIGTERM", "SIGINT to the group", "SIGKILL"])
def test_a_signalled_sweep_leaves_no_worker_behind(pair, tmp_path, how):
    process, results, children = start_sweep(pair, tmp_path)
    if how == "SIGINT to the group":  # Ctrl-C in a terminal
        os.killpg(process.pid, signal.SIGINT)
    else:
        os.kill(process.pid, getattr(signal, how))
    code = process.wait(60)
    err = process.stderr.read()
    _, alive = psutil.wait_procs(children, timeout=10)
    assert alive == [], f"left running: {alive}"
    written = results.read_bytes()
    time.sleep(1)
    assert results.read_bytes() == written  # nothing appends behind the user's back
    if how != "SIGKILL":
        assert code == 130 and "Traceback" not in err and "interrupted: results written so far are kept" in err, err
    rows = ResultsFile(results).read()
    assert len({(r["id"], r["mode"]) for r in rows}) == len(rows)
