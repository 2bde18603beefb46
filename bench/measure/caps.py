"""Edge caps: CPU (affinity + torch threads, applied before torch is imported) and memory (an RSS
watchdog, optionally RLIMIT_AS with headroom). Used inside sweep worker processes."""
from __future__ import annotations

import os
import resource
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import psutil

from specdec.errors import ConfigError

# `import torch` alone maps ~625 MiB of address space and OpenMP thread stacks need more: without
# headroom the process is killed at thread creation rather than failing cleanly.
ADDRESS_SPACE_HEADROOM_BYTES = 4 << 30
OVER_MEMORY_EXIT = 3  # a worker's exit code after it recorded `over_memory_cap`


@dataclass(frozen=True)
class EdgeCaps:
    cores: int | None = field(default=None, metadata={"help": "CPU cores for the edge worker"})
    memory_gb: float | None = field(default=None, metadata={"help": "edge RSS cap in GiB"})
    rlimit_as: bool = field(default=False, metadata={"help": "also cap address space (RLIMIT_AS) with headroom"})

    def __post_init__(self) -> None:
        available = len(os.sched_getaffinity(0))
        if self.cores is not None and not 1 <= self.cores <= available:
            raise ConfigError(f"--edge-cores must be between 1 and {available} (this machine's cores), got {self.cores}")
        if self.memory_gb is not None and not self.memory_gb > 0:
            raise ConfigError(f"--edge-memory-gb must be > 0, got {self.memory_gb}")

    @property
    def memory_bytes(self) -> int | None:
        return int(self.memory_gb * (1 << 30)) if self.memory_gb else None

    def apply_cpu(self) -> None:
        """Call before importing torch: OpenMP reads OMP_NUM_THREADS once, at load."""
        if self.cores is not None:
            pin_cores(sorted(os.sched_getaffinity(0))[: self.cores])

    def apply_address_limit(self) -> None:
        if self.rlimit_as and self.memory_bytes:
            limit = self.memory_bytes + ADDRESS_SPACE_HEADROOM_BYTES
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    def check_reachable(self, model_bytes: int, what: str) -> None:
        if self.memory_bytes is not None and model_bytes >= self.memory_bytes:
            raise ConfigError(
                f"--edge-memory-gb {self.memory_gb:g} is below the {what} itself "
                f"({model_bytes / (1 << 30):.2f} GiB): raise the cap or use a smaller edge model"
            )


class MemoryWatchdog:
    """Polls RSS; past `limit_bytes` (+ `exempt_bytes`, memory that is not the edge's, e.g. the
    in-process cloud model) it calls `on_exceeded(rss)` once, from its thread."""

    def __init__(self, limit_bytes: int, on_exceeded: Callable[[int], None], exempt_bytes: int = 0, period_s: float = 0.05):
        self.limit_bytes, self.exempt_bytes = limit_bytes, exempt_bytes
        self.on_exceeded, self.period_s = on_exceeded, period_s
        self._stop = threading.Event()
        self._fired = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> MemoryWatchdog:
        self.check()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.check()  # work shorter than one period is still judged

    def check(self) -> bool:
        """Call `on_exceeded` (once) if over the cap; True if it was."""
        edge_rss = psutil.Process().memory_info().rss - self.exempt_bytes
        if edge_rss > self.limit_bytes and not self._fired.is_set():
            self._fired.set()
            self.on_exceeded(edge_rss)
        return self._fired.is_set()

    def _watch(self) -> None:
        while not self._stop.wait(self.period_s):
            if self.check():
                return


def parse_cores(text: str, flag: str = "--cores") -> list[int]:
    """'0', '0,1' or '0-3' -> sorted core ids, each one this process may run on."""
    cores: set[int] = set()
    try:
        for part in text.split(","):
            low, _, high = part.strip().partition("-")
            cores.update(range(int(low), int(high or low) + 1))
    except ValueError:
        raise ConfigError(f"{flag} {text!r} is not a core list: write e.g. 0 or 0,1 or 0-3") from None
    available = os.sched_getaffinity(0)
    if not cores or not cores <= available:
        raise ConfigError(f"{flag} {text!r}: this process may use cores {sorted(available)} only")
    return sorted(cores)


def pin_besides(taken: str, flag: str) -> list[int]:
    """Pin this process, and the processes it starts (they inherit the affinity and the thread counts), to the
    cores of its affinity other than `taken` (a server's --cloud-cores); -> those cores ([]: none left, not pinned)."""
    others = sorted(os.sched_getaffinity(0) - set(parse_cores(taken, flag)))
    if others:
        pin_cores(others)
    return others


def pin_cores(cores: list[int]) -> None:
    """Pin every thread of this process (OpenMP's pool included) to `cores` and size the thread pools to
    them: OMP_NUM_THREADS, which OpenMP reads once, at load (so call before importing torch where possible),
    and torch's own pool if torch is loaded. One process may call it again to move between placements."""
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cores)
        except OSError:  # a thread that ended meanwhile
            pass
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(len(cores))
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(len(cores))
