"""A kernel path against the reference without torch: build csrc/driver.cpp with a path's compiler and flags, run
it (natively, or under qemu-user for another architecture) and return its verdict. This is how the ARM path is
tested on an x86 machine (Debian's `g++-aarch64-linux-gnu` and `qemu-user`), and how anyone checks a path on their
own CPU in seconds: `python -m specdec.kernels.driver [PATH ...]` (default: every path this machine can run, and
neon where the cross compiler and qemu are installed).
"""
from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from specdec.kernels import COMMON_FLAGS, CSRC, PATHS, KernelError, runnable_paths
from specdec.machine import _cpuinfo


@dataclass(frozen=True)
class Toolchain:
    compiler: str
    runner: tuple[str, ...]  # () natively, else the emulator's command


CROSS = {"aarch64": Toolchain("aarch64-linux-gnu-g++", ("qemu-aarch64",))}
NATIVE = Toolchain(os.environ.get("CXX", "c++"), ())


def toolchain(path: str) -> Toolchain:
    """How to build and run `path` here, or one line naming what to install."""
    machine = PATHS[path].machine
    if not machine or machine == platform.machine():
        return NATIVE
    cross = CROSS.get(machine)
    if cross is None:
        raise KernelError(f"no cross toolchain known for {machine}")
    missing = [tool for tool in (cross.compiler, *cross.runner[:1]) if shutil.which(tool) is None]
    if missing:
        raise KernelError(f"testing the {path} path here needs {' and '.join(missing)}: apt-get install "
                          f"g++-{machine}-linux-gnu qemu-user")
    return cross


def run(path: str, workdir: Path | None = None, timeout_s: float = 600) -> subprocess.CompletedProcess:
    """Build the driver for `path` and run it; the completed process (its stdout ends 'N passed, M failed')."""
    chain = toolchain(path)
    if not chain.runner and path not in runnable_paths():
        raise KernelError(f"kernel path {path} needs {PATHS[path].cpus}, which this CPU lacks")
    kernel_path = PATHS[path]
    variant = kernel_path.variants[0] if chain.runner else kernel_path.variant(*_here())
    assert variant is not None
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(workdir or scratch)
        objects = []
        for source, flags in (("reference.cpp", ()), ("driver.cpp", ()), (kernel_path.source, variant.cflags)):
            obj = out / (source.replace("/", "_") + ".o")
            define = ["-DSPECBENCH_IMPL=reference"] if source == "reference.cpp" else []
            _compile([chain.compiler, *COMMON_FLAGS, *flags, *define, "-c", str(CSRC / source), "-o", str(obj)])
            objects.append(str(obj))
        binary = out / f"driver-{path}"
        _compile([chain.compiler, *objects, *(["-static"] if chain.runner else []), "-o", str(binary)])
        return subprocess.run([*chain.runner, str(binary)], capture_output=True, text=True, timeout=timeout_s)


def _here() -> tuple[frozenset[str], str]:
    return _cpuinfo()[1], platform.machine()


class BuildFailed(KernelError):
    """The driver did not compile: a fault in the sources, not a missing tool (main counts it as a failure)."""


def _compile(command: list[str]) -> None:
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode:
        lines = [line for line in result.stderr.splitlines() if "error" in line] or result.stderr.splitlines()[-1:]
        raise BuildFailed(f"compiling the kernel driver failed ({(lines or ['?'])[0].strip()[:200]}): {' '.join(command)}")


def main(argv: list[str]) -> int:
    paths = argv or [p for p in runnable_paths() if p != "reference"] + ["neon"]
    failed = 0
    for path in paths:
        try:
            result = run(path)
        except BuildFailed as e:
            print(f"{path}: failed: {e}")
            failed += 1
            continue
        except KernelError as e:  # a CPU or a toolchain this machine lacks
            print(f"{path}: skipped: {e}")
            continue
        print(result.stdout.strip().splitlines()[-1] if result.stdout.strip() else f"{path}: no output")
        failed += result.returncode != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
