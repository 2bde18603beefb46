"""The split deployment's timings, derived from its generations:

- per-call protocol overhead: the edge's wait for a verdict minus the server's queue and compute
  time, on loopback without shaping (what the protocol itself costs);
- modelled link time: `bench.core.network`'s arithmetic for a generation's trace and a preset, to set
  against the time it really spent in flight through `bench.measure.link`.

bench/test_bench_split.py measures them, and split vs in-process throughput with the server and the
edge pinned to their own cores (bench/measure/caps.py's `pin_cores`).
"""
from __future__ import annotations

from dataclasses import asdict

from bench.core.network import NetworkProfile, network_cost
from specdec.core.trace import Generation


def call_overheads_s(generations: list[Generation]) -> list[float]:
    """Per verify call: wait - server queue - server compute (seconds)."""
    return [c.wait_s - c.cloud_s - c.server_queue_s for g in generations for c in g.cycles if c.escalated]


def modelled_link_s(generation: Generation, network: NetworkProfile) -> float:
    trace = [asdict(cycle) for cycle in generation.cycles]
    return network_cost(trace, network, generation.features_bytes).latency_s
