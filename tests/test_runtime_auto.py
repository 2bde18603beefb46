"""`auto` runtimes chosen from a machine's calibration (bench/derive/runtime_choice.py,
bench/measure/runtime_auto.py), a sweep's `rows` beside its grid and the constraints axis: the shipped
main job's config resolves and validates on a given calibration, without measuring anything."""
from __future__ import annotations

import pytest

from bench.core.point import Point
from bench.derive.runtime_choice import cheapest_verifier, fastest_plain
from bench.measure.runtime_auto import AutoRuntimes
from bench.measure.sweep.sweep_config import SweepConfig
from specdec.errors import ConfigError

CLOUD, EDGE = "qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"


def entry(model: str, runtime: str, step_ms: float, per_token: float, error: str | None = None) -> dict:
    """A calibration entry whose n-token block costs 1 + per_token * (n - 1) steps."""
    return {"model": model, "runtime": runtime, "threads": 2, "step_ms": step_ms, "step_ms_p10": step_ms,
            "step_ms_p90": step_ms, "block_steps": {str(n): 1 + per_token * (n - 1) for n in range(1, 10)},
            "weight_bytes": 10**9, "floor_ms": 50.0, "error": error}


# An Intel-like day: llama.cpp the fastest step but steep blocks, int8 flat-ish, int8t a bit slower than int8.
CALIBRATION = {"schema": 1, "fingerprint": {"machine_class": "x", "cpu_model": "test"}, "bandwidth_gbs": 20.0,
               "entries": [entry(CLOUD, "llamacpp", 98, 0.38), entry(CLOUD, "torch-int8", 107, 0.095),
                           entry(CLOUD, "torch-int8t", 120, 0.1), entry(CLOUD, "torch", 268, 0.005),
                           entry(EDGE, "llamacpp", 30, 0.3), entry(EDGE, "torch-int8", 40, 0.1),
                           entry(EDGE, "torch", 90, 0.01)]}


def given(calibration: dict):
    calls = []

    def calibrate(models, runtimes, threads):
        calls.append((tuple(models), tuple(runtimes), threads))
        return calibration
    return calibrate, calls


def test_plain_takes_the_fastest_step_and_every_runtime_within_the_margin():
    choice = fastest_plain(CALIBRATION, CLOUD, ("llamacpp", "torch-int8", "torch-int8t", "torch"))
    assert choice.runtimes == ("llamacpp", "torch-int8", "torch-int8t")  # 107 and 120 are within 25 % of 98
    assert "llamacpp 98 ms" in choice.reason and choice.reason.index("llamacpp") < choice.reason.index("torch ")
    assert fastest_plain(CALIBRATION, CLOUD, ("torch-int8", "torch"), margin=1.0).runtimes == ("torch-int8",)


def test_a_lossless_grid_gets_a_batch_invariant_verifier_and_a_lossy_one_the_cheapest_block():
    candidates = ("llamacpp", "torch-int8", "torch-int8t", "torch")
    lossless = cheapest_verifier(CALIBRATION, CLOUD, candidates, (2, 4, 6), ("threshold", "greedy"))
    assert lossless.runtimes == ("torch-int8t",) and "steps' logits exactly" in lossless.reason
    # k = 4: llama.cpp 98 * 2.52 = 247 ms, int8 107 * 1.38 = 148 ms, bf16 268 * 1.02 = 273 ms
    lossy = cheapest_verifier(CALIBRATION, CLOUD, candidates, (4,), ("threshold",))
    assert lossy.runtimes == ("torch-int8",)
    # measured beats designed: a machine where int8t's blocks moved, and bf16's did not
    measured = {**CALIBRATION, "entries": [{**e, "block_vs_steps": 0.0 if e["runtime"] == "torch" else 1.7}
                                           for e in CALIBRATION["entries"]]}
    assert cheapest_verifier(measured, CLOUD, candidates, (4,), ("greedy",)).runtimes == ("torch",)
    nowhere = {**measured, "entries": [{**e, "block_vs_steps": 0.5} for e in measured["entries"]]}
    fallback = cheapest_verifier(nowhere, CLOUD, candidates, (4,), ("greedy",))
    assert fallback.runtimes == ("torch-int8",) and "not the verifier's own text" in fallback.reason


def test_verify_blocks_within_ten_percent_are_settled_by_the_fastest_step():
    """The AMD EPYC on its AVX2 path (2026-11-30): kernels-int8's blocks averaged 78 ms at k = 2, 4, 6 and
    kernels-int4's 83, but int4 steps in 38 ms against 47 (and prefills faster): a close call goes to the faster step;
    a block more than 10 % dearer never wins on its step."""
    exact = {"block_vs_steps": 0.0}
    close = {**CALIBRATION, "entries": [{**entry(CLOUD, "kernels-int8", 47.0, 0.163), **exact},
                                        {**entry(CLOUD, "kernels-int4", 38.4, 0.293), **exact}]}
    # blocks: int8 47 * (1 + 0.163 * 4) = 77.6 ms, int4 38.4 * (1 + 0.293 * 4) = 83.4 ms (7 % dearer)
    choice = cheapest_verifier(close, CLOUD, ("kernels-int8", "kernels-int4"), (2, 4, 6), ("greedy",))
    assert choice.runtimes == ("kernels-int4",)
    assert "within 10 % of the cheapest block, the fastest step: kernels-int4 38 ms, kernels-int8 47 ms" in choice.reason
    far = {**close, "entries": [close["entries"][0], {**entry(CLOUD, "kernels-int4", 38.4, 0.4), **exact}]}  # 99.8 ms
    choice = cheapest_verifier(far, CLOUD, ("kernels-int8", "kernels-int4"), (2, 4, 6), ("greedy",))
    assert choice.runtimes == ("kernels-int8",) and "fastest step" not in choice.reason


def test_the_choice_says_how_fast_its_runtime_prefills_and_which_prefills_fastest():
    rates = {"llamacpp": 90.0, "torch-int8": 200.0, "torch-int8t": 60.0}  # tokens/s of an 800-token prompt
    timed = {**CALIBRATION, "entries": [{**e, "prefill_tokens": 800, "prefill_tokens_per_s": rates[e["runtime"]]}
                                        if e["model"] == CLOUD and e["runtime"] in rates else e
                                        for e in CALIBRATION["entries"]]}
    candidates = ("llamacpp", "torch-int8", "torch-int8t", "torch")
    plain = fastest_plain(timed, CLOUD, candidates)
    assert plain.reason.endswith("first token: llamacpp prefills the calibration's 800-token prompt at 90 tok/s "
                                 "(fastest: torch-int8 200 tok/s)")
    verifier = cheapest_verifier(timed, CLOUD, candidates, (4,), ("greedy",))  # exact: int8t, whose prefill is slowest
    assert verifier.runtimes == ("torch-int8t",)
    note = "torch-int8t prefills the calibration's 800-token prompt at 60 tok/s (fastest: torch-int8 200 tok/s)"
    assert note in verifier.reason
    lossy = cheapest_verifier(timed, CLOUD, candidates, (4,), ("threshold",))
    assert lossy.reason.endswith("torch-int8 prefills the calibration's 800-token prompt at 200 tok/s, the fastest measured")
    assert "first token" not in fastest_plain(CALIBRATION, CLOUD, candidates).reason  # none measured: nothing said


def test_a_runtime_that_crashed_in_calibration_is_never_chosen():
    crashed = {**CALIBRATION, "entries": [entry(CLOUD, "llamacpp", 10, 0.1, error="a native crash (SIGSEGV)"),
                                          entry(CLOUD, "torch-int8", 107, 0.1)]}
    assert fastest_plain(crashed, CLOUD, ("llamacpp", "torch-int8")).runtimes == ("torch-int8",)
    with pytest.raises(ConfigError, match=r"no working runtime .*llamacpp: a native crash \(SIGSEGV\)"):
        fastest_plain(crashed, CLOUD, ("llamacpp",))


def test_the_main_jobs_config_resolves_from_a_calibration_without_measuring():
    calibrate, calls = given(CALIBRATION)
    chooser = AutoRuntimes(calibration=calibrate, progress=False)
    config = SweepConfig.from_toml("default", choose_runtimes=chooser)
    # each model: one runtime a call, those that need no conversion first (kernels-int4: the fewest bits, exact), then
    # those whose floor leaves them a role; what the file already holds is never asked for, the edge never gets int8t
    assert all(len(runtimes) == 1 for _, runtimes, _ in calls)
    assert [c[0] for c in calls] == [(EDGE,)] * 3 + [(CLOUD,)] * 5
    assert calls[0][1] == calls[3][1] == ("kernels-int4",)
    asked = {c[1][0] for c in calls}
    assert not asked & {"llamacpp", "torch-int8", "torch-int8t", "torch"}
    assert config.cloud_runtime == ("torch-int8t",)
    assert config.edge_runtime == ("llamacpp",)
    assert config.plain_runtimes == ("llamacpp", "torch-int8", "torch-int8t")
    assert [c.role for c in chooser.choices] == ["cloud", "plain", "edge"]
    record = chooser.record()
    assert record["bandwidth_gbs"] == 20.0 and len(record["calibration"]) == len(CALIBRATION["entries"])
    points = config.points()
    spec = [p for p in points if p.mode == "spec"]
    model = [p for p in spec if p.drafter == "model"]
    # threshold x k under the threshold policy and greedy at threshold 0 x k, on both prompt sets (a greedy
    # row is what made the verifier batch-invariant: the grid itself is lossy), the draft-free rows beside it
    assert len(model) == (3 * 3 + 3) * 2
    assert {(p.policy, p.entropy_threshold) for p in model if p.policy == "greedy"} == {("greedy", 0.0)}
    assert {(p.prompts, p.constraints) for p in model} == {("zh-describe", "zh"), ("edit-text", "none")}
    free = [p for p in spec if p.drafter != "model"]
    assert sorted((p.drafter, p.prompts) for p in free) == sorted(
        (d, s) for d in ("prompt-lookup", "auto", "suffix") for s in ("zh-describe", "edit-text"))
    assert {(p.k, p.entropy_threshold, p.policy) for p in free} == {(4, 0.0, "greedy")}
    labels = [p.label() for p in points]
    assert len(set(labels)) == len(labels)  # every point is told apart by its label


def growing(entries: list[dict], bandwidth_gbs: float):
    """A calibration function whose file gains a runtime's entry when that runtime is asked for, and the calls."""
    data = {**CALIBRATION, "bandwidth_gbs": bandwidth_gbs, "entries": []}
    calls: list[tuple[str, str]] = []

    def calibrate(models, runtimes, threads):
        for model in models:
            for runtime in runtimes:
                calls.append((model, runtime))
                data["entries"] += [e for e in entries if (e["model"], e["runtime"]) == (model, runtime)]
        return data
    return calibrate, calls


def test_a_runtime_whose_floor_loses_every_role_is_neither_converted_nor_measured(monkeypatch):
    """One runtime at a time, those that load in seconds and read the fewest bits first; every later one, converted or
    not, is measured only where the step its weights' bytes allow at the measured bandwidth (a lower bound) could
    still win a role against what was measured before it, and the choice says which were left out and why."""
    from bench.measure import runtime_auto

    measurable = [
        {**entry(CLOUD, "kernels-int4", 33, 0.1), "weight_bytes": 9 * 10**8, "block_vs_steps": 0.0},
        {**entry(CLOUD, "llamacpp", 36, 0.9), "weight_bytes": 10**9},
        {**entry(CLOUD, "onnx-int4", 40, 0.2), "weight_bytes": 9 * 10**8, "block_vs_steps": 0.0},
        {**entry(EDGE, "kernels-int4", 12, 0.1), "weight_bytes": 3 * 10**8, "block_vs_steps": 0.0},
        {**entry(EDGE, "llamacpp", 20, 0.9), "weight_bytes": 4 * 10**8}]
    calibrate, calls = growing(measurable, 34.0)
    monkeypatch.setattr(runtime_auto, "installed", lambda candidates: candidates)
    chooser = AutoRuntimes(calibration=calibrate, progress=False)
    resolved = chooser({"edge": EDGE, "cloud": CLOUD, "edge_runtime": "auto", "cloud_runtime": "auto",
                        "plain_runtimes": "auto", "k": [4], "policy": ["greedy"], "edge_cores": 2})
    cloud_calls = [runtime for model, runtime in calls if model == CLOUD]
    # params <= 9e8 B * 8 / 4 bits = 1.8e9: an int8 runtime reads >= 1.8 GB a step, 53 ms at 34 GB/s, above
    # 1.25 x 33 ms (plain) and kernels-int4's exact 5-token block (33 x 1.4 = 46 ms); an int4 one 26 ms, below both.
    # The int8 kernels and torch's int8 load in seconds, but are left out by the same bound once kernels-int4 is in.
    assert cloud_calls[0] == "kernels-int4" and {"llamacpp", "onnx-int4"} <= set(cloud_calls)
    assert not set(cloud_calls) & {"kernels-int8", "torch-int8", "onnx-int8", "openvino-int8", "torch-int8t", "torch"}
    assert resolved["cloud_runtime"] == ("kernels-int4",)
    cloud = next(c for c in chooser.choices if c.role == "cloud")
    assert "not measured: " in cloud.reason and "onnx-int8: its floor (53 ms a step" in cloud.reason
    assert "kernels-int8: its floor (53 ms a step" in cloud.reason
    # the edge: 3e8 B * 8 / 4 = 6e8 params, an int8 floor of 18 ms above kernels-int4's 12 ms step; int4's 9 ms below
    edge_calls = [runtime for model, runtime in calls if model == EDGE]
    assert edge_calls[0] == "kernels-int4" and "kernels-int8" not in edge_calls and "onnx-int4" in edge_calls
    assert resolved["edge_runtime"] == ("kernels-int4",)


def test_a_floor_takes_the_fastest_the_memory_was_read_anywhere_in_the_file(monkeypatch):
    """The file's first reading was 34 GB/s, the kernels' rounds read 68 minutes later: at 68 an int8 runtime's floor
    is 26 ms, below kernels-int4's 46 ms block, so it is measured (at 34 its 53 ms would have ruled it out)."""
    from bench.measure import runtime_auto

    measurable = [{**entry(CLOUD, "kernels-int4", 33, 0.1), "weight_bytes": 9 * 10**8, "block_vs_steps": 0.0,
                   "bandwidth_gbs": 68.0}]
    calibrate, calls = growing(measurable, 34.0)
    monkeypatch.setattr(runtime_auto, "installed", lambda candidates: candidates)
    chooser = AutoRuntimes(calibration=calibrate, progress=False)
    chooser.calibrate_promising(CLOUD, ("kernels-int4", "kernels-int8", "onnx-int8"), 2, (4,), ("greedy",),
                                ("cloud", "plain"))
    assert [runtime for _, runtime in calls] == ["kernels-int4", "kernels-int8", "onnx-int8"]
    assert chooser.skipped[CLOUD] == []


def test_a_runtime_the_file_holds_is_never_left_out_and_costs_no_measurement(monkeypatch):
    """An entry already in the file is used even where its floor would have left it out: it cost nothing."""
    from bench.measure import runtime_auto

    held = [{**entry(CLOUD, "kernels-int4", 33, 0.1), "weight_bytes": 9 * 10**8, "block_vs_steps": 0.0},
            {**entry(CLOUD, "kernels-int8", 60, 0.05), "weight_bytes": 18 * 10**8, "block_vs_steps": 0.0}]
    data = {**CALIBRATION, "bandwidth_gbs": 34.0, "entries": held}
    calls: list = []

    def calibrate(models, runtimes, threads):
        calls.append(tuple(runtimes))
        return data
    monkeypatch.setattr(runtime_auto, "installed", lambda candidates: candidates)
    chooser = AutoRuntimes(calibration=calibrate, progress=False)
    measured = chooser.calibrate_promising(CLOUD, ("kernels-int4", "kernels-int8", "onnx-int8"), 2, (4,), ("greedy",),
                                           ("cloud", "plain"))
    assert measured is data and calls == [("kernels-int4",)]
    assert chooser.skipped[CLOUD] == [s for s in chooser.skipped[CLOUD] if s.startswith("onnx-int8: its floor")] != []


def test_auto_needs_the_chooser_and_stands_alone(tmp_path):
    with pytest.raises(ConfigError, match="chosen from the machine's calibration"):
        SweepConfig.from_toml("default")
    calibrate, _ = given(CALIBRATION)
    with pytest.raises(ConfigError, match="auto chooses the runtime itself"):
        SweepConfig.from_mapping({"edge": EDGE, "cloud": CLOUD, "cloud_runtime": ["auto", "llamacpp"]},
                                 choose_runtimes=AutoRuntimes(calibration=calibrate))


def test_a_row_must_name_grid_axes(tmp_path):
    config = tmp_path / "sweep.toml"
    config.write_text(f'edge = "{EDGE}"\ncloud = "{CLOUD}"\n[[rows]]\ncolour = ["blue"]\n')
    with pytest.raises(ConfigError, match="rows: each row is a table of grid axes .* not 'colour'"):
        SweepConfig.from_toml(config)


def test_a_row_adds_points_and_the_grid_keeps_its_own(tmp_path):
    config = tmp_path / "sweep.toml"
    config.write_text(f'edge = "{EDGE}"\ncloud = "{CLOUD}"\nmode = ["spec"]\nk = [2, 4]\n'
                      '[[rows]]\ndrafter = ["prompt-lookup"]\nk = [8]\n')
    points = SweepConfig.from_toml(config).points()
    assert sorted((p.drafter, p.k) for p in points) == [("model", 2), ("model", 4), ("prompt-lookup", 8)]


def test_constraints_none_leaves_a_points_key_as_it_was():
    """Folders written before constraints was an axis keep their keys (and their scores)."""
    before = Point(mode="spec", k=4, prompts="code")
    assert Point(mode="spec", k=4, prompts="code", constraints="none").key() == before.key()
    assert Point(mode="spec", k=4, prompts="code", constraints="zh").key() != before.key()


def test_a_verify_line_fits_a_calibrated_block_curve():
    from bench.derive.runtime_choice import verify_cost_ms

    a_ms, b_ms = verify_cost_ms(entry(CLOUD, "torch-int8", 100, 0.25))  # t(m) = 100 (1 + 0.25 (m - 1)) = 75 + 25 m
    assert a_ms == pytest.approx(75) and b_ms == pytest.approx(25)
    flat = verify_cost_ms({**entry(CLOUD, "torch", 100, 0.0), "block_steps": {"1": 1.0, "2": 0.98, "5": 0.97}})
    assert flat[1] == 0.0  # a curve that falls is flat, never a negative cost per token


def test_predict_takes_its_costs_from_this_machines_calibration(tmp_path, monkeypatch):
    from bench.commands.predict import calibrated_costs
    from bench.measure import calibrate
    from specdec.machine import fingerprint

    monkeypatch.setenv("SPECBENCH_HOME", str(tmp_path))
    path = calibrate.calibration_path(fingerprint()["machine_class"])
    path.parent.mkdir(parents=True)
    data = {**CALIBRATION, "fingerprint": fingerprint(), "versions": {}, "created": "2026-11-26", "threads": 2}
    path.write_text(__import__("json").dumps(data))
    verify, edge_ms = calibrated_costs(f"{CLOUD}:torch-int8,{EDGE}:llamacpp")
    a_ms, b_ms = (float(v) for v in verify.split(","))
    assert a_ms == pytest.approx(107 * (1 - 0.095)) and b_ms == pytest.approx(107 * 0.095) and float(edge_ms) == 30
    with pytest.raises(ConfigError, match=r"no working qwen2.5-coder-0.5b in torch-int8t: run `specbench calibrate"):
        calibrated_costs(f"{CLOUD}:torch-int8,{EDGE}:torch-int8t")
    with pytest.raises(ConfigError, match="need CLOUD:RUNTIME,EDGE:RUNTIME"):
        calibrated_costs(CLOUD)


def test_a_rows_prompt_sets_are_validated_and_run(tmp_path):
    config = tmp_path / "sweep.toml"
    config.write_text(f'edge = "{EDGE}"\ncloud = "{CLOUD}"\nprompts = ["code"]\n[[rows]]\nprompts = ["edit-text"]\n')
    assert SweepConfig.from_toml(config).prompt_sets() == ("code", "edit-text")
    points = SweepConfig.from_toml(config).points()
    assert {p.prompts for p in points} == {"code", "edit-text"}


def test_the_sweep_chooses_from_this_machines_calibration_file_without_measuring(tmp_path, monkeypatch, capsys):
    """The default chooser reads $SPECBENCH_HOME/calibration/<class>.json; entries that are fresh (this
    method, these versions) are not measured again, and the choice is printed by `specbench sweep`'s path."""
    import json

    from bench.measure import calibrate
    from specdec.machine import fingerprint

    monkeypatch.setenv("SPECBENCH_HOME", str(tmp_path))
    monkeypatch.setattr(calibrate, "measure_isolated", lambda *a, **k: pytest.fail("measured"))
    monkeypatch.setattr(calibrate, "measure_bandwidth", lambda *a, **k: pytest.fail("measured the bandwidth"))
    from bench.measure import runtime_auto  # the candidates this file has entries for (the ONNX ones are extras)
    listed = {"cloud": ("llamacpp", "torch-int8", "torch-int8t", "torch"), "edge": ("llamacpp", "torch-int8", "torch")}
    monkeypatch.setattr(runtime_auto, "candidates", listed.__getitem__)
    entries = [{**e, "method": calibrate.METHOD, "block_vs_steps": 0.0 if e["runtime"] == "torch-int8t" else 0.4}
               for e in CALIBRATION["entries"]]
    # the cloud's candidates, for either model
    entries.append({**entry(EDGE, "torch-int8t", 60, 0.1), "method": calibrate.METHOD})
    path = calibrate.calibration_path(fingerprint()["machine_class"])
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({**CALIBRATION, "fingerprint": fingerprint(), "versions": calibrate.runtime_versions(),
                                "created": "2026-11-26", "threads": 2, "entries": entries}))
    monkeypatch.setattr("bench.measure.runtime_auto.installed", lambda candidates: candidates)  # llamacpp or not
    chooser = AutoRuntimes(progress=False)
    config = SweepConfig.from_toml("default", choose_runtimes=chooser)
    assert (config.edge_runtime, config.cloud_runtime) == (("llamacpp",), ("torch-int8t",))
    assert chooser.record()["fingerprint"]["machine_class"] == fingerprint()["machine_class"]


def test_a_sweeps_workers_read_the_block_costs_its_runtimes_were_chosen_from(tmp_path):
    import json

    from bench.measure.sweep.worker import block_costs

    (tmp_path / "machine.json").write_text(json.dumps(AutoRuntimes(calibration=given(CALIBRATION)[0]).record()
                                                      | {"calibration": CALIBRATION["entries"]}))
    costs = block_costs(str(tmp_path))
    assert costs[(CLOUD, "torch-int8t")]["5"] == pytest.approx(1.4)
    (tmp_path / "machine.json").write_text("{not json")
    assert block_costs(str(tmp_path)) == {} and block_costs(None) == {} and block_costs(str(tmp_path / "x")) == {}
