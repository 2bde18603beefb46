"""Trackers: context managers that measure one thing each, stacked with ExitStack
(optimum-benchmark style). They keep raw values; statistics are derived later (bench/derive/summary.py)."""
from __future__ import annotations

import resource
import time
from contextlib import ExitStack


class LatencyTracker:
    """Wall-clock seconds of the block (time.perf_counter)."""

    elapsed_s: float = 0.0

    def __enter__(self) -> LatencyTracker:
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        self.elapsed_s = time.perf_counter() - self._start


class PeakMemoryTracker:
    """Peak RSS (VmHWM) of this process during the block. Linux lets the high-water mark be reset
    (proc(5), /proc/self/clear_refs "5"), so the peak is the block's own, not the process's."""

    peak_rss_bytes: int = 0

    def __init__(self, reset: bool = True) -> None:
        self.reset = reset

    def __enter__(self) -> PeakMemoryTracker:
        if self.reset:
            reset_peak_rss()
        return self

    def __exit__(self, *exc) -> None:
        self.peak_rss_bytes = peak_rss_bytes()


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
