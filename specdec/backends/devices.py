"""Where a torch model runs: the device names the engine takes (`cpu`, `cuda`, `cuda:N`), checked in one
place, and what timing on an accelerator needs: a clock read after the device's queued work, and its peak
memory. On a machine without CUDA nothing here initializes it; on the CPU every helper is a no-op.

A CUDA forward returns as soon as its kernels are queued: a clock read right after it times the launch
(tens of microseconds), not the forward. `clock(device)` waits for the queue first.
"""
from __future__ import annotations

import re
import time

import torch

from specdec.errors import ConfigError
from specdec.runtime_registry import declared, runtimes
from specdec.settings import CudaGraphs, KVCache, ServerCache, Steps, choices

DEVICE_NAMES = "cpu, cuda or cuda:N"
_DEVICE = re.compile(r"cpu|cuda(:\d+)?")
CPU = torch.device("cpu")


def on_cpu(device: str) -> bool:
    """Whether a device setting names the CPU (check_device allows `cpu` alone for it, and cuda[:N])."""
    return device == "cpu"


def check_device(name: str, flag: str = "--device") -> str:
    """`name` when torch can run a model there on this machine; else a ConfigError naming `flag` and the fix."""
    if not isinstance(name, str) or not _DEVICE.fullmatch(name):
        raise ConfigError(f"unknown device {name!r} for {flag}: use {DEVICE_NAMES}")
    if on_cpu(name):
        return name
    if not torch.cuda.is_available():
        build = "a CPU-only build" if torch.version.cuda is None else f"CUDA {torch.version.cuda}, but no GPU is visible"
        raise ConfigError(f"{flag} {name}: CUDA is not available here (torch {torch.__version__}, {build}): "
                          f"use {flag} cpu, or run on a machine with a GPU")
    index, count = int(name.partition(":")[2] or 0), torch.cuda.device_count()
    if index >= count:
        raise ConfigError(f"{flag} {name}: this machine has {count} CUDA device{'s' if count != 1 else ''} "
                          f"(cuda:0 to cuda:{count - 1}): pick one of them")
    return name


def check_served_device(device: str, runtime: str, flag: str = "--device") -> str:
    """A server's device: it exists here, and its runtime runs there (llama.cpp and int8: the CPU only)."""
    check_device(device, flag)
    if not on_cpu(device) and not declared(runtime).devices:
        raise ConfigError(f"runtime {runtime} runs on the CPU only: use {flag} cpu, or runtime "
                          f"{', '.join(r.name for r in runtimes() if r.devices)} on {device}")
    return device


def check_served_cache(kv_cache: ServerCache, runtime: str, flag: str = "--kv-cache") -> ServerCache:
    """A server's KV cache: the torch runtime's choice; the other runtimes keep their own (auto: whatever they keep)."""
    if kv_cache not in (ServerCache.AUTO, ServerCache.DYNAMIC) and not declared(runtime).caches:
        raise ConfigError(f"{flag} {kv_cache} is the {', '.join(r.name for r in runtimes() if r.caches)} runtime's; "
                          f"{runtime} keeps its own cache: drop {flag}")
    return kv_cache


def is_cuda(device: torch.device | str | None) -> bool:
    return device is not None and torch.device(device).type == "cuda"


def synchronize(device: torch.device | str | None) -> None:
    """Wait until `device` has run everything queued on it (a no-op on the CPU)."""
    if is_cuda(device):
        torch.cuda.synchronize(device)


def clock(device: torch.device | str | None = None) -> float:
    """time.perf_counter() after `device`'s queued work: the clock to read around a forward on any device
    (device None: after every CUDA device this process has used, if any)."""
    if device is None:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            for index in range(torch.cuda.device_count()):
                torch.cuda.synchronize(index)
    else:
        synchronize(device)
    return time.perf_counter()


def reset_gpu_peaks() -> None:
    """Start the CUDA peak-memory counters anew (nothing when this process has not used CUDA)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for index in range(torch.cuda.device_count()):
            torch.cuda.reset_peak_memory_stats(index)


def gpu_peaks() -> dict[str, int] | None:
    """{"peak_gpu_allocated_bytes", "peak_gpu_reserved_bytes"}: torch.cuda.max_memory_allocated and
    max_memory_reserved summed over this process's devices since the last reset; None where this process
    has put nothing on a GPU (every CPU run, also on a GPU machine whose name the fingerprint read)."""
    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return None
    devices = range(torch.cuda.device_count())
    reserved = sum(torch.cuda.max_memory_reserved(i) for i in devices)
    if not reserved:
        return None
    return {"peak_gpu_allocated_bytes": sum(torch.cuda.max_memory_allocated(i) for i in devices),
            "peak_gpu_reserved_bytes": reserved}


# How a torch model keeps its KV cache and runs its forwards (EngineConfig.kv_cache, cuda_graphs; the backends:
# hf_causal.py for dynamic, static_cache.py for the rest, cuda_graphs.py for captured steps).
KV_CACHES = choices(KVCache)
CUDA_GRAPHS = choices(CudaGraphs)
# A server's: its sessions interleave (static_slots.py holds them all). auto: static on CUDA (its forwards replay as
# captured graphs: 3.1-6.6x the dynamic cache's cloud-only serving on an H200, docs/gpu.md), dynamic on the CPU.
SERVER_CACHES = choices(ServerCache)
STEPS = choices(Steps)  # what kv_cache x cuda_graphs x device resolve to


def steps_of(kv_cache: KVCache, device: str, cuda_graphs: CudaGraphs = CudaGraphs.ON, static_capable: bool = True) -> Steps:
    """What runs a model's forwards: `dynamic` (transformers' DynamicCache, eager), `static` (a preallocated
    cache, eager), `compiled` (the static cache's forward under torch.compile) or `graphs` (the static cache's
    1-token and k+1-token forwards replayed as CUDA graphs). auto: graphs on CUDA (dynamic with cuda_graphs
    off, or for a model the static cache does not run: `static_capable` false), dynamic on the CPU."""
    graphs = is_cuda(device) and cuda_graphs == CudaGraphs.ON
    if kv_cache == KVCache.AUTO:
        return Steps.GRAPHS if graphs and static_capable else Steps.DYNAMIC
    if kv_cache == KVCache.STATIC and graphs:
        return Steps.GRAPHS
    return Steps(kv_cache)
