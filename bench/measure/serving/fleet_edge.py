"""One real edge of `specbench fleet`: a process running the normal edge loop (`Engine` with a
cloud URL) for its prompts, started by bench/measure/serving/fleet.py. It loads its model,
generates once untimed, prints `{"ready": true}`, waits for `go` on stdin, then prints one JSON
record per generation (the usual record plus the fleet's fields) and exits. Logs go to stderr."""
from __future__ import annotations

import json
import sys
import time

from bench.core.point import Point
from bench.core.prompts import load_prompts
from bench.core.records import result_record
from bench.measure.trackers import LatencyTracker, PeakMemoryTracker, tracked
from specdec.core.config import DecodeConfig, DeployConfig, SpecConfig
from specdec.core.verdict import CloudLost
from specdec.engine import Engine
from specdec.errors import InputError
from specdec.settings import Mode


def main(job: dict) -> int:
    engine = Engine(mode=Mode.SPEC, edge=job["edge"], cloud_url=job["url"], dtype=job["dtype"],
                    chat_template=job["chat_template"], constraints=job["constraints"],
                    spec=SpecConfig(**job["spec"]), decode=DecodeConfig(**job["decode"]),
                    deploy=DeployConfig(token_file=job["token_file"], cloud_timeout_s=job["cloud_timeout_s"]),
                    log=lambda message: print(message, file=sys.stderr, flush=True))
    engine.load()
    records = {r.id: r for r in load_prompts(job["prompts"])[: job["limit"]]}
    first = records[job["order"][0]]
    engine.generate(first.prompt, first.system)  # untimed: first forwards run slow, here and on the server
    print(json.dumps({"ready": True}), flush=True)
    if sys.stdin.readline().strip() != "go":
        return 1
    started = time.perf_counter()
    point = {**job["point"], "client": job["client"], "cores_shared": job["cores_shared"]}
    for prompt_id, arrival in zip(job["order"], job["arrivals"]):
        time.sleep(max(started + arrival - time.perf_counter(), 0.0))
        record, begin = records[prompt_id], time.perf_counter()
        try:
            latency, memory = LatencyTracker(), PeakMemoryTracker(reset=False)
            with tracked(memory, latency):
                generation = engine.generate(record.prompt, record.system)
            row = result_record(generation, {**Point.of(engine, job["prompts"]).record(), **point}, prompt_id, latency.elapsed_s,
                                memory.peak_rss_bytes)
            escalated = [c for c in generation.cycles if c.escalated]
            row.update(verifies=len(escalated), positions=sum(len(c.draft_tokens) + 1 for c in escalated),
                       verify_wait_s=[c.wait_s for c in escalated], server_queue_s=[c.server_queue_s for c in escalated],
                       server_compute_s=[c.cloud_s for c in escalated])
        except (InputError, CloudLost) as e:
            row = {"id": prompt_id, **point, "status": "failed", "error": str(e)}
        end = time.perf_counter()
        row.update(arrival_s=arrival, start_s=begin - started, end_s=end - started, response_s=end - started - arrival)
        print(json.dumps(row, ensure_ascii=False), flush=True)
    engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(json.loads(sys.argv[1])))
