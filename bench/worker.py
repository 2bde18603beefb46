"""Inside a sweep worker (a fresh process, CPU caps already applied): load models once, run the
group's points, append every record, police the memory cap."""
from __future__ import annotations

import json
import os
from contextlib import nullcontext
from dataclasses import asdict
from pathlib import Path

from bench.caps import OVER_MEMORY_EXIT, EdgeCaps, MemoryWatchdog
from bench.trackers import reset_peak_rss
from bench.network import network_cost, profile
from bench.prompts import load_prompts
from bench.records import ResultsFile
from bench.run import generate_one, point_of, prepare
from specdec.cloud import CloudLost
from specdec.engine import Engine
from specdec.errors import InputError
from specdec.models.loading import LoadedModel, load_model


def weight_bytes(model: LoadedModel) -> int:
    return sum(p.numel() * p.element_size() for p in model.backend.model.parameters())


def run_group(config, caps: EdgeCaps, group: list, out: Path, queue, urls: dict[str, str]) -> None:
    import torch

    if caps.cores:
        torch.set_num_threads(caps.cores)
    caps.apply_address_limit()
    loaded: dict[tuple[str, str], LoadedModel] = {}

    def loader(name: str, dtype: str, log=print) -> LoadedModel:  # one load per worker and model
        if (name, dtype) not in loaded:
            loaded[(name, dtype)] = load_model(name, dtype, log=log)
        return loaded[(name, dtype)]

    results = ResultsFile(out / "results.jsonl")
    engines: list[Engine] = []
    prompts = {name: {r.id: r for r in load_prompts(name)} for name in config.prompts}
    for point, ids in group:
        key = json.dumps(point, sort_keys=True)
        url = urls.get(f"{point['dtype']}|{point['link']}")
        engine = Engine(**asdict(config.engine_config(point, url)), spec=config.spec_config(point),
                        decode=config.decode_config(), deploy=config.deploy_config(point), loader=loader,
                        log=lambda m: None)
        engines.append(engine)
        records = [prompts[point["prompts"]][i] for i in ids]
        prepare(engine, records)
        network = profile(config.network_of(point))
        row_point = {**point_of(engine, point["prompts"]), "link": point["link"], "network": network.name,
                     "edge_cores": caps.cores, "edge_memory_gb": caps.memory_gb}
        edge = loaded.get((config.edge, point["dtype"])) if point["mode"] != "cloud" else None
        if caps.memory_bytes and edge is not None:
            caps.check_reachable(weight_bytes(edge), f"edge model {config.edge!r} in {point['dtype']}")
        # Memory that is not the edge's (a cloud model sharing this process) does not count.
        exempt = sum(weight_bytes(m) for m in loaded.values() if m is not edge)
        reset_peak_rss()
        for record in records:
            current = {"id": record.id}

            def over_cap(rss: int, record_id=record.id) -> None:
                message = (f"point {point['mode']} k={point['k']} thr={point['entropy_threshold']} prompt {record_id}: "
                           f"edge RSS {rss / (1 << 30):.2f} GiB over the {caps.memory_gb:g} GiB cap")
                results.append({"id": record_id, **row_point, "status": "over_memory_cap", "error": message})
                queue.put(("over_cap", key, message))
                exit_worker(queue, OVER_MEMORY_EXIT)

            watchdog = MemoryWatchdog(caps.memory_bytes, over_cap, exempt) if caps.memory_bytes and edge else nullcontext()
            with watchdog:
                try:
                    generate_one(engine, record, row_point, results, after=lambda: queue.put(("tick",)),
                                 decorate=lambda row, g: row.update(network_fields(row, g, network)),
                                 max_audio_s=config.max_audio_s)
                except (InputError, CloudLost) as e:  # a bad sample or a lost cloud fails alone; the sweep goes on
                    results.append({**current, **row_point, "status": "failed", "error": str(e)})
                    queue.put(("tick",))
        queue.put(("point_done", key))
    for engine in engines:
        engine.close()


def network_fields(row: dict, generation, network) -> dict:
    cost = network_cost(row["trace"], network, generation.features_bytes)
    return {
        "network_s": cost.latency_s, "uplink_bytes": cost.uplink_bytes, "downlink_bytes": cost.downlink_bytes,
        "latency_with_network_s": row["latency_s"] + cost.latency_s,
    }


def exit_worker(queue, code: int) -> None:
    """Say goodbye and leave at once. The queue's feeder thread must flush before os._exit."""
    queue.put(("exit",))
    queue.close()
    queue.join_thread()
    os._exit(code)
