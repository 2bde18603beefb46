"""specbench's own exact CPU kernels: one scalar reference that defines every number (csrc/reference.cpp, the rules
in csrc/kernels.h) and one vector path per instruction-set family that reproduces it bit for bit, laid out as
ggml-cpu lays out its own (a generic part, then csrc/x86/, csrc/arm/):

    path          file             the CPUs that run it
    avx512-vnni   x86/avx512.cpp   AVX-512 F/BW/VL + VNNI: AMD Zen 4 on, Intel Xeon from Cascade Lake on
    avx-vnni      x86/avx2.cpp     AVX2 + 256-bit vpdpbusd: Intel client CPUs since Alder Lake (AVX-VNNI), and
                                   any AVX-512 VNNI CPU (the same instruction, EVEX-encoded)
    avx2          x86/avx2.cpp     AVX2 + FMA + F16C: AMD Zen 2/3, VMs that hide AVX-512, Intel since Haswell
    neon          arm/neon.cpp     AArch64 NEON with dotprod: Apple M-series, Graviton 2 on, Ampere, Snapdragon
    reference     reference.cpp    any CPU (scalar; slow, chosen only when asked for)

The path is chosen here, in one place, from the CPU's features (the first of PREFERENCE it can run);
`SPECBENCH_KERNELS=<path>` forces one, refused in one line where the CPU lacks it. Whatever the path, a model's logits
are the same bits (tests/test_kernels.py compares every path this machine can run with the reference; ARM's under
qemu-user through driver.py).

`kernels()` returns the chosen path's module, compiling it on first use (about a minute on 2 cores) into
`~/.cache/torch_extensions/specbench/<source hash>-<path>-<machine class>/` (build_dir), where every later process
loads it in a second. Building needs a C++ compiler (`$CXX`, else `c++`) and ninja (a dependency of this package),
which torch's extension builder drives; each refusal is one line naming the fix (`KernelError`).

torch's builder guards a folder with a lock *file* (`lock`, torch.utils.file_baton) that only the builder removes: a
build killed mid-way (SIGTERM to a sweep worker or a server whose parent died, SIGKILL, the OOM killer, a session's
end) leaves it, and every later process waits on it forever, silently. Every load takes it too (ninja checks the build
is current), so a process killed while loading leaves it as well. So each build here first takes an flock on the
folder's `build.flock`, which the kernel drops when its holder dies however it dies; whoever holds it is the
only live builder of that folder, and a `lock` file it finds is a dead one's, removed before torch looks.
"""
from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import os
import platform
import shutil
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from specdec.errors import ModelError
from specdec.machine import _cpuinfo, fingerprint
from specdec.runtime_registry import exact_elsewhere

CSRC = Path(__file__).with_name("csrc")
ENV = "SPECBENCH_KERNELS"
NEEDS = "AVX2 (with FMA and F16C), AVX-512 VNNI or ARM NEON with dotprod"
# -ffp-contract=off: no multiply and add fused unless the code asks for an fma (kernels.h's rules round each op alone).
COMMON_FLAGS = ("-O3", "-std=c++17", "-ffp-contract=off")
X86_BASE = ("-mavx2", "-mfma", "-mf16c")
AVX512 = ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx512vnni")
_lock = threading.Lock()


class KernelError(ModelError):
    """The kernels cannot run here: the CPU lacks every vector path, a forced path, or they cannot be built."""


@dataclass(frozen=True)
class Variant:
    """One way to build a path: the /proc/cpuinfo flags it needs and the compiler flags it is built with."""

    needs: tuple[str, ...]
    cflags: tuple[str, ...]


@dataclass(frozen=True)
class KernelPath:
    name: str
    machine: str  # platform.machine() it runs on ("" for any)
    source: str  # relative to csrc/
    variants: tuple[Variant, ...]  # the first whose flags this CPU reports is built
    cpus: str  # which CPUs have it, for messages

    def variant(self, flags: frozenset[str], machine: str) -> Variant | None:
        if self.machine and self.machine != machine:
            return None
        return next((v for v in self.variants if all(f in flags for f in v.needs)), None)


PATHS = {p.name: p for p in (
    KernelPath("avx512-vnni", "x86_64", "x86/avx512.cpp",
               (Variant(("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni"),
                        X86_BASE + AVX512),), "AVX-512 VNNI"),
    KernelPath("avx-vnni", "x86_64", "x86/avx2.cpp",
               (Variant(("avx2", "fma", "f16c", "avx_vnni"), X86_BASE + ("-mavxvnni", "-DSPECBENCH_AVX_VNNI")),
                Variant(("avx2", "fma", "f16c", "avx512vl", "avx512_vnni"),
                        X86_BASE + ("-mavx512vl", "-mavx512vnni", "-DSPECBENCH_AVX_VNNI"))), "AVX-VNNI or AVX-512 VNNI"),
    KernelPath("avx2", "x86_64", "x86/avx2.cpp", (Variant(("avx2", "fma", "f16c"), X86_BASE),), "AVX2, FMA and F16C"),
    KernelPath("neon", "aarch64", "arm/neon.cpp",
               (Variant(("asimd", "asimddp"), ("-march=armv8.2-a+dotprod+fp16",)),), "NEON with dotprod"),
    KernelPath("reference", "", "reference.cpp", (Variant((), ()),), "any CPU"),
)}
PREFERENCE = ("avx512-vnni", "avx-vnni", "avx2", "neon")  # the reference runs only when asked for


def runnable_paths(flags: frozenset[str] | None = None, machine: str | None = None) -> list[str]:
    """Every path this CPU (or `flags` on `machine`) can run, fastest first, the reference last."""
    flags = _cpuinfo()[1] if flags is None else flags
    machine = platform.machine() if machine is None else machine
    return [name for name in (*PREFERENCE, "reference") if PATHS[name].variant(flags, machine)]


def chosen_path(flags: frozenset[str] | None = None, machine: str | None = None) -> str:
    """The path a model runs on here: `SPECBENCH_KERNELS` if set, else the first vector path this CPU has."""
    runnable = runnable_paths(flags, machine)
    forced = os.environ.get(ENV, "").strip()
    if forced:
        if forced not in PATHS:
            raise KernelError(f"unknown {ENV}={forced!r}: use one of {', '.join(PATHS)}, or unset it")
        if forced not in runnable:
            raise KernelError(f"{ENV}={forced} needs {PATHS[forced].cpus}, which this CPU lacks: unset it or use "
                              f"one of {', '.join(runnable)}")
        return forced
    if runnable[0] == "reference":
        raise KernelError(f"the kernels runtimes need {NEEDS}, which this CPU lacks: {fallback()} ({ENV}=reference "
                          "runs them exactly, slowly)")
    return runnable[0]


def fallback() -> str:
    """What to run where the kernels cannot: the exact runtimes that need no kernel path (the registry's)."""
    return exact_elsewhere()


def missing_flags(flags: frozenset[str] | None = None) -> list[str]:
    """Empty where the kernels runtimes run here; else the reason, one item (kept for callers that test truth)."""
    try:
        chosen_path(flags)
    except KernelError as e:
        return [str(e)]
    return []


def check_cpu(flags: frozenset[str] | None = None) -> None:
    chosen_path(flags)


def source_digest(path: str | None = None) -> str:
    """The kernels' version: a hash of every source file and of the path's flags (a calibration entry of another
    version is stale). Without `path`, the chosen one's."""
    name = path or chosen_path()
    variant = PATHS[name].variant(_cpuinfo()[1], platform.machine()) or PATHS[name].variants[0]
    digest = hashlib.sha256()
    for file in sorted(CSRC.rglob("*")):
        if file.suffix in (".h", ".cpp"):
            digest.update(file.relative_to(CSRC).as_posix().encode() + file.read_bytes())
    digest.update(" ".join(COMMON_FLAGS + variant.cflags).encode())
    return digest.hexdigest()[:12]


def build_dir(path: str | None = None) -> Path:
    """Where a path's source, built for this machine class, lives: a build cache beside torch's own extensions
    (`$TORCH_EXTENSIONS_DIR`, default ~/.cache/torch_extensions), not in $SPECBENCH_HOME, so a run or a test with a
    home of its own does not build again."""
    name = path or chosen_path()
    root = Path(os.environ.get("TORCH_EXTENSIONS_DIR") or Path.home() / ".cache" / "torch_extensions").expanduser()
    return root / "specbench" / f"{source_digest(name)}-{name}-{fingerprint(with_gpu=False)['machine_class']}"


def check_toolchain() -> None:
    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        raise KernelError(f"the kernels runtimes build their kernels once with a C++ compiler, and {compiler!r} is not "
                          f"on PATH: install one (apt-get install g++) or set CXX, or {fallback()}")
    if importlib.util.find_spec("ninja") is None:  # torch's extension builder runs its binary
        raise KernelError(f"the kernels runtimes build their kernels with ninja, which is not installed: pip install "
                          f"ninja, or {fallback()}")


def kernels(path: str | None = None):
    """The built module of `path` (default: the chosen one): linear_int8, linear_int4, rms_norm, silu_mul, attention,
    stream_read, and `path`, its name."""
    return _build(path or chosen_path())


@contextmanager
def _build_lock(folder: Path) -> Iterator[None]:
    """This process as the only live builder of `folder`: an flock on `build.flock` in it (as artifact.py's builds
    take one; the layers keep the kernels from importing it), a dead build's baton gone (the module's docstring)."""
    with open(folder / "build.flock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # waits for a live builder; the kernel releases a dead one's when it dies
        (folder / "lock").unlink(missing_ok=True)  # torch's baton: under this flock, only a dead process's
        yield  # closing the file releases the flock


@cache
def _build(name: str):
    if name not in runnable_paths():
        raise KernelError(f"kernel path {name} needs {PATHS[name].cpus}, which this CPU lacks: use one of "
                          f"{', '.join(runnable_paths())}")
    kernel_path = PATHS[name]
    variant = kernel_path.variant(_cpuinfo()[1], platform.machine())
    assert variant is not None  # runnable
    folder = build_dir(name)
    module = f"specbench_kernels_{name.replace('-', '_')}"
    with _lock:
        built = next(iter(sorted(folder.glob(f"{module}*.so"))), None) if folder.is_dir() else None
        if built is None:
            check_toolchain()
        from torch.utils import cpp_extension

        folder.mkdir(parents=True, exist_ok=True)
        impl = "reference" if name == "reference" else "path"
        try:
            with _build_lock(folder):
                return cpp_extension.load(name=module, sources=[str(CSRC / "module.cpp"), str(CSRC / kernel_path.source)],
                                          extra_cflags=[*COMMON_FLAGS, *variant.cflags, f"-DSPECBENCH_IMPL={impl}",
                                                        "-fopenmp"],
                                          extra_ldflags=["-fopenmp"], build_directory=str(folder), verbose=False)
        except (RuntimeError, OSError, ImportError) as e:
            lines = [line for line in str(e).splitlines() if line.strip()] or [type(e).__name__]
            raise KernelError(f"building the {name} kernels in {folder} failed ({lines[-1].strip()[:200]}): delete "
                              f"that folder and retry, or {fallback()}") from e
