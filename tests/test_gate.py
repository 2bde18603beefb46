"""The regression gate (bench/measure/gate.py) catches a 20 % slower edge or cloud forward and a slowed
verifier through its timing ratios and a lowered acceptance through its deterministic metrics,
passes on the unchanged workload (also with a busy process beside it), and refuses bad baselines
with one clear line. Regressions are injected as backend wrappers (our own Backend protocol), never
by patching transformers. No test asserts an absolute timing: the power tests assert the gate's
verdict on the CI workload under the CI tolerance, which is what the gate is for. A verdict that
depends on measured time is a `timing` test (deselected by default, run by .ci/run on its own)."""
import argparse
import json
import subprocess
import sys
import time

import pytest
import torch

from bench.commands import gate as gate_command
from bench.derive import gate_verdict
from bench.measure import gate, tinypair, workload
from specdec.backends.hf_causal import HFCausalBackend
from specdec.errors import InputError
from specdec.machine import fingerprint

pytestmark = pytest.mark.slow  # see CONTRIBUTING.md: the quick loop leaves these out

# A smaller tiny workload keeps the deterministic tests quick; their timing gets a wide margin
# because 3 repeats decide little, and the slowdown they inject is large (~5x on the spec pass).
SMALL = dict(prompts=tinypair.PROMPTS[:2], max_new_tokens=16, repeats=3)
LOOSE = gate_verdict.Tolerance(rate_abs=1e-9, timing_margin=0.3)
CI = gate_verdict.TOLERANCES["tiny"]  # what `specbench gate --suite tiny` applies
VERIFY_DELAY_S = 0.03
SLOWDOWN = 1.2  # "20 % slower": every forward of the wrapped model takes 1.2x its time
TIMING = set(gate.RATIOS)


def quiet(message: str) -> None:
    pass


class SlowVerifier(HFCausalBackend):
    """The cloud backend with a sleep in every forward: what a verifier regression looks like."""

    def __init__(self, inner: HFCausalBackend) -> None:
        super().__init__(inner.model, inner.name)

    def forward(self, state, token_ids, keep=None):
        time.sleep(VERIFY_DELAY_S)
        return super().forward(state, token_ids, keep)


class NoisyDrafter(HFCausalBackend):
    """The edge backend with a fixed random bias on its logits: a drafter that agrees less."""

    def __init__(self, inner: HFCausalBackend, scale: float = 0.5) -> None:
        super().__init__(inner.model, inner.name)
        self.bias = scale * torch.randn(self.vocab_size, generator=torch.Generator().manual_seed(0))

    def forward(self, state, token_ids, keep=None):
        return super().forward(state, token_ids, keep) + self.bias


class SlowerForward(HFCausalBackend):
    """A model whose every forward (prefill included) takes SLOWDOWN times as long: the measured
    forward time again, times SLOWDOWN - 1, spent busy (a slower kernel burns CPU, it does not sleep)."""

    def __init__(self, inner: HFCausalBackend) -> None:
        super().__init__(inner.model, inner.name)

    def _slowed(self, run, *args):
        start = time.perf_counter()
        out = run(*args)
        until = time.perf_counter() + (time.perf_counter() - start) * (SLOWDOWN - 1)
        while time.perf_counter() < until:
            pass
        return out

    def prefill(self, prompt, token_ids, keep=0, use_cache=True):
        return self._slowed(super().prefill, prompt, token_ids, keep, use_cache)

    def forward(self, state, token_ids, keep=None):
        return self._slowed(super().forward, state, token_ids, keep)


def slower(role: str):
    """The wrap that slows `role`'s forward wherever the engine runs it (every mode that uses it)."""
    return lambda mode, r, backend: SlowerForward(backend) if r == role else backend


def slow_verifier(mode, role, backend):
    return SlowVerifier(backend) if (mode, role) == ("spec", "cloud") else backend


def noisy_drafter(mode, role, backend):
    return NoisyDrafter(backend) if (mode, role) == ("spec", "edge") else backend


def failed(baseline: dict, current: dict, tolerance: gate_verdict.Tolerance = LOOSE) -> dict[str, gate_verdict.Check]:
    return {c.metric: c for c in gate_verdict.compare(baseline, current, tolerance) if not c.ok}


@pytest.fixture(scope="module")
def baseline():
    return gate.measure(workload.tiny_workload(**SMALL), log=quiet)


@pytest.fixture(scope="module")
def ci_baseline():
    """The CI workload (`specbench gate --suite tiny`), measured once here as the baseline."""
    return gate.measure(workload.tiny_workload(), log=quiet)


def judged(baseline: dict, wrap=None) -> dict[str, gate_verdict.Check]:
    """The failed checks of a gate run of the CI workload against `baseline`, under the CI tolerance."""
    _, checks = gate.judge(baseline, workload.tiny_workload(), CI, wrap=wrap, log=quiet)
    return {c.metric: c for c in checks if not c.ok}


@pytest.mark.timing
def test_unchanged_workload_passes(baseline):
    current = gate.measure(workload.tiny_workload(**SMALL), log=quiet)
    assert failed(baseline, current) == {}
    assert current["deterministic"]["spec_equals_cloud"] and current["deterministic"]["hf_assisted_equals_spec"]
    assert current["deterministic"]["hf_greedy_cloud_equals_cloud"] and current["deterministic"]["hf_greedy_edge_equals_edge"]
    assert current["deterministic"]["repeats_identical"]


@pytest.mark.timing
def test_unchanged_code_passes_the_ci_gate(ci_baseline):
    assert judged(ci_baseline) == {}


@pytest.mark.timing
def test_unchanged_code_passes_with_a_busy_process_beside_it(ci_baseline):
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        assert judged(ci_baseline) == {}
    finally:
        busy.kill()
        busy.wait()


USES = {"cloud": {"cloud", "spec"}, "edge": {"edge", "spec"}}  # the modes that run each role's model
CONTROLS = {name for name, (_, den) in gate.RATIOS.items() if den.startswith("hf_")}


@pytest.mark.timing
@pytest.mark.parametrize("role", ["cloud", "edge"])
def test_a_20_percent_slower_forward_fails_the_ci_gate(ci_baseline, role):
    """Slowing one model's forward in every mode leaves some ratios between our own modes flat
    (spec/cloud even rises when the cloud slows); the control ratios against transformers' own
    loops, which the wrapper does not touch, drop by up to ~16 %, past the 5 % margin with
    confidence. Which control crosses first depends on the machine's noise that day (a CI run
    caught the slower cloud through spec/HF assisted, x0.88, while cloud/HF greedy stayed
    undecided), so the test asks for any control whose numerator runs the slowed model."""
    moved = judged(ci_baseline, wrap=slower(role))
    assert moved.keys() <= TIMING, moved  # outputs are unchanged: only the time moved
    caught = {name for name in moved.keys() & CONTROLS if gate.RATIOS[name][0] in USES[role]}
    assert caught, moved
    for name in caught:
        check = moved[name]
        assert check.current < check.baseline and "FAIL" in check.line() and "upper bound" in check.line()


@pytest.mark.timing
def test_slowed_verifier_fails_the_timing_ratios_only(baseline):
    current = gate.measure(workload.tiny_workload(**SMALL), wrap=slow_verifier, log=quiet)
    moved = failed(baseline, current)
    assert {"spec_vs_cloud", "spec_vs_hf_assisted"} <= moved.keys() <= TIMING  # outputs are unchanged
    check = moved["spec_vs_cloud"]
    assert check.current < check.baseline * (1 - LOOSE.timing_margin)
    assert "->" in check.line() and "FAIL" in check.line()


def test_lowered_acceptance_fails_the_deterministic_metrics(baseline):
    current = gate.measure(workload.tiny_workload(**SMALL), wrap=noisy_drafter, log=quiet)
    moved = failed(baseline, current)
    assert current["deterministic"]["spec.acceptance_rate"] < baseline["deterministic"]["spec.acceptance_rate"]
    assert {"spec.acceptance_rate", "spec.cloud_calls_per_token"} <= moved.keys()
    assert "spec.tokens_sha256" not in moved  # greedy verification is lossless: only the cost moved


def test_a_changed_workload_is_reported_not_compared_silently(baseline):
    current = gate.measure(workload.tiny_workload(**{**SMALL, "repeats": 1, "k": 2}), log=quiet)
    moved = failed(baseline, current)
    assert "workload.k" in moved and "workload.repeats" not in moved


def test_committed_tiny_baseline_matches_the_code():
    """The tiny baseline the gate reads here (bench/baselines/tiny/) is current: its deterministic metrics
    reproduce (timing not checked)."""
    chosen = gate_verdict.choose_baseline("tiny", fingerprint()["machine_class"])
    committed = gate_verdict.read_gate_file(chosen.path)
    current = gate.measure(workload.tiny_workload(repeats=1), log=quiet)
    moved = {k: c.line() for k, c in failed(committed, current, gate_verdict.TOLERANCES["tiny"]).items() if k not in TIMING}
    assert moved == {}, "re-measure with `specbench gate --suite tiny --update` if this change is intended"


# --- the command ------------------------------------------------------------------------------
def gate_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="specbench")
    gate_command.add_gate_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["gate", *argv])


@pytest.fixture
def small_suite(monkeypatch):
    monkeypatch.setitem(workload.SUITES, "tiny", lambda: workload.tiny_workload(**SMALL))
    monkeypatch.setitem(gate_verdict.TOLERANCES, "tiny", LOOSE)


@pytest.mark.timing
def test_update_then_gate_passes_and_a_regression_exits_1(tmp_path, small_suite, capsys):
    path = tmp_path / "tiny.json"
    assert gate_command.cmd_gate(gate_args("--baseline", str(path), "--update")) == 0
    assert gate_verdict.read_gate_file(path)["suite"] == "tiny"
    before = path.read_text()
    assert gate_command.cmd_gate(gate_args("--baseline", str(path))) == 0
    assert "gate passed" in capsys.readouterr().out
    assert gate_command.cmd_gate(gate_args("--baseline", str(path)), wrap=slow_verifier) == 1
    out = capsys.readouterr().out
    assert "gate FAILED" in out
    assert any(line.startswith("FAIL") and "spec_vs_cloud" in line and "->" in line for line in out.splitlines())
    assert path.read_text() == before  # only --update writes the baseline


@pytest.mark.parametrize("content, message", [
    (None, "no gate file at"),
    ("{not json", "is not valid JSON"),
    ("[1, 2]", "must hold a JSON object"),
    (json.dumps({"format": 1, "suite": "tiny"}), "malformed (missing workload, deterministic, timing)"),
    (json.dumps({"format": 1, "suite": "huge", "workload": {}, "deterministic": {}, "timing": {}}), "unknown suite 'huge'"),
    (json.dumps({"format": 1, "suite": "real", "workload": {}, "deterministic": {}, "timing": {}}), "pass --suite real"),
])
def test_bad_baseline_is_one_clear_error_before_measuring(tmp_path, content, message, monkeypatch):
    path = tmp_path / "baseline.json"
    if content is not None:
        path.write_text(content)
    monkeypatch.setattr(gate, "measure", lambda *a, **k: pytest.fail("measured despite a bad baseline"))
    with pytest.raises(InputError, match=message.replace("(", r"\(").replace(")", r"\)")) as error:
        gate_command.cmd_gate(gate_args("--baseline", str(path)))
    assert "\n" not in str(error.value)


def test_tolerance_validates_itself():
    with pytest.raises(ValueError, match="timing_margin must be in"):
        gate_verdict.Tolerance(rate_abs=0, timing_margin=1.5)
    with pytest.raises(ValueError, match="confidence must be in"):
        gate_verdict.Tolerance(rate_abs=0, timing_margin=0.05, confidence=0.3)


def test_a_timing_drop_is_judged_by_its_repeats_not_its_median_alone():
    """The same 10 % drop of the median fails with tight repeats, is undecided with scattered ones."""
    def record(values):
        return {"timing": {"r": sorted(values)[len(values) // 2]}, "timing_repeats": {"r": values}}

    base = record([1.0, 1.01, 0.99, 1.0, 1.02, 0.98, 1.0])
    tight = gate_verdict.timing_check("r", base, record([0.9, 0.91, 0.89, 0.9, 0.9, 0.91, 0.89]), CI)
    scattered = gate_verdict.timing_check("r", base, record([0.9, 1.3, 0.6, 0.9, 1.2, 0.7, 0.95]), CI)
    assert not tight.ok and not tight.undecided
    assert scattered.ok and scattered.undecided
