"""Trackers: context managers that measure one thing each, stacked with ExitStack
(optimum-benchmark style). They keep raw values; statistics are derived later (bench/derive/summary.py)."""
from __future__ import annotations

import resource
from contextlib import ExitStack

from specdec.backends.devices import clock, gpu_peaks, reset_gpu_peaks


class LatencyTracker:
    """Wall-clock seconds of the block (time.perf_counter, read after any CUDA work queued has run)."""

    elapsed_s: float = 0.0

    def __enter__(self) -> LatencyTracker:
        self._start = clock()
        return self

    def __exit__(self, *exc) -> None:
        self.elapsed_s = clock() - self._start


class PeakMemoryTracker:
    """Peak RSS (VmHWM) of this process during the block. Linux lets the high-water mark be reset
    (proc(5), /proc/self/clear_refs "5"), so the peak is the block's own, not the process's. Beside it,
    where this process used CUDA, the GPU's peak allocated and reserved bytes (`gpu`, else None)."""

    peak_rss_bytes: int = 0
    gpu: dict[str, int] | None = None  # specdec/backends/devices.py's gpu_peaks

    def __init__(self, reset: bool = True) -> None:
        self.reset = reset

    def __enter__(self) -> PeakMemoryTracker:
        if self.reset:
            reset_peak_rss()
            reset_gpu_peaks()
        return self

    def __exit__(self, *exc) -> None:
        self.peak_rss_bytes = peak_rss_bytes()
        self.gpu = gpu_peaks()


def reset_peak_rss() -> None:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass  # not Linux, or not permitted: the peak is then the process's so far


def peak_rss_bytes() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def tracked(*trackers):
    """`with tracked(a, b) as stack:` enters the trackers in order and exits them in reverse."""
    stack = ExitStack()
    for tracker in trackers:
        stack.enter_context(tracker)
    return stack
