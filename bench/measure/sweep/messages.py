"""What a sweep worker tells the sweep: one frozen dataclass per kind of message, each with the fields it carries.

  message                              sent by                               read by
  Running(key, prompt_id, repeat,      the worker (worker.py), before each   sweep.py: a worker killed in it is
          description)                 warm-up and generation                recorded `crashed` against it
  Tick()                               the worker, once that record is       sweep.py, cluster.py: the progress bar
                                       written
  PointDone(key)                       the worker, a point's items all run   sweep.py: a fresh worker skips the point
  OverCap(key, line)                   the worker's memory watchdog          sweep.py, cluster.py: the point is over
  Failed(line)                         the worker, stopped by an error       sweep.py, cluster.py: raised, one line
  Exit()                               the worker, last                      launch.py's WorkerProcess stops there
  Record(row)                          a cluster's worker, for the driver    cluster.py: the driver writes it
  Started(node, pid)                   a cluster's task (cluster.py), first  cluster.py: where the task runs
  Ended(exitcode)                      a cluster's task, last                cluster.py: how its worker ended

They cross a multiprocessing queue and Ray's object store, so each pickles (module-level classes, plain fields).
A reader dispatches on the class; a message it does not know is `unknown`'s one-line error, never skipped.
"""
from __future__ import annotations

from dataclasses import dataclass

from specdec.errors import SpecdecError


@dataclass(frozen=True)
class Running:
    """A warm-up or generation about to run: said first, so a worker killed in it is recorded against it."""

    key: str  # the point's Point.key()
    prompt_id: str
    repeat: int
    description: str  # worker.describe's line, for the crash's record


@dataclass(frozen=True)
class Tick:
    """One generation's record is written (ok or failed): the last `Running` is over."""


@dataclass(frozen=True)
class PointDone:
    """Every item of the point this worker was given has its record."""

    key: str


@dataclass(frozen=True)
class OverCap:
    """The point's edge went over the memory cap (its record says so); the worker leaves next."""

    key: str
    line: str  # for the user: the point, the prompt, its RSS and the cap


@dataclass(frozen=True)
class Failed:
    """What stopped the worker (or a cluster's task before its worker started), in one line."""

    line: str


@dataclass(frozen=True)
class Exit:
    """A worker's last message: everything it had to say is said."""


@dataclass(frozen=True)
class Record:
    """A record of a worker on a cluster's node, for the sweep's driver to write (worker.StreamedResults)."""

    row: dict


@dataclass(frozen=True)
class Started:
    """A cluster's task has started its worker: on `node` (records.node_info), in process `pid`."""

    node: dict
    pid: int


@dataclass(frozen=True)
class Ended:
    """A cluster's task is over: its worker's exit code (negative: the signal that killed it)."""

    exitcode: int


Message = Running | Tick | PointDone | OverCap | Failed | Exit | Record | Started | Ended


def is_exit(message: object) -> bool:
    """Where WorkerProcess.messages stops reading a sweep worker."""
    return isinstance(message, Exit)


def unknown(message: object) -> SpecdecError:
    """The error for a message its reader does not handle: its type named (a tuple: a worker of an older specbench)."""
    return SpecdecError(f"a sweep worker sent a message of unknown type {type(message).__name__}: the sweep and its "
                        "workers must run the same specbench (on a cluster, every node's install)")
