"""Gate files and how two are judged: the format `specbench gate` writes (a baseline in
bench/baselines/, or a saved run), the tolerances, one `Check` per gated metric and the verdict.
`specbench gate` measures (bench/measure/gate.py); `specbench compare` only reads (bench/read/compare.py); both
judge with these rules.

Deterministic metrics compare exactly (hashes, counts, flags) or within `rate_abs`. A timing ratio
(higher is better) is judged on its per-repeat values, current against baseline: it fails when the
one-sided `confidence` upper bound of median(current) / median(baseline) (bootstrap, bench.derive.metrics)
is below 1 - timing_margin, i.e. when the run shows, with that confidence, a drop larger than the
drift that unchanged code shows between runs. A drop whose estimate is past the margin but whose
bound is not is `undecided`: the gate then measures more repeats. Absolute tokens/s are never gated.
Timing ratios are judged only against a baseline from the same machine class (specdec/machine.py; a
file records it in environment.fingerprint): from another machine, or one that records none, they are
shown without a verdict, and the deterministic metrics are still judged exactly. Baselines are kept one
per class, bench/baselines/<suite>/<machine_class>.json (`choose_baseline`).
"""
from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import TypeGuard

from bench.core.metric_registry import TIMING_RATIO, direction
from bench.derive import metrics
from specdec.errors import InputError
from specdec.machine import describe

BASELINES = Path(__file__).parent.parent / "baselines"  # <suite>/<machine_class>.json, one per class
FALLBACK = "unknown-machine"  # <suite>/unknown-machine.json: measured before fingerprints, on a machine nobody recorded
FORMAT = 1
REQUIRED = ("format", "suite", "workload", "deterministic", "timing")
NOT_JUDGED = "not judged: another machine"  # a timing check's rule against another machine's baseline


class Suite(StrEnum):
    """The gate's workloads (Workload.suite, `specbench gate --suite`, a gate file's `suite`; bench/measure/workload.py
    builds each): defined here, below what measures and what reads a gate, as each has its tolerance and baselines."""

    TINY = "tiny"  # an in-process random pair, fp32 (seconds)
    REAL = "real"  # the Qwen2.5-Coder pair, bf16 (minutes)


@dataclass(frozen=True)
class Tolerance:
    rate_abs: float = field(metadata={"help": "largest |current - baseline| of a deterministic float"})
    timing_margin: float = field(metadata={
        "help": "drift of a timing ratio between runs of unchanged code; only a drop beyond it can fail"})
    confidence: float = field(default=0.95, metadata={"help": "one-sided confidence of a timing failure"})

    def __post_init__(self) -> None:
        if not self.rate_abs >= 0:
            raise ValueError(f"rate_abs must be >= 0, got {self.rate_abs}")
        if not 0 <= self.timing_margin < 1:
            raise ValueError(f"timing_margin must be in [0, 1), got {self.timing_margin}")
        if not 0.5 < self.confidence < 1:
            raise ValueError(f"confidence must be in (0.5, 1), got {self.confidence}")


# tiny: fp32 on a fixed in-process pair: bit-reproducible on one machine and torch version.
# real: bf16 is just as reproducible on one machine (same kernels, same thread count: repeated runs
#   gave identical hashes), so rates are exact there too; the baseline is per machine: another
#   CPU's bf16 kernels may flip near-tie argmaxes, which the hash reports (re-run --update there).
# timing_margin: medians of unchanged code moved at most 3 % between tiny runs here, quiet or with a
#   busy process beside the gate (bench/baselines/README.md); a 20 % slower edge or cloud forward
#   moves its ratio to HF's own greedy loop by 15-17 %, far past 5 %.
TOLERANCES = {Suite.TINY: Tolerance(rate_abs=1e-9, timing_margin=0.05),
              Suite.REAL: Tolerance(rate_abs=1e-9, timing_margin=0.05)}


@dataclass(frozen=True)
class Check:
    metric: str
    kind: str  # "workload" | "deterministic" | "timing"
    baseline: object
    current: object
    ok: bool
    rule: str  # the tolerance applied, in words
    note: str = ""
    undecided: bool = False  # timing: a drop past the margin that the repeats cannot yet confirm
    judged: bool = True  # False: shown without a verdict (a timing ratio against another machine's baseline)

    @property
    def direction(self) -> str | None:
        """Which way is better (bench/core/metric_registry.py); None for a hash, flag or workload setting."""
        if self.kind == "timing":
            return TIMING_RATIO.direction
        return direction(self.metric) if self.kind == "deterministic" else None

    def line(self) -> str:
        status = "--  " if not self.judged else "ok  " if self.ok else "FAIL"
        moved = f"{show_value(self.baseline)} -> {show_value(self.current)}"
        if self.kind == "timing" and _finite(self.baseline) and _finite(self.current) and self.baseline:
            moved += f" ({self.current / self.baseline - 1:+.1%})"
        note = f"  [{self.note}]" if self.note else ""
        return f"{status} {self.kind:13} {self.metric:32} {moved}  ({self.rule}){note}"


def _finite(value) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def show_value(value) -> str:
    if isinstance(value, str) and len(value) == 64:
        return value[:12]  # a sha256
    if isinstance(value, float):
        return f"{value:.6g}"
    return json.dumps(value) if not isinstance(value, str) else value


def compare(baseline: dict, current: dict, tolerance: Tolerance) -> list[Check]:
    """Every gated metric of `current` against `baseline`."""
    checks = []
    base_w, now_w = (json.loads(json.dumps(r["workload"])) for r in (baseline, current))  # tuples -> lists
    for key in sorted(base_w.keys() | now_w.keys()):
        if key != "repeats" and base_w.get(key) != now_w.get(key):
            checks.append(Check(f"workload.{key}", "workload", base_w.get(key), now_w.get(key), False, "must match",
                                "the workload changed: re-measure with --update"))
    for metric in sorted(baseline["deterministic"].keys() | current["deterministic"].keys()):
        base, now = baseline["deterministic"].get(metric), current["deterministic"].get(metric)
        if isinstance(base, float) and _finite(now):
            ok = abs(now - base) <= tolerance.rate_abs
            rule = f"±{tolerance.rate_abs:g}"
        else:
            ok, rule = base == now, "exact"
        checks.append(Check(metric, "deterministic", base, now, ok, rule))
    other = other_machine(machine_of(baseline), machine_of(current))
    for metric in sorted(baseline["timing"].keys() | current["timing"].keys()):
        check = timing_check(metric, baseline, current, tolerance)
        if other:
            measured = check.note.split(":")[0]  # the estimate and its bounds, without a verdict's words
            check = replace(check, ok=True, undecided=False, judged=False, rule=NOT_JUDGED, note=measured)
        checks.append(check)
    return checks


# --- machines --------------------------------------------------------------------------------
def machine_of(record: dict) -> dict | None:
    """The machine fingerprint a gate file or a folder's identity records in its environment; None for
    one written before fingerprints were."""
    found = (record.get("environment") or {}).get("fingerprint")
    return found if isinstance(found, dict) and isinstance(found.get("machine_class"), str) else None


def describe_machine(found: dict | None) -> str:
    return describe(found) if found else "an unknown machine (recorded before machine fingerprints)"


def other_machine(baseline: dict | None, current: dict | None, current_is: str = "this is") -> str | None:
    """Why timings of `current` cannot be judged against `baseline` ("baseline from <machine>, this is
    <machine>"), or None when both are one machine class. A baseline that records no machine is another
    machine; two that record none (both older than fingerprints) are judged as they always were."""
    if baseline is None and current is None:
        return None
    if baseline is not None and current is not None and baseline["machine_class"] == current["machine_class"]:
        return None
    return f"baseline from {describe_machine(baseline)}, {current_is} {describe_machine(current)}"


def timing_check(metric: str, baseline: dict, current: dict, tolerance: Tolerance) -> Check:
    """One timing ratio: fail iff the run shows a drop beyond the margin with the tolerance's
    confidence (see the module's docstring). A file without per-repeat values has one value."""
    base, now = baseline["timing"].get(metric), current["timing"].get(metric)
    floor = 1 - tolerance.timing_margin
    rule = f"fails if the {tolerance.confidence:.0%} upper bound of current/baseline < {floor:.2f}"
    if not (_finite(base) and _finite(now)):
        return Check(metric, "timing", base, now, False, rule, "missing")
    base_repeats = baseline.get("timing_repeats", {}).get(metric) or [base]
    now_repeats = current.get("timing_repeats", {}).get(metric) or [now]
    low, high = metrics.ratio_of_medians_ci(now_repeats, base_repeats, tolerance.confidence)
    estimate = metrics.ratio(statistics.median(now_repeats), statistics.median(base_repeats))
    ok = not high < floor
    note = f"x{estimate:.3f}, bounds {low:.3f}-{high:.3f}"
    undecided = ok and estimate < floor
    if undecided:
        note += ": a drop the repeats cannot yet confirm"
    elif low > 1 + tolerance.timing_margin:
        note += ": improved beyond the margin, consider --update"
    return Check(metric, "timing", base, now, ok, rule, note, undecided)


def environment_notes(baseline: dict, current: dict) -> list[str]:
    """Differences that can legitimately move deterministic metrics (kernels, versions)."""
    keys = ("torch", "transformers", "machine", "cpu_count", "torch_threads")
    base, now = baseline.get("environment") or {}, current.get("environment") or {}
    return [f"{k}: baseline {base.get(k)!r}, now {now.get(k)!r}" for k in keys if k in base and base.get(k) != now.get(k)]


# --- baseline files --------------------------------------------------------------------------
@dataclass(frozen=True)
class BaselineChoice:
    path: Path
    own_class: bool  # measured on this machine's class: its timing ratios are judged


def baseline_path(suite: str, machine_class: str) -> Path:
    """A machine class's baseline of `suite`, the one file `--update` on that class writes."""
    return BASELINES / suite / f"{machine_class}.json"


def choose_baseline(suite: str, machine_class: str) -> BaselineChoice:
    """The baseline the gate judges `suite` against on `machine_class`: that class's own file; without
    one, the most recently measured of the suite's other files (another class's, or unknown-machine.json
    from before fingerprints): its deterministic metrics are still judged, its timings are not."""
    own = baseline_path(suite, machine_class)
    if own.is_file():
        return BaselineChoice(own, True)
    folder = own.parent
    others = sorted(folder.glob("*.json"))
    if not others:
        raise InputError(f"no {suite} baseline in {folder}: measure one with `specbench gate --suite {suite} --update`")
    return BaselineChoice(max(others, key=_measured_at), False)


def _measured_at(path: Path) -> str:
    """When a gate file was measured (its ISO date in UTC, which sorts as text); "" if it says not."""
    return str((read_gate_file(path).get("environment") or {}).get("date", ""))


def read_gate_file(path: Path) -> dict:
    """A gate JSON (baseline or saved run), validated; InputError naming the problem otherwise."""
    fix = "regenerate it with `specbench gate --update`"
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise InputError(f"no gate file at {path}: create the baseline with `specbench gate --update`") from None
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"cannot read gate file {path}: {e}") from None
    except json.JSONDecodeError as e:
        raise InputError(f"gate file {path} is not valid JSON ({e.msg}, line {e.lineno}): {fix}") from None
    if not isinstance(data, dict):
        raise InputError(f"gate file {path} must hold a JSON object: {fix}")
    if missing := [key for key in REQUIRED if key not in data]:
        raise InputError(f"gate file {path} is malformed (missing {', '.join(missing)}): {fix}")
    if data["format"] != FORMAT:
        raise InputError(f"gate file {path} has format {data['format']!r}, this version reads {FORMAT}: {fix}")
    if data["suite"] not in TOLERANCES:
        raise InputError(f"gate file {path} names unknown suite {data['suite']!r}: use one of {', '.join(TOLERANCES)}")
    for key in ("workload", "deterministic", "timing"):
        if not isinstance(data[key], dict):
            raise InputError(f"gate file {path} is malformed ({key!r} must be an object): {fix}")
    return data


def write_gate_file(path: Path, record: dict) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n")


def verdict(checks: list[Check]) -> tuple[bool, str]:
    judged = [c for c in checks if c.judged]
    unjudged = f" ({len(checks) - len(judged)} timing checks not judged: another machine)" if len(judged) < len(checks) else ""
    failed = [c.metric for c in judged if not c.ok]
    if failed:
        names = ", ".join(failed[:4]) + (f" and {len(failed) - 4} more" if len(failed) > 4 else "")
        return False, f"gate FAILED: {len(failed)} of {len(judged)} checks moved ({names}){unjudged}"
    return True, f"gate passed: {len(judged)} checks{unjudged}"
