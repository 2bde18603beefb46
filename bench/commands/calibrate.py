"""`specbench calibrate`: the command line of bench/measure/calibrate.py (docs/machines.md).

    specbench calibrate [--models A,B] [--runtimes A,B] [--threads N] [--rounds R] [--force]
        measures what this machine's file ($SPECBENCH_HOME/calibration/<machine_class>.json) lacks or holds
        stale, then prints the table: per runtime and model the step [p10-p90], the floor the weights'
        bytes set at the measured bandwidth, their ratio, and blocks of k+1 = 2, 5, 9 tokens in steps
    specbench calibrate --file PATH [--any-machine]
        prints a calibration file's table, measuring nothing (another machine's only with --any-machine)
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench.derive.calibration import read_calibration, table
from bench.measure.calibrate import ROUNDS, calibration, calibration_path, default_models, default_runtimes
from specdec.backends.devices import check_device, on_cpu
from specdec.errors import ConfigError
from specdec.kernels import KernelError
from specdec.machine import fingerprint
from specdec.runtime_registry import canonical_runtime, check_runtime


def _count(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, got {text!r}")
    return int(text)


def add_calibrate_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("calibrate", help="measure this machine once: memory bandwidth, each runtime's step "
                                                "and block costs per model, kept per machine class")
    p.add_argument("--models", help="comma-separated models (default: the default config's edge and cloud)")
    p.add_argument("--runtimes", default=",".join(default_runtimes()), help="comma-separated runtimes")
    p.add_argument("--threads", type=_count, help="threads per forward (default: this machine's cores)")
    p.add_argument("--rounds", type=_count, default=ROUNDS, help="timed rounds per model and runtime")
    p.add_argument("--force", action="store_true", help="measure every entry again, the bandwidth too")
    p.add_argument("--device", "--cloud-device", default="cpu",
                   help="where the runtimes are measured: cpu (a GPU's step and block costs, eager and graph-captured, "
                        "are bench/gpu/check.sh's cost curve: docs/gpu.md)")
    p.add_argument("--file", type=Path, help="print this calibration file's table and measure nothing")
    p.add_argument("--any-machine", action="store_true", help="with --file: accept another machine's file")
    p.set_defaults(func=cmd_calibrate)
    return p


def cmd_calibrate(args: argparse.Namespace) -> int:
    if args.file is not None:
        data = read_calibration(args.file, any_machine=args.any_machine)
    else:
        if args.any_machine:
            raise ConfigError("--any-machine reads another machine's file: give it with --file PATH")
        if not on_cpu(check_device(args.device)):  # a missing device is named first, in one line
            raise ConfigError(f"calibrate measures the CPU's runtimes against its memory bandwidth; {args.device}'s "
                              "cost curve is measured by bench/gpu/check.sh (docs/gpu.md): drop --device")
        models = [m.strip() for m in args.models.split(",") if m.strip()] if args.models else default_models()
        runtimes = [r.strip() for r in args.runtimes.split(",") if r.strip()]
        if not models or not runtimes:
            raise ConfigError("--models and --runtimes need at least one name each")
        for runtime in runtimes:  # a runtime this machine cannot run is named with its reason, before anything runs
            try:
                check_runtime(canonical_runtime(runtime), "--runtimes")
            except KernelError as e:  # a package's refusal names the flag already
                raise ConfigError(f"--runtimes {runtime}: {e}") from e
        here = fingerprint()
        data = calibration(models, runtimes, args.threads or here["cores"], force=args.force, rounds=args.rounds)
        print(f"calibration: {calibration_path(here['machine_class'])}", file=sys.stderr)
    print(table(data))
    return 0
