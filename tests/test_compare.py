"""`specbench compare` on tiny data: two results folders or two gate files -> HTML + PNG and the
gate's verdict (exit 0 unchanged, 1 moved); bad inputs are one clear error."""
import argparse
import copy
import json
import shutil

import pytest

from bench.commands import compare as compare_command
from bench.core.records import ResultsFile
from bench.derive import gate_verdict
from bench.measure import tinypair
from bench.measure.run import run
from bench.read import compare
from specdec.core.config import DecodeConfig, SpecConfig
from specdec.engine import Engine
from specdec.errors import InputError
from specdec.machine import fingerprint

COMMITTED_TINY = min((gate_verdict.BASELINES / "tiny").glob("*.json"))  # a committed gate file, whichever class


def compare_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="specbench")
    compare_command.add_compare_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["compare", *argv])


@pytest.fixture(scope="module")
def results_dir(tmp_path_factory):
    """cloud, edge and spec results of the tiny pair on 2 prompts, in one folder (as a sweep writes)."""
    root = tmp_path_factory.mktemp("results")
    paths = tinypair.save_pair(root / "pair")
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "prompt": p}) + "\n" for i, p in enumerate(tinypair.PROMPTS[:2])))
    combined = ResultsFile(root / "base" / "results.jsonl")
    (root / "base").mkdir()
    for mode in ("cloud", "edge", "spec"):
        engine = Engine(mode=mode, edge=paths["edge"], cloud=paths["cloud"], dtype="float32",
                        spec=SpecConfig(k=4, entropy_threshold=0, policy="greedy"), decode=DecodeConfig(max_new_tokens=12),
                        log=lambda message: None)
        for row in run(engine, str(prompts), root / mode, progress=False):
            combined.append(row)
    return root / "base"


def edited_copy(src, dst, edit):
    shutil.copytree(src, dst)
    results = ResultsFile(dst / "results.jsonl")
    rows = [edit(row) or row for row in results.read()]
    results.path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return dst


def test_identical_results_pass_and_write_html_and_png(results_dir, tmp_path, capsys):
    out = tmp_path / "report"
    assert compare_command.cmd_compare(compare_args(str(results_dir), str(results_dir), "--out", str(out))) == 0
    page = (out / "compare.html").read_text()
    assert "gate passed" in page and 'src="compare.png"' in page and "acceptance_rate" in page
    assert (out / "compare.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "gate passed" in capsys.readouterr().out


def test_slower_spec_results_fail_on_the_speedup(results_dir, tmp_path, capsys):
    def slower_spec(row):
        if row["mode"] == "spec":
            row["latency_s"] *= 3

    current = edited_copy(results_dir, tmp_path / "slow", slower_spec)
    out = tmp_path / "report"
    assert compare_command.cmd_compare(compare_args(str(results_dir), str(current), "--out", str(out))) == 1
    printed = capsys.readouterr().out
    assert "speedup_vs_cloud" in printed and "gate FAILED" in printed
    assert "tokens_sha256" not in printed  # the outputs did not change
    assert "gate FAILED" in (out / "compare.html").read_text()


def test_lower_acceptance_in_results_fails_exactly(results_dir, tmp_path):
    def fewer_accepted(row):
        if row["mode"] == "spec":
            row["num_accepted_tokens"] -= 1

    rows = compare.compare_paths(results_dir, edited_copy(results_dir, tmp_path / "worse", fewer_accepted))
    moved = [r for r in rows if not r.ok]
    assert [(r.metric, r.better) for r in moved] == [("acceptance_rate", False)]


def test_gate_files_compare_with_the_gate_rules(tmp_path, capsys):
    base = gate_verdict.read_gate_file(COMMITTED_TINY)
    worse = copy.deepcopy(base)
    worse["timing"]["spec_vs_cloud"] *= 0.5
    worse["timing_repeats"]["spec_vs_cloud"] = [v * 0.5 for v in base["timing_repeats"]["spec_vs_cloud"]]
    worse["deterministic"]["spec.acceptance_rate"] -= 0.01
    for name, record in (("a.json", base), ("b.json", worse)):
        gate_verdict.write_gate_file(tmp_path / name, record)
    out = tmp_path / "report"
    assert compare_command.cmd_compare(compare_args(str(tmp_path / "a.json"), str(tmp_path / "a.json"), "--out", str(out))) == 0
    assert compare_command.cmd_compare(compare_args(str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--out", str(out))) == 1
    printed = capsys.readouterr().out
    assert "spec_vs_cloud" in printed and "spec.acceptance_rate" in printed
    assert (out / "compare.png").exists()


def test_default_out_names_both_sides(results_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    compare_command.cmd_compare(compare_args(str(results_dir), str(results_dir)))
    assert (tmp_path / "reports" / "compare-base-vs-base" / "compare.html").exists()


@pytest.mark.parametrize("make, message", [
    (lambda d, f: (d / "missing", d), "does not exist"),
    (lambda d, f: (d, f), "two results directories or two gate JSON files"),
    (lambda d, f: (d.parent / "pair", d), "has no results.jsonl"),
])
def test_bad_inputs_are_one_clear_error(results_dir, tmp_path, make, message):
    gate_file = tmp_path / "g.json"
    gate_file.write_text(COMMITTED_TINY.read_text())
    base, current = make(results_dir, gate_file)
    with pytest.raises(InputError, match=message):
        compare.compare_paths(base, current)


def test_the_page_escapes_what_it_shows(tmp_path):
    """Point labels and paths come from results: the template escapes them (jinja2 autoescape)."""
    row = compare.Row("<script>alert(1)</script> & co", "tokens_per_s", 1.0, 2.0, "higher", False, True, "shown")
    path = tmp_path / "compare.html"
    compare.write_html([row], tmp_path / "<b>base</b>", tmp_path / "now", "gate passed: 1 checks", True, path)
    page = path.read_text()
    assert "<script" not in page and "<b>base" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt; &amp; co" in page and "&lt;b&gt;base&lt;/b&gt;" in page
    assert "+100.00%" in page and "#1a7f37" in page  # better: green


# --- across machines ----------------------------------------------------------------------------
def test_compare_across_machines_says_so_first_and_judges_no_timing(results_dir, tmp_path, capsys):
    def elsewhere_and_slower(row):
        row["node"] = {**row["node"], "cpu_model": "AMD EPYC 9B14", "machine_class": "feedfacecafe"}
        if row["mode"] == "spec":
            row["latency_s"] *= 3

    assert all(row["node"]["machine_class"] == fingerprint()["machine_class"]
               for row in ResultsFile(results_dir / "results.jsonl").read())  # `specbench run` records their node
    current = edited_copy(results_dir, tmp_path / "epyc", elsewhere_and_slower)
    assert compare_command.cmd_compare(compare_args(str(results_dir), str(current), "--out", str(tmp_path / "r"))) == 0
    printed = capsys.readouterr().out.splitlines()
    # a folder without an identity file: the machine its records' node names (no core count there)
    assert printed[0].startswith("note: measured on different machines: baseline from ")
    assert f"(class {fingerprint()['machine_class']}), current from AMD EPYC 9B14, ? cores, " in printed[0]
    assert printed[0].endswith("(class feedfacecafe); timings are shown, not judged")
    assert "gate passed" in printed[-1] and "not judged" in (tmp_path / "r" / "compare.html").read_text()


def test_compare_against_an_unknown_machine_still_judges_the_deterministic_metrics(results_dir, tmp_path, capsys):
    def before_fingerprints(row):
        del row["node"]
        if row["mode"] == "spec":
            row["num_accepted_tokens"] -= 1

    old = edited_copy(results_dir, tmp_path / "old", before_fingerprints)
    assert compare_command.cmd_compare(compare_args(str(old), str(results_dir), "--out", str(tmp_path / "r"))) == 1
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith("note: measured on different machines: baseline from an unknown machine (recorded "
                                 "before machine fingerprints), current from ")
    assert any(line.startswith("FAIL") and "acceptance_rate" in line for line in printed)


# --- the gate across machines ---------------------------------------------------------------------------
