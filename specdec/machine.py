"""What machine this is, as far as kernels care: the CPU model, its cores, the instruction-set
features that change which kernels a runtime runs (AVX2, AVX-512, VNNI, BF16, FP16, AMX, AVX10), and
a GPU if torch sees one.

Two machines of one *class* run the same kernels: same CPU model string, same kernel features, same
core count and the same GPU. Timings compare only within a class (bench's gate and compare read
`machine_class`); a class is named by a short hash so file names and records can carry it.

Why features and not only the model name: a cloud VM's `/proc/cpuinfo` may name an Intel Xeon as just
"Intel(R) Xeon(R) Processor" whether or not its hypervisor exposes AMX, and llama.cpp and oneDNN pick
different kernels on either (an AMX tile kernel crashed llama.cpp where the same model name without
AMX ran: docs/runtimes.md).
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
from functools import lru_cache
from pathlib import Path

# /proc/cpuinfo flags that select kernels in torch (oneDNN), llama.cpp (ggml) or ONNX/OpenVINO,
# in the order they are reported.
KERNEL_FLAGS = ("avx2", "fma", "f16c", "avx_vnni", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
                "avx512_fp16", "amx_tile", "amx_int8", "amx_bf16", "amx_fp16", "avx10", "asimd", "asimddp", "sve", "i8mm")


@lru_cache(maxsize=1)
def _cpuinfo() -> tuple[str, frozenset[str]]:
    model, flags = platform.processor() or platform.machine(), frozenset[str]()
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:  # not Linux: the model as Python sees it, no flags
        return model, flags
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and model == (platform.processor() or platform.machine()):
            model = value.strip()
        elif key in ("flags", "Features") and not flags:
            flags = frozenset(value.split())
    return model, flags


def cpu_model() -> str:
    return _cpuinfo()[0]


def kernel_features(flags: frozenset[str] | None = None) -> list[str]:
    """The KERNEL_FLAGS this CPU reports (AVX10 also when only a versioned `avx10_*` flag is there)."""
    flags = _cpuinfo()[1] if flags is None else flags
    found = [f for f in KERNEL_FLAGS if f in flags]
    if "avx10" not in found and any(f.startswith("avx10") for f in flags):
        found.append("avx10")
    return found


def gpu() -> str | None:
    """The first CUDA device's name, or None; torch is imported only if it is already loaded or cheap
    to import (it is a dependency of the engine anyway)."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_name(0)


def fingerprint(with_gpu: bool = True) -> dict:
    """The machine's kernel-relevant identity. `machine_class` (a 12-hex hash of the rest) names it in
    records, file names and the gate's baselines."""
    model, _ = _cpuinfo()
    found = {
        "cpu_model": model,
        "arch": platform.machine(),
        "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "kernel_features": kernel_features(),
        "gpu": gpu() if with_gpu else None,
    }
    found["machine_class"] = hashlib.sha256(json.dumps(found, sort_keys=True).encode()).hexdigest()[:12]
    return found


def describe(found: dict) -> str:
    """One line for a report header or an error: 'Intel(R) Xeon(R) Processor, 2 cores, avx512_vnni
    avx512_bf16 amx_tile ... (class 3f2a...)'."""
    features = " ".join(f for f in found.get("kernel_features", []) if f not in ("fma", "f16c", "avx512bw", "avx512vl"))
    gpu_part = f", GPU {found['gpu']}" if found.get("gpu") else ""
    return (f"{found.get('cpu_model', '?')}, {found.get('cores', '?')} cores, {features or 'no vector extensions'}"
            f"{gpu_part} (class {found.get('machine_class', '?')})")
