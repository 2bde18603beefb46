"""Targets for a spawned child that misbehaves: one that dies of a segmentation fault before it sends anything, as
llama.cpp's AMX kernels did, and two that hang, before their entry or after it, as a runtime's native threads can
(tests/test_calibrate.py). Module-level and importing nothing of ours, so the child starts in a moment."""
from __future__ import annotations

import os
import signal
import time


def segfault(*args) -> None:
    signal.signal(signal.SIGSEGV, signal.SIG_DFL)  # a handler (faulthandler's) would catch it
    os.kill(os.getpid(), signal.SIGSEGV)


def hang(*args) -> None:
    """Sends nothing and never ends (a deadlock in a runtime's threads)."""
    while True:
        time.sleep(1)


def hang_after_entry(model, runtime, threads, rounds, read_bytes, queue, parent_pid) -> None:
    """Sends its entry and its last message, then never ends (a native library's teardown that hangs)."""
    queue.put(("entry", {"model": model, "runtime": runtime, "threads": threads, "error": None}))
    queue.put(("exit",))
    while True:
        time.sleep(1)
