"""How often the tiny gate is wrong, measured: false alarms on unchanged code (quiet, or with one
busy process beside it) and misses on a 20 % slower cloud or edge forward (injected as in
tests/test_gate.py). Each run is a full `specbench gate --suite tiny` judgement against the
committed baseline. Not a test (minutes); run it under nice:

    nice -n 19 .venv/bin/python -m tests.gate_power --runs 10 [--busy] CONDITION...

CONDITION: unchanged, cloud, edge (every mode), spec-cloud, spec-edge (the spec mode only).
"""
import argparse
import os
import subprocess
import sys

from bench.derive import gate_verdict
from bench.measure import gate, workload
from specdec.machine import fingerprint
from tests.test_gate import SlowerForward, quiet

WRAPS = {
    "unchanged": None,
    "cloud": lambda mode, role, backend: SlowerForward(backend) if role == "cloud" else backend,
    "edge": lambda mode, role, backend: SlowerForward(backend) if role == "edge" else backend,
    "spec-cloud": lambda mode, role, backend: SlowerForward(backend) if (mode, role) == ("spec", "cloud") else backend,
    "spec-edge": lambda mode, role, backend: SlowerForward(backend) if (mode, role) == ("spec", "edge") else backend,
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("conditions", nargs="+", choices=sorted(WRAPS))
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--busy", action="store_true", help="one busy-looping process beside the gate")
    args = parser.parse_args()
    gate._quiet_transformers()
    baseline = gate_verdict.read_gate_file(gate_verdict.choose_baseline("tiny", fingerprint()["machine_class"]).path)
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if args.busy else None
    try:
        for condition in args.conditions:
            failures = 0
            for run in range(args.runs):
                current, checks = gate.judge(baseline, workload.tiny_workload(), gate_verdict.TOLERANCES["tiny"],
                                             wrap=WRAPS[condition], log=quiet)
                failed = [c.metric for c in checks if not c.ok]
                failures += bool(failed)
                repeats = len(current["timing_repeats"]["spec_vs_cloud"])
                print(f"{condition} run {run + 1}: {'FAIL ' + ','.join(failed) if failed else 'pass'} "
                      f"({repeats} repeats, load {max(current['load_average_1min']):.1f})", flush=True)
            print(f"== {condition}{' +busy' if busy else ''}: {failures} of {args.runs} runs failed "
                  f"(load now {os.getloadavg()[0]:.1f})", flush=True)
    finally:
        if busy:
            busy.kill()
            busy.wait()


if __name__ == "__main__":
    main()
