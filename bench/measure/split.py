"""Measurements of the split deployment, from generations (raw) to figures (derived):

- per-call protocol overhead: the edge's wait for a verdict minus the server's queue and compute
  time, on loopback without shaping (what the protocol itself costs);
- measured vs modelled link time: the time a generation really spent in flight through
  `bench.measure.link` against `bench.core.network`'s arithmetic for the same trace and preset;
- split vs in-process throughput, with the server and the edge pinned to their own cores.

The server itself is started as every child is, by bench/measure/launch.py.
"""
from __future__ import annotations

import os
from dataclasses import asdict

import torch

from bench.core.network import NetworkProfile, network_cost
from specdec.core.trace import Generation


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
