"""`specbench calibrate` (bench/measure/calibrate.py, bench/derive/calibration.py) on tiny models, and the
machine in records, compare and the gate. One file per machine class holding the schema the sweep reads;
a second call measures nothing; a runtime's new version, new models or another machine measure again; a
runtime that fails or crashes natively is one entry's error; a damaged or foreign file is one line, exit 2.
Across machines compare says so first and the gate leaves timings unjudged but still judges the
deterministic metrics. No timing is asserted: only what was recorded and how it is judged."""
from __future__ import annotations

import argparse
import copy
import json
from dataclasses import fields

import pytest
import torch

from bench.cli import main
from bench.commands import gate as gate_command
from bench.core.records import Node, environment, node_info
from bench.derive import gate_verdict
from bench.derive.calibration import ENTRY_FIELDS, FIELDS, entry_of, read_calibration
from bench.derive.calibration import table as calibration_table
from bench.derive.runtime_choice import first_token_note
from bench.measure import calibrate
from specdec.backends.base import Backend
from specdec.errors import ConfigError
from specdec.machine import fingerprint
from tests.native_crash import hang, hang_after_entry, segfault
from tests.tiny import tiny_causal


@pytest.fixture
def home(tmp_path, monkeypatch):
    """SPECBENCH_HOME in a tmp folder (spawned children inherit it) and a small bandwidth buffer."""
    monkeypatch.setenv("SPECBENCH_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(calibrate, "bandwidth_bytes", lambda: 1 << 24)
    return tmp_path / "home"


def this_file() -> object:
    return calibrate.calibration_path(fingerprint()["machine_class"])


class FakeMeasure:
    """measure_isolated without a process or a model: what it was asked, and a plausible measurement."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def __call__(self, model: str, runtime: str, threads: int, rounds: int, read_bytes: int = 0) -> dict:
        self.calls.append((model, runtime))
        timed = [{"step_s": [0.01, 0.011, 0.012], "block_s": {str(n): 0.01 * (1 + n / 10) for n in range(2, 10)}}] * rounds
        return {"model": model, "runtime": runtime, "threads": threads, "dtype": None, "weight_bytes": 2_000_000,
                "rounds": timed, "error": None, "method": calibrate.METHOD, "block_vs_steps": 0.0}


@pytest.fixture
def fake(home, monkeypatch):
    measure = FakeMeasure()
    monkeypatch.setattr(calibrate, "measure_isolated", measure)
    monkeypatch.setattr(calibrate, "measure_bandwidth", lambda threads: 20.0)
    return measure


# --- measuring, in children ----------------------------------------------------------------------
@pytest.mark.subprocess
def test_a_calibration_writes_the_schema_and_a_second_call_measures_nothing(pair, home, monkeypatch, capsys):
    """torch-int8 is measured in a child; llamacpp cannot run an HF folder: its entry is the one-line error."""
    data = calibrate.calibration([pair["cloud"]], ["torch-int8", "torch-int8t", "llamacpp"], threads=1, progress=False,
                                 rounds=2)
    path = this_file()
    assert path.parent == home / "calibration" and json.loads(path.read_text()) == data
    assert list(data)[: len(FIELDS)] == list(FIELDS) and data["schema"] == 1 and data["threads"] == 1
    assert data["fingerprint"] == fingerprint() and data["bandwidth_gbs"] > 0
    assert set(data["versions"]) == {"torch", "transformers", "llama_cpp", "onnxruntime", "onnxruntime_genai", "openvino", "nncf",
                                     "kernels"}
    int8, int8t, llama = data["entries"]
    # measured, not assumed: int8t's blocks are its steps exactly; dynamic int8's move with the block's rows
    assert int8t["block_vs_steps"] == 0.0 and int8t["method"] == calibrate.METHOD
    assert int8["block_vs_steps"] >= 0.0
    assert list(int8)[: len(ENTRY_FIELDS)] == list(ENTRY_FIELDS)
    assert (int8["model"], int8["runtime"], int8["threads"], int8["error"]) == (pair["cloud"], "torch-int8", 1, None)
    assert list(int8["block_steps"]) == [str(n) for n in range(1, 10)] and int8["block_steps"]["1"] == 1.0
    assert int8["step_ms_p10"] <= int8["step_ms"] <= int8["step_ms_p90"] and len(int8["rounds"]) == 2
    # the floor is set by the memory's best reading: the calibration's, or the entry's own around its rounds
    assert int8["bandwidth_gbs"] > 0
    best = max(data["bandwidth_gbs"], int8["bandwidth_gbs"])
    assert int8["floor_ms"] == pytest.approx(int8["weight_bytes"] / (best * 1e9) * 1e3, rel=1e-3)
    assert llama["runtime"] == "llamacpp" and llama["step_ms"] is None and "\n" not in llama["error"]
    assert data["compute_gmacs"] is None or data["compute_gmacs"] > 0  # None: no kernel path on this CPU
    assert int8["prefill_tokens_per_s"] > 0 and int8["prompt_macs_per_token"] == calibrate.prompt_macs_per_token(pair["cloud"])
    assert "GGUF" in llama["error"] or "llama-cpp-python" in llama["error"]

    written = path.read_text()
    monkeypatch.setattr(calibrate, "measure_isolated", lambda *a: pytest.fail("measured again"))
    monkeypatch.setattr(calibrate, "measure_bandwidth", lambda *a: pytest.fail("measured the bandwidth again"))
    assert calibrate.calibration([pair["cloud"]], ["torch-int8", "torch-int8t", "llamacpp"], threads=1,
                                 progress=False) == data
    assert main(["calibrate", "--models", pair["cloud"], "--runtimes", "torch-int8,torch-int8t,llamacpp", "--threads",
                 "1"]) == 0
    assert path.read_text() == written
    table = capsys.readouterr().out.splitlines()
    assert table[0].startswith("machine: ") and "GB/s" in table[0] and fingerprint()["machine_class"] in table[0]
    assert any(line.startswith(f"torch-int8 | {pair['cloud']} | 1 | ") for line in table)
    assert any(line.startswith(f"llamacpp | {pair['cloud']} | 1 | error: ") for line in table)


@pytest.mark.subprocess
def test_a_native_crash_is_the_entrys_error_and_the_calibration_goes_on(home, monkeypatch):
    measured = calibrate.measure_isolated("m", "llamacpp", 1, 1, target=segfault)
    assert measured == {"model": "m", "runtime": "llamacpp", "threads": 1, "error": "a native crash (SIGSEGV)"}
    isolated, fake = calibrate.measure_isolated, FakeMeasure()
    monkeypatch.setattr(calibrate, "measure_isolated", lambda model, runtime, threads, rounds, read_bytes: (
        isolated(model, runtime, threads, rounds, read_bytes, target=segfault) if runtime == "llamacpp"
        else fake(model, runtime, threads, rounds)))
    monkeypatch.setattr(calibrate, "measure_bandwidth", lambda threads: 20.0)
    crashed, measured = calibrate.calibration(["m"], ["llamacpp", "torch"], threads=1, progress=False)["entries"]
    assert (crashed["error"], crashed["step_ms"]) == ("a native crash (SIGSEGV)", None)
    assert measured["runtime"] == "torch" and measured["error"] is None and fake.calls == [("m", "torch")]


@pytest.mark.subprocess
def test_a_child_that_hangs_is_stopped_and_its_entry_says_so(home, monkeypatch):
    """Silent past the entry's limit: stopped, and the error names the hang and the retry. Hanging after its entry
    (in its teardown): the entry is kept and the child stopped after the grace, so neither holds the parent."""
    monkeypatch.setattr(calibrate, "ENTRY_LIMIT_S", 2.0)
    monkeypatch.setattr(calibrate, "EXIT_GRACE_S", 1.0)
    measured = calibrate.measure_isolated("m", "openvino-int8", 1, 1, target=hang)
    assert (measured["model"], measured["runtime"], measured["threads"]) == ("m", "openvino-int8", 1)
    assert measured["error"].startswith("no result within 2 s, so it was stopped (a hang in the runtime)")
    assert "`specbench calibrate --runtimes openvino-int8`" in measured["error"]
    assert calibrate.measure_isolated("m", "torch", 1, 1, target=hang_after_entry) == {
        "model": "m", "runtime": "torch", "threads": 1, "error": None}


def test_a_prompt_tokens_multiply_adds_are_its_decoder_linears_and_the_table_shows_the_roof(tmp_path):
    torch.manual_seed(0)
    for arch in ("llama", "qwen2"):
        model = tiny_causal(arch)
        model.save_pretrained(tmp_path / arch)
        linears = sum(m.weight.numel() for name, m in model.named_modules()
                      if isinstance(m, torch.nn.Linear) and ".layers." in name)  # the head is the last row's only
        assert calibrate.prompt_macs_per_token(str(tmp_path / arch)) == linears
    assert calibrate.prompt_macs_per_token(str(tmp_path / "nowhere")) is None
    measured = {**FakeMeasure()("m", "kernels-int4", 2, 1), "prefill_tokens": 800, "prefill_s": [4.0, 5.0, 4.5],
                "prompt_macs_per_token": 10**9}
    data = {"fingerprint": fingerprint(), "bandwidth_gbs": 20.0, "compute_gmacs": 300.0,
            "entries": [entry_of(measured, 20.0)]}
    lines = calibration_table(data).splitlines()
    assert "int8 multiply-adds 300 G/s" in lines[0] and lines[1].endswith("| prefill tok/s | prefill roof tok/s")
    assert lines[3].endswith("| 178 | 300")  # 800 tokens in the median 4.5 s; 300 G/s over 1 G a token
    assert calibration_table({**data, "compute_gmacs": None}).splitlines()[3].endswith("| 178 | -")
    # what the runtime choice says of the first token, from an entry as the calibration writes it
    assert first_token_note({"kernels-int4": data["entries"][0]}, "kernels-int4") == (
        "; first token: kernels-int4 prefills the calibration's 800-token prompt at 178 tok/s, the fastest measured")


@pytest.mark.parametrize(("durations", "rounds", "timed"), [
    ([1.0, 1.02, 9.0], 3, 2),  # two within 3 %: the rate is settled
    ([1.0, 1.2, 1.1], 3, 3),  # two apart: a third settles them
    ([1.0, 1.0, 1.0], 1, 1),  # one round asked, one timed
    ([1.0, 1.2, 1.1, 1.0, 1.0], 5, 5),  # only the first two can stop it early
])
def test_the_prompt_rate_stops_after_two_prefills_that_agree(monkeypatch, durations, rounds, timed):
    class Backend:
        calls = 0

        def prefill(self, prompt, ids, keep):
            Backend.calls += 1

    clock = iter(t for d in durations for t in (0.0, d))
    monkeypatch.setattr(calibrate, "context_ids", lambda tokenizer, tokens: torch.arange(tokens))
    monkeypatch.setattr(calibrate.time, "perf_counter", lambda: next(clock))
    lm = argparse.Namespace(backend=Backend(), tokenizer=None)
    assert calibrate.time_prefills(lm, 8, rounds) == durations[:timed] and Backend.calls == timed


def test_the_floor_counts_what_a_step_reads():
    """bf16: every weight but the embedding table; int8: each Linear's packed int8 weight, the norms in float32."""
    from specdec.models.derive import quantize_int8
    from specdec.models.loading import LoadedModel

    model = tiny_causal("llama").bfloat16()
    embedding = model.get_input_embeddings().weight
    loaded = LoadedModel("t", "", type("B", (Backend,), {"model": model})(), None, 0.0, runtime="torch")
    assert calibrate.streamed_weight_bytes(loaded) == sum(p.numel() * 2 for p in model.parameters()) - embedding.numel() * 2
    model = quantize_int8(tiny_causal("llama"))
    linear = sum(m.weight().numel() for m in model.modules() if isinstance(m, torch.ao.nn.quantized.dynamic.Linear))
    norms = sum(p.numel() for name, p in model.named_parameters() if "norm" in name)
    loaded = LoadedModel("t", "", type("B", (Backend,), {"model": model})(), None, 0.0, runtime="torch-int8")
    assert linear and calibrate.streamed_weight_bytes(loaded) == linear + 4 * norms


# --- reuse and invalidation -------------------------------------------------------------------------
def test_only_missing_or_stale_entries_are_measured(fake, monkeypatch):
    calibrate.calibration(["a", "b"], ["torch", "llamacpp"], threads=1, progress=False)
    assert fake.calls == [("a", "torch"), ("a", "llamacpp"), ("b", "torch"), ("b", "llamacpp")]
    fake.calls.clear()
    calibrate.calibration(["a", "b", "c"], ["torch"], threads=1, progress=False)
    assert fake.calls == [("c", "torch")]  # a new model: measured and merged, the rest kept
    fake.calls.clear()
    versions = calibrate.runtime_versions()
    monkeypatch.setattr(calibrate, "runtime_versions", lambda: {**versions, "torch": "99.0"})
    data = calibrate.calibration(["a", "b"], ["torch", "llamacpp"], threads=1, progress=False)
    assert fake.calls == [("a", "torch"), ("b", "torch")]  # torch's timings are stale; llama.cpp's hold
    assert data["versions"]["torch"] == "99.0" and {e["model"] for e in data["entries"]} == {"a", "b"}  # c's dropped
    fake.calls.clear()
    monkeypatch.setattr(calibrate, "runtime_versions", lambda: {**versions, "torch": "99.0", "llama_cpp": "0.0.1"})
    calibrate.calibration(["a", "b"], ["torch", "llamacpp"], threads=1, progress=False)
    assert fake.calls == [("a", "llamacpp"), ("b", "llamacpp")]
    fake.calls.clear()
    calibrate.calibration(["a"], ["torch"], threads=1, progress=False, force=True)
    assert fake.calls == [("a", "torch")]


def test_the_kernels_compute_rate_is_measured_once_until_their_version_changes(fake, monkeypatch):
    """auto calibrates one runtime a call: each call that measures an entry keeps the file's compute rate while the
    kernels are the same, and measures it anew once their version changes."""
    rates = iter([100.0, 200.0])
    monkeypatch.setattr(calibrate, "measure_compute", lambda threads: next(rates))
    versions = {"torch": "1", "kernels": "avx2 aaa"}
    monkeypatch.setattr(calibrate, "runtime_versions", lambda: dict(versions))
    for runtime in ("torch", "llamacpp"):
        assert calibrate.calibration(["a"], [runtime], threads=1, progress=False)["compute_gmacs"] == 100.0
    versions["kernels"] = "avx2 bbb"
    assert calibrate.calibration(["a"], ["torch-int8"], threads=1, progress=False)["compute_gmacs"] == 200.0
    assert fake.calls == [("a", "torch"), ("a", "llamacpp"), ("a", "torch-int8")]


def test_an_entry_of_an_older_method_is_measured_again(fake):
    """What is measured (a block against its steps) or a runtime's code changed: METHOD was bumped."""
    calibrate.calibration(["m"], ["torch"], 1, progress=False)
    data = json.loads(this_file().read_text())
    data["entries"][0]["method"] = calibrate.METHOD - 1
    this_file().write_text(json.dumps(data))
    again = calibrate.calibration(["m"], ["torch"], 1, progress=False)
    assert fake.calls == [("m", "torch"), ("m", "torch")] and again["entries"][0]["method"] == calibrate.METHOD


def test_a_model_whose_weight_files_changed_is_measured_again(fake, tmp_path):
    model = tmp_path / "m"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"x" * 10)
    calibrate.calibration([str(model)], ["torch"], threads=1, progress=False)
    calibrate.calibration([str(model)], ["torch"], threads=1, progress=False)
    assert len(fake.calls) == 1
    (model / "model.safetensors").write_bytes(b"y" * 20)  # re-fetched or re-quantized
    calibrate.calibration([str(model)], ["torch"], threads=1, progress=False)
    assert len(fake.calls) == 2


def test_another_machine_class_has_its_own_file(fake, monkeypatch):
    calibrate.calibration(["a"], ["torch"], threads=1, progress=False)
    first = this_file()
    other = {**fingerprint(), "cpu_model": "Other CPU", "machine_class": "0123456789ab"}
    monkeypatch.setattr(calibrate, "fingerprint", lambda: other)
    data = calibrate.calibration(["a"], ["torch"], threads=1, progress=False)
    assert fake.calls == [("a", "torch")] * 2 and data["fingerprint"]["machine_class"] == "0123456789ab"
    assert calibrate.calibration_path("0123456789ab").is_file() and first.is_file()


# --- one-line errors ----------------------------------------------------------------------------------
@pytest.mark.parametrize("content, why", [
    ("{not json", "not JSON: Expecting property name enclosed in double quotes, line 1"),
    ("[1]", "not a JSON object"),
    (json.dumps({"schema": 2}), "schema 2, this version reads 1"),
    (None, "entry 0 has no step_ms"),
])
def test_a_damaged_file_is_one_line_and_exits_2(fake, content, why, capsys):
    path = this_file()
    if content is None:
        data = calibrate.calibration(["a"], ["torch"], threads=1, progress=False)
        del data["entries"][0]["step_ms"]
        content = json.dumps(data)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content)
    with pytest.raises(ConfigError) as error:
        read_calibration(path)
    assert str(error.value) == (f"calibration file {path} is damaged ({why}): delete it or run `specbench calibrate --force`")
    assert main(["calibrate", "--models", "a", "--runtimes", "torch", "--threads", "1"]) == 2
    assert capsys.readouterr().err.strip() == f"error: {error.value}"
    assert main(["calibrate", "--models", "a", "--runtimes", "torch", "--threads", "1", "--force"]) == 0
    assert read_calibration(path)["entries"][0]["error"] is None


def test_a_file_from_another_machine_is_one_line_and_exits_2(fake, tmp_path, capsys):
    data = calibrate.calibration(["a"], ["torch"], threads=1, progress=False)
    foreign = tmp_path / "foreign.json"
    foreign.write_text(json.dumps({**data, "fingerprint": {**data["fingerprint"], "cpu_model": "AMD EPYC 9B14",
                                                           "machine_class": "feedfacecafe"}}))
    with pytest.raises(ConfigError) as error:
        read_calibration(foreign)
    line = str(error.value)
    assert line.startswith(f"calibration file {foreign} was measured on AMD EPYC 9B14, ") and "(class feedfacecafe)" in line
    assert line.endswith(f"this machine is {calibrate_describe()}: run `specbench calibrate`") and "\n" not in line
    assert main(["calibrate", "--file", str(foreign)]) == 2
    assert capsys.readouterr().err.strip() == f"error: {line}"
    assert main(["calibrate", "--file", str(foreign), "--any-machine"]) == 0
    assert "AMD EPYC 9B14" in capsys.readouterr().out
    assert read_calibration(foreign, any_machine=True)["fingerprint"]["machine_class"] == "feedfacecafe"


def calibrate_describe() -> str:
    from specdec.machine import describe

    return describe(fingerprint())


def test_an_unknown_runtime_is_one_line(fake):
    with pytest.raises(ConfigError, match="unknown runtime 'onnx'"):
        calibrate.calibration(["a"], ["onnx"], threads=1, progress=False)
    assert fake.calls == []


# --- the machine in records -------------------------------------------------------------------------
def test_records_and_identities_carry_the_machine():
    node, here = node_info(), fingerprint()
    assert list(node) == [f.name for f in fields(Node)]
    assert (node["machine_class"], node["kernel_features"], node["cpu_model"]) == (
        here["machine_class"], here["kernel_features"], here["cpu_model"])
    assert environment()["fingerprint"] == here


def gate_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="specbench")
    gate_command.add_gate_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["gate", *argv])


@pytest.mark.parametrize("moved", [False, True])
def test_the_gate_leaves_another_machines_timing_unjudged_but_judges_the_rest(tmp_path, monkeypatch, capsys, moved):
    """A baseline given with --baseline that records no machine (as every one written before fingerprints): the
    halved timing ratios are shown (--verbose) without a verdict; a deterministic metric that moved still fails.
    The gate's own choice of baseline per machine class: tests/test_gate_baselines.py."""
    committed = gate_verdict.read_gate_file(min((gate_verdict.BASELINES / "tiny").glob("*.json")))
    committed["environment"].pop("fingerprint", None)
    path = tmp_path / "before-fingerprints.json"
    gate_verdict.write_gate_file(path, committed)
    current = copy.deepcopy(committed)
    current["environment"]["fingerprint"] = fingerprint()
    current["timing"] = {name: value / 2 for name, value in current["timing"].items()}
    current["timing_repeats"] = {name: [v / 2 for v in values] for name, values in current["timing_repeats"].items()}
    if moved:
        current["deterministic"]["spec.acceptance_rate"] -= 0.01
    monkeypatch.setattr(gate_command, "judge", lambda baseline, workload, tolerance, **kw:
                        (current, gate_verdict.compare(baseline, current, tolerance)))
    assert gate_command.cmd_gate(gate_args("--suite", "tiny", "--baseline", str(path), "--verbose")) == (1 if moved else 0)
    out = capsys.readouterr().out.splitlines()
    assert any(line.startswith("note: timing ratios not judged: baseline from an unknown machine") for line in out)
    timing = [line for line in out if line.split()[1:2] == ["timing"] and not line.startswith("note")]
    assert len(timing) == len(committed["timing"]) and all(line.startswith("--") for line in timing)
    assert ("FAIL deterministic spec.acceptance_rate" in " ".join(" ".join(line.split()) for line in out)) == moved
    assert out[-1].endswith(f"({len(committed['timing'])} timing checks not judged: another machine)")


def test_the_gate_judges_timing_against_a_baseline_of_its_own_machine_class():
    base = {"workload": {}, "deterministic": {"x": 1}, "timing": {"r": 1.0}, "timing_repeats": {"r": [1.0, 1.0, 1.0]},
            "environment": {"fingerprint": fingerprint()}}
    slower = {**base, "timing": {"r": 0.5}, "timing_repeats": {"r": [0.5, 0.5, 0.5]}}
    tolerance = gate_verdict.TOLERANCES["tiny"]
    (check,) = [c for c in gate_verdict.compare(base, slower, tolerance) if c.kind == "timing"]
    assert check.judged and not check.ok
    other = {**base, "environment": {"fingerprint": {**fingerprint(), "machine_class": "feedfacecafe"}}}
    (check,) = [c for c in gate_verdict.compare(other, slower, tolerance) if c.kind == "timing"]
    assert not check.judged and check.ok and gate_verdict.verdict([check])[0]


def test_calibrating_a_runtime_this_cpu_cannot_run_names_it_and_why(home, monkeypatch, capsys):
    """`specbench calibrate --runtimes kernels-int4` (or its old name) on a CPU without any of the kernels' paths: one
    line naming the runtime and the reason, exit 2, nothing measured, not the cached table printed as if it were."""
    import specdec.kernels as kernels_module

    monkeypatch.delenv("SPECBENCH_KERNELS", raising=False)
    monkeypatch.setattr(kernels_module, "_cpuinfo", lambda: ("an old CPU", frozenset({"sse4_2"})))
    monkeypatch.setattr(calibrate, "measure_isolated", lambda *a, **k: pytest.fail("measured"))
    for name in ("kernels-int4", "vnni-int4"):
        assert main(["calibrate", "--runtimes", name]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [f"error: --runtimes {name}: the kernels runtimes need AVX2 (with FMA and F16C), AVX-512 VNNI or "
                       "ARM NEON with dotprod, which this CPU lacks: use runtime torch-int8t or onnx-int4 or onnx-int8 "
                       "(SPECBENCH_KERNELS=reference runs them exactly, slowly)"]
