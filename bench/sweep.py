"""`specbench sweep`: the grid (bench/sweep_config.py) run in capped worker processes
(bench/worker.py).

Every (point, prompt) record is appended to DIR/results.jsonl as soon as it exists; a rerun of the
same sweep skips what is done. One worker per (dtype) group loads the models once and reuses them
across that group's points, timing them interleaved per prompt (bench/worker.py); CPU caps are
applied first thing in the worker.
"""
from __future__ import annotations

import json
import multiprocessing
from dataclasses import asdict
from pathlib import Path
from queue import Empty

from tqdm import tqdm

from bench.caps import OVER_MEMORY_EXIT
from bench.prompts import load_prompts
from bench.records import ResultsFile, environment
from bench.sweep_config import SweepConfig, result_key
from bench.worker import exit_worker, run_group
from specdec.errors import ConfigError, SpecdecError


def run_sweep(config: SweepConfig, out: Path, progress: bool = True) -> dict:
    """Run what is not done yet; returns counts by status."""
    out.mkdir(parents=True, exist_ok=True)
    sweep_file = out / "sweep.json"
    settings = json.loads(json.dumps(asdict(config)))  # tuples -> lists, as stored
    if sweep_file.exists():
        previous = json.loads(sweep_file.read_text()).get("config", {})
        if previous != settings:
            changed = sorted(k for k in settings if previous.get(k) != settings[k])
            raise ConfigError(
                f"{out} holds a different sweep (differs in {', '.join(changed)}): use another --out, "
                "or delete that folder to start over"
            )
    else:
        sweep_file.write_text(json.dumps({"config": settings, "environment": environment()}, indent=2, ensure_ascii=False))
    prompts = {name: load_prompts(name)[: config.limit] for name in config.prompts}
    results = ResultsFile(out / "results.jsonl")
    rows = results.read()
    over_cap = {result_key(r) for r in rows if r.get("status") == "over_memory_cap"}
    done = {(result_key(r), r["id"], r.get("repeat", 0)) for r in rows if r.get("status") in ("ok", "failed")}
    todo = []  # (point, [(prompt id, repeat)]), repeats outer: the worker interleaves points per item
    for point in config.points():
        key = json.dumps(point, sort_keys=True)
        ids = [(r.id, repeat) for repeat in range(config.repeats) for r in prompts[point["prompts"]]
               if (key, r.id, repeat) not in done]
        if ids and key not in over_cap:
            todo.append((point, ids))
    total = sum(len(ids) for _, ids in todo)
    bar = tqdm(total=total, desc="sweep", unit="prompt", disable=not progress)
    # Baselines first, so speed-ups can be read off a partial sweep.
    order = {"cloud": 0, "edge": 1, "spec": 2}
    for dtype in config.dtype:
        group = sorted((t for t in todo if t[0]["dtype"] == dtype), key=lambda t: order[t[0]["mode"]])
        while group:
            finished = _run_worker(config, group, out, bar)
            group = [t for t in group if json.dumps(t[0], sort_keys=True) not in finished]
    bar.close()
    counts: dict[str, int] = {}
    for row in results.read():
        counts[row.get("status", "ok")] = counts.get(row.get("status", "ok"), 0) + 1
    return counts


def _run_worker(config: SweepConfig, group: list, out: Path, bar: tqdm) -> set[str]:
    """One worker process for a group of points; returns the keys of points it finished (or that
    hit the memory cap). A worker that dies otherwise raises."""
    ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: the caps and the RSS are its own
    queue = ctx.Queue()
    worker = ctx.Process(target=_worker_main, args=(asdict(config), group, str(out), queue), daemon=True)
    worker.start()
    finished: set[str] = set()
    error = None
    while True:
        try:
            message = queue.get(timeout=0.5)
        except Empty:
            if worker.is_alive():
                continue
            break  # died without saying so (killed, or out of memory)
        kind = message[0]
        if kind == "tick":
            bar.update()
        elif kind in ("point_done", "over_cap"):
            finished.add(message[1])
            if kind == "over_cap":
                bar.write(message[2])
        elif kind == "error":
            error = message[1]
        elif kind == "exit":
            break
    worker.join()
    if worker.exitcode == OVER_MEMORY_EXIT:
        return finished
    if error:
        raise SpecdecError(error)
    if worker.exitcode != 0:
        raise RuntimeError(f"sweep worker died with exit code {worker.exitcode}: rerun to resume")
    return finished


def _worker_main(config_dict: dict, group: list, out: str, queue) -> None:
    config = SweepConfig.from_mapping(config_dict)
    caps = config.caps()
    caps.apply_cpu()
    try:
        run_group(config, caps, group, Path(out), queue)
    except Exception as e:  # noqa: BLE001 - reported to the parent as one line
        queue.put(("error", str(e) if isinstance(e, SpecdecError) else f"{type(e).__name__}: {e}"))
        exit_worker(queue, 1)
    exit_worker(queue, 0)
