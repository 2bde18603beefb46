"""The gate keeps one baseline per machine class and suite (bench/baselines/<suite>/<machine_class>.json):
it judges timing against this machine's class, falls back to another class's file for the deterministic
metrics alone (saying so in one line, with the command that adds the missing baseline), and `--update`
writes this class's file only. Nothing is measured: synthetic gate records stand in for runs, in
baseline folders under tmp_path, on a made-up machine class."""
import argparse

import pytest

from bench.commands import gate as gate_command
from bench.derive import gate_verdict
from specdec.errors import InputError
from specdec.machine import describe

HERE = {"cpu_model": "Test CPU 9000", "arch": "x86_64", "cores": 2, "kernel_features": ["avx2"], "gpu": None,
        "machine_class": "aaaaaaaaaaaa"}
OTHER = {**HERE, "cpu_model": "Other CPU", "cores": 64, "machine_class": "bbbbbbbbbbbb"}
FALLBACK = gate_verdict.FALLBACK


def record(machine: dict | None, date: str = "2026-11-01T00:00:00+00:00", ratio: float = 1.0,
           acceptance: float = 0.5) -> dict:
    """A gate file as bench/measure/gate.py writes one, cut to one deterministic rate, one hash and one
    timing ratio with five repeats; `machine` None: written before fingerprints."""
    environment = {"date": date, **({"fingerprint": machine} if machine else {})}
    return {"format": gate_verdict.FORMAT, "suite": "tiny", "workload": {"suite": "tiny", "k": 4},
            "environment": environment,
            "deterministic": {"spec.acceptance_rate": acceptance, "spec.tokens_sha256": "ab" * 32},
            "timing": {"spec_vs_cloud": ratio}, "timing_repeats": {"spec_vs_cloud": [ratio] * 5},
            "tokens_per_s": {"spec": [100.0] * 5}, "load_average_1min": [0.0, 0.0]}


def gate_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="specbench")
    gate_command.add_gate_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["gate", *argv])


@pytest.fixture
def baselines(tmp_path, monkeypatch):
    """An empty baselines root on a machine of class HERE; `run.current` is what the next gate measures."""
    root = tmp_path / "baselines"
    (root / "tiny").mkdir(parents=True)
    monkeypatch.setattr(gate_verdict, "BASELINES", root)
    monkeypatch.setattr(gate_command, "fingerprint", lambda: HERE)
    monkeypatch.setattr(gate_command, "_quiet_transformers", lambda: None)
    return root


class Run:
    """Stands in for measuring: returns `current`, remembers the baseline it was judged against."""

    def __init__(self, monkeypatch, current: dict) -> None:
        self.current, self.judged_against = current, None
        monkeypatch.setattr(gate_command, "measure", lambda workload, **kw: self.current)
        monkeypatch.setattr(gate_command, "judge", self.judge)

    def judge(self, baseline, workload, tolerance, **kw):
        self.judged_against = baseline
        return self.current, gate_verdict.compare(baseline, self.current, tolerance)


def checked(line: str) -> str | None:
    """The kind of check a printed line shows (`Check.line()`: status, kind, metric, ...); None for a note."""
    words = line.split()
    return words[1] if len(words) > 1 and words[0] in ("ok", "FAIL", "--") else None


def write(root, name: str, data: dict):
    path = root / "tiny" / f"{name}.json"
    gate_verdict.write_gate_file(path, data)
    return path


@pytest.mark.parametrize("moved", [False, True])
def test_this_machine_classes_baseline_is_chosen_and_its_timing_judged(baselines, monkeypatch, capsys, moved):
    write(baselines, HERE["machine_class"], record(HERE, date="2026-10-01T00:00:00+00:00"))
    write(baselines, OTHER["machine_class"], record(OTHER, date="2026-11-20T00:00:00+00:00"))  # newer, not chosen
    write(baselines, FALLBACK, record(None))
    run = Run(monkeypatch, record(HERE, ratio=0.5, acceptance=0.49 if moved else 0.5))
    assert gate_command.cmd_gate(gate_args("--suite", "tiny")) == 1
    out = capsys.readouterr().out.splitlines()
    assert run.judged_against["environment"]["fingerprint"] == HERE
    assert not any("not judged" in line for line in out)
    assert any(line.startswith("FAIL timing") and "spec_vs_cloud" in line for line in out)  # halved: judged, failed
    assert any(line.startswith("FAIL deterministic") and "spec.acceptance_rate" in line for line in out) == moved
    assert out[-1].startswith(f"gate FAILED: {2 if moved else 1} of 3 checks moved")


@pytest.mark.parametrize("moved", [False, True])
def test_without_a_baseline_of_this_class_timing_is_not_judged_and_one_line_says_how_to_add_it(
        baselines, monkeypatch, capsys, moved):
    write(baselines, OTHER["machine_class"], record(OTHER))
    write(baselines, FALLBACK, record(None))
    Run(monkeypatch, record(HERE, ratio=0.5, acceptance=0.49 if moved else 0.5))
    assert gate_command.cmd_gate(gate_args("--suite", "tiny")) == (1 if moved else 0)
    out = capsys.readouterr().out.splitlines()
    line = ("note: timing not judged: no tiny baseline for Test CPU 9000, 2 cores, avx2 (class aaaaaaaaaaaa); "
            "add one: specbench gate --suite tiny --update")
    assert line == gate_command.no_baseline_line("tiny", HERE) and describe(HERE) in line
    assert [text for text in out if "not judged" in text and not text.startswith("gate ")] == [line]
    assert not any(checked(text) == "timing" for text in out)  # the unjudged ratios: only with --verbose
    assert any(text.startswith("FAIL deterministic") and "spec.acceptance_rate" in text for text in out) == moved
    assert out[-1].endswith("(1 timing checks not judged: another machine)")


def test_verbose_shows_the_unjudged_ratios_without_a_verdict(baselines, monkeypatch, capsys):
    write(baselines, OTHER["machine_class"], record(OTHER))
    Run(monkeypatch, record(HERE, ratio=0.5))
    assert gate_command.cmd_gate(gate_args("--suite", "tiny", "--verbose")) == 0
    (timing,) = [text for text in capsys.readouterr().out.splitlines() if checked(text) == "timing"]
    assert timing.startswith("--") and gate_verdict.NOT_JUDGED in timing


def test_the_fallback_is_the_most_recently_measured_baseline_of_another_class(baselines):
    write(baselines, FALLBACK, record(None, date="2026-11-25T00:00:00+00:00"))
    assert gate_verdict.choose_baseline("tiny", HERE["machine_class"]) == gate_verdict.BaselineChoice(
        baselines / "tiny" / f"{FALLBACK}.json", own_class=False)
    newer = write(baselines, OTHER["machine_class"], record(OTHER, date="2026-12-01T00:00:00+00:00"))
    assert gate_verdict.choose_baseline("tiny", HERE["machine_class"]) == gate_verdict.BaselineChoice(newer, False)
    own = write(baselines, HERE["machine_class"], record(HERE, date="2026-01-01T00:00:00+00:00"))
    assert gate_verdict.choose_baseline("tiny", HERE["machine_class"]) == gate_verdict.BaselineChoice(own, True)


def test_a_suite_without_any_baseline_is_one_line_naming_the_fix(baselines, monkeypatch):
    monkeypatch.setattr(gate_command, "judge", lambda *a, **k: pytest.fail("measured without a baseline"))
    with pytest.raises(InputError, match=r"no real baseline in .*: measure one with `specbench gate --suite real "
                                         r"--update`") as error:
        gate_command.cmd_gate(gate_args("--suite", "real"))
    assert "\n" not in str(error.value)


def test_update_writes_this_classes_baseline_only(baselines, monkeypatch, capsys):
    others = {path: path.read_bytes() for path in (write(baselines, OTHER["machine_class"], record(OTHER)),
                                                   write(baselines, FALLBACK, record(None)))}
    run = Run(monkeypatch, record(HERE, ratio=1.1))
    own = gate_verdict.baseline_path("tiny", HERE["machine_class"])
    assert gate_command.cmd_gate(gate_args("--suite", "tiny", "--update")) == 0
    assert f"baseline written: {own}" in capsys.readouterr().out
    assert gate_verdict.read_gate_file(own) == run.current
    run.current = record(HERE, ratio=1.2)  # again: this class's file is overwritten
    assert gate_command.cmd_gate(gate_args("--suite", "tiny", "--update")) == 0
    assert gate_verdict.read_gate_file(own)["timing"] == {"spec_vs_cloud": 1.2}
    assert {path: path.read_bytes() for path in others} == others
    assert sorted(path.name for path in (baselines / "tiny").iterdir()) == sorted(
        [f"{HERE['machine_class']}.json", f"{OTHER['machine_class']}.json", f"{FALLBACK}.json"])
    assert not (baselines / "real").exists()
    run.current = record(HERE, ratio=0.5)  # and from now on the gate judges this class's timing against it
    assert gate_command.cmd_gate(gate_args("--suite", "tiny")) == 1
    assert run.judged_against["timing"] == {"spec_vs_cloud": 1.2}


def test_update_names_the_file_after_the_machine_the_run_records(baselines, monkeypatch):
    """The file's name and the fingerprint inside it cannot disagree: the name comes from the record."""
    Run(monkeypatch, record(OTHER))
    gate_command.cmd_gate(gate_args("--suite", "tiny", "--update"))
    assert [path.name for path in (baselines / "tiny").iterdir()] == [f"{OTHER['machine_class']}.json"]


def test_committed_baselines_are_named_after_the_machine_they_record():
    """bench/baselines/<suite>/<class>.json records that class; unknown-machine.json, measured before
    fingerprints, records none (nobody stamps a machine on numbers it did not measure)."""
    files = sorted(gate_verdict.BASELINES.glob("*/*.json"))
    assert {path.parent.name for path in files} == set(gate_verdict.TOLERANCES)
    for path in files:
        data = gate_verdict.read_gate_file(path)
        machine = gate_verdict.machine_of(data)
        assert data["suite"] == path.parent.name
        assert (machine is None) if path.stem == FALLBACK else (machine["machine_class"] == path.stem), path
    assert not list(gate_verdict.BASELINES.glob("*.json")), "a baseline left outside its suite's folder"


def test_a_record_copied_under_another_name_is_still_judged_by_what_it_records(baselines, monkeypatch, capsys):
    """A file named after this class but measured elsewhere (copied by hand): timing is not judged, and the
    note names both machines."""
    write(baselines, HERE["machine_class"], record(OTHER))
    Run(monkeypatch, record(HERE, ratio=0.5))
    assert gate_command.cmd_gate(gate_args("--suite", "tiny")) == 0
    assert "note: timing ratios not judged: baseline from Other CPU, 64 cores" in capsys.readouterr().out
