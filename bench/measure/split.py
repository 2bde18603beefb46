"""Measurements of the split deployment, from generations (raw) to figures (derived):

- per-call protocol overhead: the edge's wait for a verdict minus the server's queue and compute
  time, on loopback without shaping (what the protocol itself costs);
- measured vs modelled link time: the time a generation really spent in flight through
  `bench.measure.link` against `bench.core.network`'s arithmetic for the same trace and preset;
- split vs in-process throughput, with the server and the edge pinned to their own cores.
"""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import asdict

import torch

from bench.core.network import NetworkProfile, network_cost
from specdec.errors import ConfigError
from specdec.trace import Generation


def call_overheads_s(generations: list[Generation]) -> list[float]:
    """Per verify call: wait - server queue - server compute (seconds)."""
    return [c.wait_s - c.cloud_s - c.server_queue_s for g in generations for c in g.cycles if c.escalated]


def modelled_link_s(generation: Generation, network: NetworkProfile) -> float:
    trace = [asdict(cycle) for cycle in generation.cycles]
    return network_cost(trace, network, generation.features_bytes).latency_s


def pin_threads(cores: list[int]) -> None:
    """Move every thread of this process (OpenMP's pool included) to `cores`, and size torch's
    pool to them: lets one benchmark process alternate between placements."""
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cores)
        except OSError:  # a thread that ended meanwhile
            pass
    torch.set_num_threads(len(cores))


PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """In a child, before exec: the kernel sends SIGTERM when the parent dies, however it dies, so
    a killed sweep or benchmark leaves no server behind."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


class ServerProcess:
    """`specbench serve` as a child process: `with ServerProcess(model, dtype, cores) as url:`."""

    def __init__(self, model: str, dtype: str, cores: str | None = None, *extra: str) -> None:
        self.args = [sys.executable, "-m", "bench.cli", "serve", "--model", model, "--dtype", dtype,
                     *(["--cores", cores] if cores else []), *extra]
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> str:
        self.errors = tempfile.TemporaryFile(mode="w+")  # its last line says why, if it does not start
        self.process = subprocess.Popen(self.args, stdout=subprocess.PIPE, stderr=self.errors, text=True,
                                        preexec_fn=die_with_parent)
        line = self.process.stdout.readline()
        if not line.startswith("listening on "):
            self.process.kill()
            self.process.wait(30)
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
            self.process.wait(30)
        except subprocess.TimeoutExpired:  # stuck (swapping, a forward that will not end): no waiting on it
            self.process.kill()
            self.process.wait(30)
        self.errors.close()
