"""`specbench sweep`: the grid (bench/measure/sweep_config.py) run in capped worker processes
(bench/measure/worker.py), on this machine or as tasks on a Ray cluster (bench/measure/cluster.py).

Every (point, prompt) record is appended to DIR/results.jsonl as soon as it exists; a rerun of the
same sweep skips what is done. One worker per (dtype) group loads the models once and reuses them
across that group's points, timing them interleaved per prompt (bench/measure/worker.py); CPU caps are
applied first thing in the worker.
"""
from __future__ import annotations

from contextlib import ExitStack
from dataclasses import asdict
from pathlib import Path

from tqdm import tqdm

from bench.measure.caps import OVER_MEMORY_EXIT
from bench.measure.cluster import RayExecutor, ray_executor
from bench.measure.link import BackgroundLink
from bench.core.network import profile
from bench.measure.launch import ServerProcess, WorkerProcess
from bench.core.prompts import load_prompts
from bench.core.folder import IDENTITY_FILES, claim, has_results, write_identity, writer
from bench.core.records import ResultsFile, environment, read_records
from bench.derive.scores import read_scores
from bench.derive.spec_bench import spec_bench_table
from bench.derive.summary import summarize
from bench.core.point import Point
from bench.measure.sweep_config import SweepConfig, service_key
from bench.measure.worker import worker_main
from specdec.errors import SpecdecError
from specdec.remote.protocol import parse_address


# Sweep settings added since folders were first written, with the value that reproduces what such a folder
# measured: its split points' edge and server shared every core (resumed with --split-cores shared), and its
# plain decoding ran in the grid's runtimes only.
BEFORE = {"split_cores": "shared", "plain_runtimes": [], "drafter": ["model"], "turns": "all"}


def run_sweep(config: SweepConfig, out: Path, progress: bool = True) -> dict:
    """Run what is not done yet, then write DIR/summary.csv; returns counts by status. The config
    validated itself; the prompt sets are read before the folder is touched, and the folder is this
    sweep's alone while it runs (bench/core/folder.py: its lock and identity)."""
    settings = config.identity()
    prompts = {name: load_prompts(name)[: config.limit] for name in config.prompts}
    with ExitStack() as placement:
        # --executor ray: the cluster is joined and checked for room before the folder is touched
        cluster = placement.enter_context(ray_executor(config)) if config.executor == "ray" else None
        with writer(out):
            claim(out, "sweep", settings, before=BEFORE)
            if not (has_results(out) and (out / IDENTITY_FILES["sweep"]).is_file()):
                write_identity(out, "sweep", {"config": settings, "environment": environment()})
            counts = _run_sweep(config, prompts, out, progress, cluster)
            rows = read_records(out / "results.jsonl")
            summary = summarize(rows, read_scores(out))
            summary.to_csv(out / "summary.csv", index=False)
            if not (table := spec_bench_table(rows, summary)).empty:  # Spec-Bench categories were measured
                table.to_csv(out / "spec_bench.csv", index=False)
    return counts


def _run_sweep(config: SweepConfig, prompts: dict[str, list], out: Path, progress: bool,
               cluster: RayExecutor | None = None) -> dict:
    results = ResultsFile(out / "results.jsonl")
    rows = results.read()
    over_cap = {Point.from_row(r).key() for r in rows if r.get("status") == "over_memory_cap"}
    done = {(Point.from_row(r).key(), r["id"], r.get("repeat", 0)) for r in rows if r.get("status") in ("ok", "failed")}
    todo = []  # (point, [(prompt id, repeat)]), repeats outer: the worker interleaves points per item
    for point in config.points():
        key = point.key()
        ids = [(r.id, repeat) for repeat in range(config.repeats) for r in prompts[point.prompts]
               if (key, r.id, repeat) not in done]
        if ids and key not in over_cap:
            todo.append((point, ids))
    total = sum(len(ids) for _, ids in todo)
    # Baselines first, so speed-ups can be read off a partial sweep.
    order = {"cloud": 0, "edge": 1, "spec": 2}
    with ExitStack() as services:  # servers and links of split points: stopped at the end, on Ctrl-C and on errors
        # entered first, so it is closed last: an error then starts on a line of its own
        bar = services.enter_context(tqdm(total=total, desc="sweep", unit="prompt", disable=not progress))
        urls = start_split_services(config, [point for point, _ in todo], services)
        if cluster is not None:  # this process writes what the cluster's tasks send back
            cluster.run(sorted(todo, key=lambda t: order[t[0].mode]), results, bar)
        else:
            for dtype in config.dtype:
                group = sorted((t for t in todo if t[0].dtype == dtype), key=lambda t: order[t[0].mode])
                while group:
                    finished = _run_worker(config, group, out, bar, urls)
                    group = [t for t in group if t[0].key() not in finished]
    counts: dict[str, int] = {}
    for row in results.read():
        counts[row.get("status", "ok")] = counts.get(row.get("status", "ok"), 0) + 1
    return counts


def start_split_services(config: SweepConfig, points: list[Point], services: ExitStack) -> dict[str, str]:
    """One `specbench serve` per (dtype, cloud runtime) the split points need (on the cloud's cores,
    SweepConfig.cloud_core_ids), reused by every point, or `cloud_url`; one shaped link per (server, link
    preset). -> {service_key: HOST:PORT the edge connects to}."""
    needed = sorted({(p.dtype, p.cloud_runtime, p.link) for p in points if p.deployment == "split"})
    servers, urls = {}, {}
    cloud_ids = config.cloud_core_ids()
    cloud_cores = ",".join(map(str, cloud_ids)) if cloud_ids else None
    for dtype, runtime, link in needed:
        if (dtype, runtime) not in servers:
            servers[(dtype, runtime)] = config.cloud_url or services.enter_context(
                ServerProcess(config.cloud, dtype, cloud_cores, "--runtime", runtime))
        host, port = parse_address(servers[(dtype, runtime)], "--cloud-url")
        shaped = link != "none"
        urls[service_key(Point(dtype=dtype, cloud_runtime=runtime, link=link))] = services.enter_context(
            BackgroundLink(profile(link), (host, port))) if shaped else servers[(dtype, runtime)]
    return urls


def _run_worker(config: SweepConfig, group: list, out: Path, bar: tqdm, urls: dict[str, str]) -> set[str]:
    """One worker process for a group of points; returns the keys of points it finished (or that
    hit the memory cap). A worker that dies otherwise raises."""
    worker = WorkerProcess(worker_main, asdict(config), group, str(out), urls, ignore_sigint=True).start()
    try:
        return _follow(worker, bar)
    finally:  # Ctrl-C, SIGTERM (bench/cli.py makes it a KeyboardInterrupt here) or an error: stop the worker
        worker.stop()


def _follow(worker: WorkerProcess, bar: tqdm) -> set[str]:
    finished: set[str] = set()
    error = None
    for message in worker.messages():
        kind = message[0]
        if kind == "tick":
            bar.update()
        elif kind in ("point_done", "over_cap"):
            finished.add(message[1])
            if kind == "over_cap":
                bar.write(message[2])
        elif kind == "error":
            error = message[1]
    exitcode = worker.wait()
    if exitcode == OVER_MEMORY_EXIT:
        return finished
    if error:
        raise SpecdecError(error)
    if exitcode != 0:
        raise SpecdecError(f"a sweep worker died with exit code {exitcode} (killed, or out of memory?): "
                           "rerun the same command to resume")
    return finished
