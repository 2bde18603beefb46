"""`specbench profile`: where the time of one `specbench run` goes.

Three views of the same configuration, written to PROFILE (--out):
  flamegraph.svg, speedscope.json  py-spy samples of the whole `specbench run` process (Python
                                   frames; C/C++ too with --native), one py-spy pass per format
  torch_ops.csv / .txt, torch_trace.json
                                   torch.profiler (CPU activities) around the engine's generate on
                                   the first prompt(s), after one unprofiled warm-up generate
  run/                             the run's results (results.jsonl, run.json), as `specbench run`
  profile.json                     what ran, whether py-spy could sample, and the time split
See profiles/README.md for how to read them.
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from bench.core.audio import MAX_SECONDS, model_limits, read_audio
from bench.derive import metrics

PTRACE_HINTS = ("permission denied", "operation not permitted", "ptrace", "eperm", "failed to open process")
PY_SPY_FORMATS = (("flamegraph", "flamegraph.svg"), ("speedscope", "speedscope.json"))
SPLIT_COUNTS = ("latency_s", "edge_s", "cloud_s", "overhead_s", "cloud_calls", "cycles", "new_tokens")


def _py_spy_executable() -> str | None:
    beside = Path(sys.executable).parent / "py-spy"  # the virtualenv's own, installed with specbench
    return str(beside) if beside.is_file() else shutil.which("py-spy")


def _run_in_own_group(command: list[str]) -> tuple[int, str]:
    """Run `command` in a new process group and end that group afterwards: a py-spy that gives up
    must not leave its `specbench run` child writing into the results we are about to complete."""
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                               start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        _, stderr = process.communicate()
    finally:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass  # the group is gone: nothing left running
    return process.returncode, stderr or ""


def py_spy_passes(args: argparse.Namespace, out: Path, run_argv: Callable[[Path], list[str]], log=print) -> dict:
    """One `specbench run` under `py-spy record` per output format (`run_argv(run_dir)`: the run's
    arguments, given by the `profile` command, which owns the flags). The first pass writes the
    run's results to OUT/run; later passes run the same configuration into a scratch folder
    (a resumed run would do nothing). Returns {"status": ok|skipped|failed, ...}."""
    executable = _py_spy_executable()
    if args.no_py_spy:
        return {"status": "skipped", "reason": "--no-py-spy"}
    if executable is None:
        return {"status": "skipped", "reason": "py-spy is not installed: pip install py-spy"}
    files = {}
    for number, (fmt, name) in enumerate(PY_SPY_FORMATS, start=1):
        with tempfile.TemporaryDirectory(prefix="specbench-profile-") as scratch:
            run_dir = out / "run" if number == 1 else Path(scratch) / "run"
            command = [executable, "record", "--format", fmt, "--output", str(out / name), "--rate", str(args.rate),
                       *(["--native"] if args.native else []), "--",
                       sys.executable, "-m", "bench.cli", "run", *run_argv(run_dir)]
            log(f"py-spy pass {number}/{len(PY_SPY_FORMATS)} ({fmt}): {' '.join(command[:3])} ... run")
            start = time.perf_counter()
            returncode, stderr = _run_in_own_group(command)
        tail = stderr.strip().splitlines()[-5:]
        if returncode != 0 or not (out / name).is_file():
            text = " / ".join(tail).lower()
            if any(hint in text for hint in PTRACE_HINTS):
                reason = ("py-spy may not read the process's memory (ptrace is not permitted here; in a container "
                          "add --cap-add SYS_PTRACE, or run as root)")
                return {"status": "skipped", "reason": reason, "stderr": tail}
            return {"status": "failed", "reason": f"py-spy exited with code {returncode}", "stderr": tail}
        files[fmt] = name
        log(f"  wrote {out / name} ({time.perf_counter() - start:.1f} s)")
    return {"status": "ok", "files": files, "rate_hz": args.rate, "native": args.native}


def torch_ops(engine, records: list, out: Path) -> pd.DataFrame:
    """torch.profiler over the engine's generate on `records`, after one warm-up generate (first-call
    costs such as allocator growth and lazy initialisation stay out of the table)."""
    from torch.profiler import ProfilerActivity, profile

    inputs = [(r.prompt, r.system, *_waveform(engine, r)) for r in records]
    engine.generate(*inputs[0])
    with profile(activities=[ProfilerActivity.CPU]) as profiler:
        for prompt in inputs:
            engine.generate(*prompt)
    averages = profiler.key_averages()
    table = pd.DataFrame(
        [{"op": e.key, "calls": e.count, "self_cpu_us": e.self_cpu_time_total, "total_cpu_us": e.cpu_time_total}
         for e in averages]
    ).sort_values("self_cpu_us", ascending=False, kind="stable")
    table["self_cpu_percent"] = 100 * table["self_cpu_us"] / max(table["self_cpu_us"].sum(), 1e-9)
    table.to_csv(out / "torch_ops.csv", index=False, float_format="%.3f")
    (out / "torch_ops.txt").write_text(averages.table(sort_by="self_cpu_time_total", row_limit=40), encoding="utf-8")
    profiler.export_chrome_trace(str(out / "torch_trace.json"))
    return table


def _waveform(engine, record) -> tuple:
    """(waveform, sampling rate) as `bench.measure.run.generate_one` reads them; (None, 16000) for text."""
    if not record.audio:
        return None, 16000
    rate, cap_s = model_limits(engine.primary.feature_extractor, MAX_SECONDS)
    return read_audio(record.audio, record.id, rate, cap_s), rate


def time_split(rows: list[dict]) -> dict:
    """Where the run's decode time went, summed over its ok prompts (bench.derive.metrics.time_split)."""
    ok = [r for r in rows if r.get("status", "ok") == "ok"]
    return metrics.time_split(metrics.totals(ok, SPLIT_COUNTS), prompts=len(ok)) if ok else {}

