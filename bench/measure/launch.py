"""How bench starts a child process and gets rid of it: one contract for the four kinds of child.

  child                          started as                         placement (caps, cores)         ready when
  a local sweep worker           WorkerProcess (sweep.py)           its EdgeCaps, applied first     its queue's messages
  a Ray task's sweep worker      WorkerProcess (cluster.py)         cores claimed by the task, then  (the same)
                                                                    the worker's EdgeCaps
  the verifier server            ServerProcess (sweep.py, fleet.py) `--cores`: it pins itself       it prints `listening on URL`
  a fleet's edge process         start_edge, edge_ready (fleet.py)  shares the fleet's cores        it prints `{"ready": true}`

Every child dies with its parent, however the parent dies (SIGKILL included): PR_SET_PDEATHSIG,
set before exec for a command (`die_with_parent` as preexec_fn) or first thing in a multiprocessing
child (`bind_to_parent`). Every child is stopped by its parent on the way out: a worker and the
server are terminated (the server killed after STOP_GRACE_S), an edge is killed (its results are
already on its stdout).
"""
from __future__ import annotations

import asyncio
import ctypes
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any, TypeVar

from specdec.errors import NATIVE_CRASH_SIGNALS, ConfigError, signal_name

PR_SET_PDEATHSIG = 1
STOP_GRACE_S = 30  # a stopped server has this long to leave before it is killed


def die_with_parent() -> None:
    """In a child, before exec: the kernel sends SIGTERM when the parent dies, however it dies, so
    a killed sweep or benchmark leaves no server behind."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def bind_to_parent(parent: int) -> None:
    """First thing in a multiprocessing child (which has no preexec hook): die with `parent`, and
    leave at once if it died before prctl took effect (the child was re-parented already)."""
    die_with_parent()
    if os.getppid() != parent:
        os._exit(1)


@contextmanager
def sigint_ignored():
    """Start a worker with SIGINT ignored, which it keeps across exec (and Python then installs no
    KeyboardInterrupt handler): Ctrl-C reaches the whole process group, and it is this process
    that stops the worker, so the worker prints no traceback of its own."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


class WorkerProcess:
    """`target(*args, queue, parent_pid)` in a fresh interpreter (spawn: its caps and its RSS are its
    own). The target calls `bind_to_parent(parent_pid)` first and applies its caps; it speaks
    through `queue` and ends with its last message (a sweep worker's `Exit`, calibrate's `("exit",)`).
    The queue is a SimpleQueue: `put` returns once the message is in the pipe (no feeder thread), so a
    worker that crashes right after saying what it runs has said it."""

    def __init__(self, target: Callable, *args, ignore_sigint: bool = False) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.queue = ctx.SimpleQueue()
        self.process = ctx.Process(target=target, args=(*args, self.queue, os.getpid()), daemon=True)
        self.ignore_sigint = ignore_sigint

    def start(self) -> WorkerProcess:
        with sigint_ignored() if self.ignore_sigint else nullcontext():
            self.process.start()
        return self

    def messages(self, poll_s: float = 0.05,
                 last: Callable[[Any], bool] = lambda message: message == ("exit",),
                 deadline: float | None = None) -> Iterator[Any]:
        """Its messages as they come, through the one `last` recognises, or until it has ended without
        one (killed, crashed, or out of memory) and every message it sent is read, or until `deadline`
        (time.monotonic()) passes with it still running and silent (the caller stops it)."""
        while True:
            if self.queue.empty():
                if self.process.is_alive():
                    if deadline is not None and time.monotonic() > deadline:
                        return
                    time.sleep(poll_s)
                    continue
                if self.queue.empty():  # (it may have sent its last ones while we looked)
                    return
            message = self.queue.get()
            yield message
            if last(message):
                return

    def wait(self, grace_s: float | None = None) -> int:
        """Its exit code: negative, the signal that killed it (`death_line` says it in words). With `grace_s`, a
        process still running that long after it was asked is stopped (one that hangs on its way out, in a native
        library's teardown, would otherwise hold its parent for ever) and the code is the stop's."""
        self.process.join(grace_s)
        if self.process.exitcode is None:
            self.stop()
        assert self.process.exitcode is not None  # join returns once it has ended
        return self.process.exitcode

    def stop(self) -> None:
        """Ctrl-C, SIGTERM or an error in the parent: the worker goes too (killed if SIGTERM has not ended it
        within STOP_GRACE_S)."""
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(STOP_GRACE_S)
            if self.process.is_alive():
                self.process.kill()
        self.process.join()


def native_crash(exitcode: int) -> bool:
    """Whether a child died of its own native code (exit code -N: killed by signal N)."""
    return exitcode < 0 and signal_name(-exitcode) in NATIVE_CRASH_SIGNALS


def death_line(exitcode: int) -> str:
    """How a child ended, for a message: `a native crash (SIGSEGV)`, `killed (SIGKILL: out of memory, or
    another process)`, `killed by SIGTERM`, `exit code 1`. (multiprocessing's exit code for a death by
    signal N is -N.)"""
    if exitcode >= 0:
        return f"exit code {exitcode}"
    name = signal_name(-exitcode)
    if native_crash(exitcode):
        return f"a native crash ({name})"
    if name == "SIGKILL":  # the kernel's OOM killer sends it, as does `kill -9`
        return "killed (SIGKILL: out of memory, or another process)"
    return f"killed by {name}"


Stream = TypeVar("Stream")


def piped(stream: Stream | None) -> Stream:
    """A child's stdin or stdout that was opened as a pipe (typed Optional: None where it was not)."""
    if stream is None:
        raise ValueError("the child's stream was not opened as a pipe")
    return stream


class ServerProcess:
    """`specbench serve` as a child process: `with ServerProcess(model, dtype, cores) as url:`."""

    def __init__(self, model: str, dtype: str, cores: str | None = None, *extra: str) -> None:
        self.args = [sys.executable, "-m", "bench.cli", "serve", "--model", model, "--dtype", dtype,
                     *(["--cores", cores] if cores else []), *extra]
        self.process: subprocess.Popen[str]  # started by __enter__

    def __enter__(self) -> str:
        self.errors = tempfile.TemporaryFile(mode="w+")  # its last line says why, if it does not start
        self.process = subprocess.Popen(self.args, stdout=subprocess.PIPE, stderr=self.errors, text=True,
                                        preexec_fn=die_with_parent)
        line = piped(self.process.stdout).readline()
        if not line.startswith("listening on "):
            self.process.kill()
            self.process.wait(STOP_GRACE_S)
            self.errors.seek(0)
            lines = [text.strip() for text in self.errors.read().splitlines() if text.strip()]
            self.errors.close()
            why = lines[-1].removeprefix("error: ") if lines else f"exit code {self.process.returncode}"
            raise ConfigError(f"the verifier server did not start ({why}): "
                              f"`specbench {' '.join(self.args[3:])}` shows it on its own")
        return line.split()[-1]

    def __exit__(self, *exc) -> None:
        self.process.terminate()
        try:
            self.process.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:  # stuck (swapping, a forward that will not end): no waiting on it
            self.process.kill()
            self.process.wait(STOP_GRACE_S)
        self.errors.close()


async def start_edge(module: str, *argv: str) -> asyncio.subprocess.Process:
    """`python -m module argv...` with pipes on stdin (its `go`) and stdout (its records, one JSON
    line each, however long)."""
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", module, *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        preexec_fn=die_with_parent, limit=1 << 26)


async def edge_ready(process: asyncio.subprocess.Process) -> bool:
    """Its first line, `{"ready": true}` once its model is loaded and warm; False if it said
    anything else or ended."""
    line = await piped(process.stdout).readline()
    return json.loads(line or b"{}").get("ready") is True


async def stop_edges(processes: list) -> None:
    for process in processes:
        if process.returncode is None:
            process.kill()
            await process.wait()
