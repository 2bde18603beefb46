"""specbench's own CPU kernels (vnni.cpp), built once per machine with the C++ compiler torch uses.

`kernels()` returns the built module, compiling it on first use (about a minute on 2 cores) into
`~/.cache/torch_extensions/specbench/<source hash>-<machine class>/` (build_dir), where every later process loads it
in a second.
What it needs, each refused in one line naming the fix (`KernelError`):

- a CPU with AVX-512 (F, BW, VL) and AVX-512 VNNI, and F16C: the int8 dot products run on `vpdpbusd`
  (an AMD Zen 4 or newer, an Intel Xeon from Cascade Lake on). A CPU without them runs another runtime;
- a C++ compiler (`$CXX`, else `c++`) and ninja (a dependency of this package), which torch's extension
  builder drives. A machine without a compiler builds the module on one that has one of the same class and
  copies that folder here, or runs another runtime (onnx-int4, llamacpp).

The kernels are exact by construction, not by tolerance: vnni.cpp's header says why.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import threading
from functools import lru_cache
from pathlib import Path

from specdec.errors import ModelError
from specdec.machine import _cpuinfo, fingerprint

SOURCE = Path(__file__).with_name("vnni.cpp")
NEEDED_FLAGS = ("avx512f", "avx512bw", "avx512vl", "avx512_vnni", "f16c")
# -ffp-contract=off: the scalar rotary code computes v*cos - u*sin as torch does (two roundings), not as an FMA.
CFLAGS = ("-O3", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx512vnni", "-mf16c", "-mfma",
          "-ffp-contract=off", "-fopenmp")
FALLBACK = "use runtime onnx-int4 or llamacpp"
_lock = threading.Lock()


class KernelError(ModelError):
    """The kernels cannot run here: the CPU lacks an instruction set, or they cannot be built."""


def missing_flags(flags: frozenset[str] | None = None) -> list[str]:
    """The instruction sets vnni.cpp needs that this CPU (or `flags`) does not report."""
    flags = _cpuinfo()[1] if flags is None else flags
    return [flag for flag in NEEDED_FLAGS if flag not in flags]


def check_cpu(flags: frozenset[str] | None = None) -> None:
    if missing := missing_flags(flags):
        raise KernelError(f"the vnni runtimes need {' '.join(missing)}, which this CPU lacks: {FALLBACK}")


def source_digest() -> str:
    """The kernels' version: a hash of their source and flags (a calibration entry of another one is stale)."""
    return hashlib.sha256(SOURCE.read_bytes() + " ".join(CFLAGS).encode()).hexdigest()[:12]


def build_dir() -> Path:
    """Where this source, built for this machine class, lives: a build cache beside torch's own extensions
    (`$TORCH_EXTENSIONS_DIR`, default ~/.cache/torch_extensions), not in $SPECBENCH_HOME, so a run or a test with a
    home of its own does not build again."""
    root = Path(os.environ.get("TORCH_EXTENSIONS_DIR") or Path.home() / ".cache" / "torch_extensions").expanduser()
    return root / "specbench" / f"{source_digest()}-{fingerprint(with_gpu=False)['machine_class']}"


def check_toolchain() -> None:
    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        raise KernelError(f"the vnni runtimes build their kernels once with a C++ compiler, and {compiler!r} is not "
                          f"on PATH: install one (apt-get install g++) or set CXX, or {FALLBACK}")
    if importlib.util.find_spec("ninja") is None:  # torch's extension builder runs its binary
        raise KernelError(f"the vnni runtimes build their kernels with ninja, which is not installed: pip install "
                          f"ninja, or {FALLBACK}")


@lru_cache(maxsize=1)
def kernels():
    """The built module (linear_int8, linear_int4, rms_norm, silu_mul, attention), built on first use."""
    check_cpu()
    folder = build_dir()
    with _lock:
        built = next(iter(sorted(folder.glob("specbench_vnni*.so"))), None) if folder.is_dir() else None
        if built is None:
            check_toolchain()
        from torch.utils import cpp_extension

        folder.mkdir(parents=True, exist_ok=True)
        try:
            return cpp_extension.load(name="specbench_vnni", sources=[str(SOURCE)], extra_cflags=list(CFLAGS),
                                      extra_ldflags=["-fopenmp"], build_directory=str(folder), verbose=False)
        except (RuntimeError, OSError, ImportError) as e:
            lines = [line for line in str(e).splitlines() if line.strip()] or [type(e).__name__]
            raise KernelError(f"building the vnni kernels in {folder} failed ({lines[-1].strip()[:200]}): delete that "
                              f"folder and retry, or {FALLBACK}") from e
