"""`auto` runtimes in a sweep config: `edge_runtime`, `cloud_runtime` and `plain_runtimes` chosen from
the calibration of the machine at hand (bench/measure/calibrate.py measures it once and caches it;
bench/derive/runtime_choice.py holds the rules), so the defaults of one machine never decide another's.

    chooser = AutoRuntimes()
    config = SweepConfig.from_toml("default", choose_runtimes=chooser)   # calibrates first if needed
    chooser.record()   # the fingerprint, the figures and every choice: DIR/machine.json, the report's header
"""
from __future__ import annotations

import os
from dataclasses import asdict, replace

from tqdm import tqdm

from bench.derive.calibration import best_bandwidth
from bench.derive.runtime_choice import (
    RuntimeChoice,
    cannot_win,
    cheapest_verifier,
    fastest_plain,
    parameters_at_most,
    usable,
)
from bench.measure.calibrate import calibration
from specdec.errors import ConfigError
from specdec.machine import describe, fingerprint
from specdec.runtime_registry import CLOUD, EDGE, batch_invariant, declared, runtime_installed, runtimes, with_role

AUTO = "auto"
AUTO_FIELDS = ("edge_runtime", "cloud_runtime", "plain_runtimes")


def candidates(role: str) -> tuple[str, ...]:
    """What `auto` chooses among for `role` (CLOUD: the verifier and the plain decoding; EDGE: the drafter), where
    installed: the runtimes whose declarations name the role (specdec/runtimes). torch bf16 is measured too (on an AMX
    machine its blocks are flat); a drafter's text need not match anything, so the edge needs no batch-invariant one."""
    return with_role(role)


def measured_first() -> frozenset[str]:
    """Measured first: nothing to convert, loaded in seconds, and among them the fastest plain decoding and the
    cheapest exact block wherever the kernels run. Each of these too, after the first measured, and every other
    candidate (conversions of minutes, slow torch runtimes) is measured only where its floor says it could still win
    a role against what was measured before it (runtime_choice.cannot_win)."""
    return frozenset(r.name for r in runtimes() if r.measured_first)


def has_auto(values: dict) -> bool:
    return any(AUTO in _as_tuple(values.get(name)) for name in AUTO_FIELDS)


def _as_tuple(value) -> tuple:
    if value is None:
        return ()
    return tuple(value) if isinstance(value, (list, tuple)) else (value,)


def measuring_order(candidates: tuple[str, ...]) -> tuple[str, ...]:
    """The likeliest winners first, so that each measurement tightens the bound the next is judged by: the runtimes
    that load in seconds (measured_first), then the fewest bits a weight (the lowest floor), then those whose blocks
    are their steps (an exact one bounds a lossless grid's verifier); otherwise as declared."""
    first = measured_first()
    return tuple(sorted(candidates, key=lambda r: (r not in first, declared(r).weight_bits, not batch_invariant(r))))


def _usable_or_none(data: dict | None, model: str, candidates: tuple[str, ...], threads: int) -> dict[str, dict]:
    """{runtime: entry} measured without an error, {} where there is none yet."""
    try:
        return usable(data, model, candidates, threads) if data else {}
    except ConfigError:
        return {}


def _ruled_out(runtime: str, data: dict | None, entries: dict[str, dict], ks: tuple[int, ...],
               policies: tuple[str, ...], roles: tuple[str, ...]) -> str | None:
    """Why `runtime` need not be measured (runtime_choice.cannot_win with its floor at the best bandwidth the file
    read), or None."""
    bandwidth_gbs = best_bandwidth(data) if data else None
    if not entries or not bandwidth_gbs:
        return None
    floor_ms = parameters_at_most(entries) * declared(runtime).weight_bits / 8 / (bandwidth_gbs * 1e6)
    return cannot_win(runtime, floor_ms, entries, ks, policies, roles)


def installed(candidates: tuple[str, ...]) -> tuple[str, ...]:
    """The candidates this install can run (llama.cpp and others are extras)."""
    return tuple(r for r in candidates if runtime_installed(r))


class AutoRuntimes:
    """Resolves `auto` in a sweep's settings (SweepConfig.from_mapping calls it) and keeps what it chose.
    `calibration`: a function (models, runtimes, threads) -> the calibration dict; by default the cached
    file of this machine, measured first where missing (specbench calibrate)."""

    def __init__(self, calibration=None, progress: bool = True) -> None:
        self._calibration = calibration
        self.progress = progress
        self.choices: list[RuntimeChoice] = []
        self.measured: dict | None = None
        self.threads: int | None = None
        self.skipped: dict[str, list[str]] = {}  # model -> "runtime: why it was not measured"

    def calibrate_promising(self, model: str, candidates: tuple[str, ...], threads: int, ks: tuple[int, ...],
                            policies: tuple[str, ...], roles: tuple[str, ...]) -> dict:
        """`model`'s calibration, measured one runtime at a time in `measuring_order`: each after the first only unless
        its floor rules it out of every role against what was measured before it (the reason kept in `skipped`, for the
        record and the report). A runtime the file already holds costs nothing and is never left out."""
        data: dict | None = None
        skipped = self.skipped.setdefault(model, [])
        order = measuring_order(candidates)
        with tqdm(order, desc=f"calibrating {model}", unit="runtime", disable=not self.progress) as bar:
            for runtime in bar:
                bar.set_postfix_str(runtime)
                entries = _usable_or_none(data, model, candidates, threads)
                if runtime in entries:
                    continue
                why = _ruled_out(runtime, data, entries, ks, policies, roles)
                if why is None:
                    data = self.calibrate([model], [runtime], threads)
                else:
                    skipped.append(f"{runtime}: {why}")
        return data if data is not None else self.calibrate([model], [], threads)

    def calibrate(self, models: list[str], runtimes: list[str], threads: int) -> dict:
        if self._calibration is not None:
            return self._calibration(models, runtimes, threads)
        return calibration(models, runtimes, threads, progress=False)  # calibrate_promising's bar counts the runtimes

    def __call__(self, values: dict) -> dict:
        if not has_auto(values):
            return values
        for name in AUTO_FIELDS:
            listed = _as_tuple(values.get(name))
            if AUTO in listed and len(listed) > 1:
                raise ConfigError(f"{name} = {list(listed)}: auto chooses the runtime itself; give auto alone, or "
                                  "name the runtimes")
        edge, cloud = values.get("edge") or "", values.get("cloud") or ""  # "": not set
        edge_auto = AUTO in _as_tuple(values.get("edge_runtime"))
        if not cloud or (edge_auto and not edge):
            raise ConfigError("auto runtimes are chosen per model from the calibration: set cloud (and edge) = MODEL")
        threads = self.threads = int(values.get("edge_cores") or len(os.sched_getaffinity(0)))
        tables = [values, *(row for row in _as_tuple(values.get("rows")) if isinstance(row, dict))]  # the grid's and rows'
        ks = tuple(dict.fromkeys(int(k) for t in tables for k in _as_tuple(t.get("k")))) or (4,)
        policies = tuple(dict.fromkeys(str(p) for t in tables for p in _as_tuple(t.get("policy")))) or ("threshold",)
        if edge_auto:  # the edge's candidates only: a drafter needs no batch-invariant runtime
            self.calibrate_promising(edge, installed(candidates(EDGE)), threads, ks, policies, ("edge",))
        roles = tuple(role for role, name in (("cloud", "cloud_runtime"), ("plain", "plain_runtimes"))
                      if AUTO in _as_tuple(values.get(name)))
        self.measured = self.calibrate_promising(cloud, installed(candidates(CLOUD)), threads, ks, policies,
                                                 roles)  # the file, both models
        resolved = dict(values)
        if AUTO in _as_tuple(values.get("cloud_runtime")):
            choice = cheapest_verifier(self.measured, cloud, installed(candidates(CLOUD)), ks, policies, int(threads))
            resolved["cloud_runtime"] = choice.runtimes
            self.choices.append(self._with_skipped(choice))
        if AUTO in _as_tuple(values.get("plain_runtimes")):
            choice = fastest_plain(self.measured, cloud, installed(candidates(CLOUD)), threads=int(threads))
            resolved["plain_runtimes"] = choice.runtimes
            self.choices.append(self._with_skipped(choice))
        if edge_auto:
            choice = fastest_plain(self.measured, edge, installed(candidates(EDGE)), role="edge", margin=1.0,
                                   threads=int(threads))
            resolved["edge_runtime"] = choice.runtimes[:1]
            self.choices.append(self._with_skipped(choice))
        return resolved

    def _with_skipped(self, choice: RuntimeChoice) -> RuntimeChoice:
        """The choice, its reason naming the candidates not measured for its model and why."""
        skipped = self.skipped.get(choice.model)
        if not skipped:
            return choice
        return replace(choice, reason=f"{choice.reason}; not measured: {'; '.join(skipped)}")

    def record(self) -> dict:
        """What DIR/machine.json keeps: the machine, its calibration's figures and the choices made from them."""
        found = (self.measured or {}).get("fingerprint") or fingerprint()
        return {"fingerprint": found, "machine": describe(found),
                "bandwidth_gbs": (self.measured or {}).get("bandwidth_gbs"),
                "calibration": [e for e in (self.measured or {}).get("entries", [])
                                if e.get("threads") in (None, self.threads)],
                "choices": [asdict(c) for c in self.choices]}
