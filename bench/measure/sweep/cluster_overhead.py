"""Scheduling overhead of `--executor ray` per point against `--executor local`: the same tiny-pair
sweep (bench/measure/tinypair.py, fp32, 4 points x 4 prompts x 8 tokens) run both ways, alternating which
goes first, on one Ray instance started once (as a running cluster would be).

    python -m bench.measure.sweep.cluster_overhead [REPEATS]
"""
from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.measure.sweep.cluster import import_ray
from bench.measure.sweep.sweep import run_sweep
from bench.measure.sweep.sweep_config import SweepConfig
from bench.measure.tinypair import PROMPTS, save_pair

POINTS = 4  # cloud, edge, spec k=1, spec k=3


def main(repeats: int = 5) -> None:
    ray = import_ray()
    root = Path(tempfile.mkdtemp(prefix="cluster-overhead-"))
    models = save_pair(root / "models")
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "prompt": p}) + "\n" for i, p in enumerate(PROMPTS)))
    settings = dict(edge=models["edge"], cloud=models["cloud"], prompts=[str(prompts)], mode=["cloud", "edge", "spec"],
                    k=[1, 3], policy=["greedy"], dtype=["float32"], max_new_tokens=8)
    start = time.perf_counter()
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=100 << 20, log_to_driver=False,
             logging_level="ERROR")
    print(f"ray.init, a local instance (paid once per sweep where no cluster runs): {time.perf_counter() - start:.2f} s")
    seconds: dict[str, list[float]] = {"local": [], "ray": []}
    for repeat in range(repeats):
        for executor in ("local", "ray") if repeat % 2 == 0 else ("ray", "local"):
            config = SweepConfig.from_mapping({**settings, "executor": executor})
            start = time.perf_counter()
            run_sweep(config, root / f"{executor}{repeat}", progress=False)
            seconds[executor].append(time.perf_counter() - start)
    ray.shutdown()
    for executor, values in seconds.items():
        print(f"{executor}: sweep wall s {' '.join(f'{s:.2f}' for s in values)}; median {statistics.median(values):.2f}")
    per_point = [(ray_s - local_s) / POINTS for ray_s, local_s in zip(seconds["ray"], seconds["local"])]
    print(f"ray - local per point, paired per repeat (s): {' '.join(f'{d:+.3f}' for d in per_point)}; "
          f"median {statistics.median(per_point):+.3f}, range {min(per_point):+.3f} to {max(per_point):+.3f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5)
