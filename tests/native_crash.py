"""A target for a spawned child that dies of a segmentation fault before it sends anything, as llama.cpp's
AMX kernels did (tests/test_calibrate.py). Module-level and importing nothing of ours, so the child starts
in a moment."""
from __future__ import annotations

import os
import signal


def segfault(*args) -> None:
    signal.signal(signal.SIGSEGV, signal.SIG_DFL)  # a handler (faulthandler's) would catch it
    os.kill(os.getpid(), signal.SIGSEGV)
