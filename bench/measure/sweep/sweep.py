"""`specbench sweep`: the grid (bench/measure/sweep/sweep_config.py) run in capped worker processes
(bench/measure/sweep/worker.py), on this machine or as tasks on a Ray cluster (bench/measure/sweep/cluster.py).

Every (point, prompt) record is appended to DIR/results.jsonl as soon as it exists; a rerun of the
same sweep skips what is done. One worker per (dtype) group loads the models once and reuses them
across that group's points, timing them interleaved per prompt (bench/measure/sweep/worker.py); CPU caps are
applied first thing in the worker. A worker killed by a signal (a native crash in a runtime) is recorded
against the generation it said it was running (`crashed`), a fresh worker goes on, and a point that
crashed twice is recorded `failed` and not run again (`_crashed`).
"""
from __future__ import annotations

import json
import signal
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import asdict
from pathlib import Path

from tqdm import tqdm

from bench.core.folder import IDENTITY_FILES, MACHINE_FILE, claim, has_results, write_identity, writer
from bench.core.network import NO_LINK, profile
from bench.core.point import AXES, Deployment, Point, given
from bench.core.prompts import load_prompts
from bench.core.records import ResultsFile, environment, read_records
from bench.derive.scores import read_scores
from bench.derive.spec_bench import spec_bench_table
from bench.derive.summary import summarize
from bench.measure.caps import OVER_MEMORY_EXIT
from bench.measure.launch import ServerProcess, WorkerProcess, death_line, native_crash
from bench.measure.link import BackgroundLink
from bench.measure.sweep.cluster import RayExecutor, ray_executor
from bench.measure.sweep.messages import Exit, Failed, OverCap, PointDone, Running, Tick, is_exit, unknown
from bench.measure.sweep.sweep_config import Executor, SweepConfig, service_key
from bench.measure.sweep.worker import worker_main, worker_runtimes
from specdec.errors import SpecdecError
from specdec.remote.protocol import parse_address

# Sweep settings added since folders were first written, with the value that reproduces what such a folder
# measured: its split points' edge and server shared every core (resumed with --split-cores shared), and its
# plain decoding ran in the grid's runtimes only. A setting that became an axis since (constraints, kv_cache)
# was stored as one value: the claim reads it as a list of one (AXES).
BEFORE = {"split_cores": "shared", "plain_runtimes": [], "drafter": ["model"], "turns": "all",
          "llamacpp_extra_buffers": "auto", "rows": [], "edge_device": "cpu", "cloud_device": "cpu", "kv_cache": ["auto"],
          "cuda_graphs": "on", "drafter_options": [""]}


def run_sweep(config: SweepConfig, out: Path, progress: bool = True, machine: dict | None = None) -> dict:
    """Run what is not done yet, then write DIR/summary.csv; returns counts by status. The config
    validated itself; the prompt sets are read before the folder is touched, and the folder is this
    sweep's alone while it runs (bench/core/folder.py: its lock and identity). `machine`: the machine
    and the runtimes chosen from its calibration (bench/measure/runtime_auto.py), kept as DIR/machine.json
    (rewritten by a resume: the machine that ran last)."""
    settings = config.identity()
    prompts = {name: load_prompts(name)[: config.limit] for name in config.prompt_sets()}
    with ExitStack() as placement:
        # --executor ray: the cluster is joined and checked for room before the folder is touched
        cluster = placement.enter_context(ray_executor(config)) if config.executor == Executor.RAY else None
        with writer(out):
            claim(out, "sweep", settings, before=BEFORE, listed=AXES)
            if not (has_results(out) and (out / IDENTITY_FILES["sweep"]).is_file()):
                write_identity(out, "sweep", {"config": settings, "environment": environment()})
            if machine is not None:
                (out / MACHINE_FILE).write_text(json.dumps(machine, indent=2, ensure_ascii=False), encoding="utf-8")
            counts = _run_sweep(config, prompts, out, progress, cluster)
            rows = read_records(out / "results.jsonl")
            summary = summarize(rows, read_scores(out))
            summary.to_csv(out / "summary.csv", index=False)
            if not (table := spec_bench_table(rows, summary)).empty:  # Spec-Bench categories were measured
                table.to_csv(out / "spec_bench.csv", index=False)
    return counts


def _run_sweep(config: SweepConfig, prompts: dict[str, list], out: Path, progress: bool,
               cluster: RayExecutor | None = None, target: Callable = worker_main) -> dict:
    """`target`: the worker process's function (a test passes a stand-in that speaks its protocol)."""
    results = ResultsFile(out / "results.jsonl")
    rows = results.read()
    over_cap = {Point.from_row(r).key() for r in rows if r.get("status") == "over_memory_cap"}
    done = {(Point.from_row(r).key(), r["id"], r.get("repeat", 0)) for r in rows if r.get("status") in ("ok", "failed")}
    todo = []  # (point, [(prompt id, repeat)]), repeats outer: the worker interleaves points per item
    for point in config.points():
        key = point.key()
        listed = prompts[given(point.prompts, "prompts")]
        ids = [(r.id, repeat) for repeat in range(config.repeats) for r in listed if (key, r.id, repeat) not in done]
        if ids and key not in over_cap:
            todo.append((point, ids))
    total = sum(len(ids) for _, ids in todo)
    # Baselines first, so speed-ups can be read off a partial sweep.
    order: dict[str | None, int] = {"cloud": 0, "edge": 1, "spec": 2}
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
                    finished = _run_worker(config, group, out, bar, urls, target)
                    group = [t for t in group if t[0].key() not in finished]
    counts: dict[str, int] = {}
    for row in results.read():
        counts[row.get("status", "ok")] = counts.get(row.get("status", "ok"), 0) + 1
    return counts


def start_split_services(config: SweepConfig, points: list[Point], services: ExitStack) -> dict[str, str]:
    """One `specbench serve` per (dtype, cloud runtime) the split points need (on the cloud's cores,
    SweepConfig.cloud_core_ids), reused by every point, or `cloud_url`; one shaped link per (server, link
    preset). -> {service_key: HOST:PORT the edge connects to}."""
    needed = sorted({(given(p.dtype, "dtype"), given(p.cloud_runtime, "cloud_runtime"), given(p.link, "link"))
                     for p in points if p.deployment == Deployment.SPLIT})
    servers, urls = {}, {}
    cloud_ids = config.cloud_core_ids()
    cloud_cores = ",".join(map(str, cloud_ids)) if cloud_ids else None
    for dtype, runtime, link in needed:
        if (dtype, runtime) not in servers:
            servers[(dtype, runtime)] = config.cloud_url or services.enter_context(
                ServerProcess(config.cloud, dtype, cloud_cores, "--runtime", runtime, "--device", config.cloud_device))
        host, port = parse_address(servers[(dtype, runtime)], "--cloud-url")
        shaped = link != NO_LINK
        urls[service_key(Point(dtype=dtype, cloud_runtime=runtime, link=link))] = services.enter_context(
            BackgroundLink(profile(link), (host, port))) if shaped else servers[(dtype, runtime)]
    return urls


def _run_worker(config: SweepConfig, group: list, out: Path, bar: tqdm, urls: dict[str, str],
                target: Callable = worker_main) -> set[str]:
    """One worker process for a group of points; returns the keys of points it finished, that hit the
    memory cap or that crashed out (`_crashed`). A worker killed while running a point is recorded
    against that point, and the caller starts a fresh one for the rest; dying otherwise, it raises."""
    results = ResultsFile(out / "results.jsonl")
    worker = WorkerProcess(target, asdict(config), group, str(out), urls, ignore_sigint=True).start()
    try:
        return _follow(worker, bar, group, results)
    finally:  # Ctrl-C, SIGTERM (bench/cli.py makes it a KeyboardInterrupt here) or an error: stop the worker
        worker.stop()


def _follow(worker: WorkerProcess, bar: tqdm, group: list, results: ResultsFile) -> set[str]:
    finished: set[str] = set()
    error = None
    running: Running | None = None  # from a Running until its Tick
    started = False
    for message in worker.messages(last=is_exit):
        match message:
            case Tick():
                bar.update()
                running = None
            case Running():
                running, started = message, True
            case PointDone(key=key):
                finished.add(key)
            case OverCap(key=key, line=line):
                finished.add(key)
                bar.write(line)
            case Failed(line=line):
                error = line
            case Exit():
                pass
            case _:
                raise unknown(message)
    exitcode = worker.wait()
    if exitcode == OVER_MEMORY_EXIT:
        return finished
    if error:
        raise SpecdecError(error)
    # A signal other than a stop from outside (SIGTERM: the sweep's own stop, or its parent gone).
    if exitcode < 0 and running is not None and exitcode != -signal.SIGTERM:
        point, items = next((point, items) for point, items in group if point.key() == running.key)
        return finished | _crashed(results, point, items, running.prompt_id, running.repeat, running.description,
                                   exitcode, bar)
    if exitcode != 0:
        where = "while running a point" if running else "between generations" if started else "while loading models"
        raise SpecdecError(f"a sweep worker died {where}: {death_line(exitcode)}; rerun the same command to resume")
    return finished


CRASHES = 2  # crashes of one point (this sweep's and earlier runs' together) after which it is failed, not rerun


def _crashed(results: ResultsFile, point: Point, items: list, prompt_id: str, repeat: int, description: str,
             exitcode: int, bar: tqdm) -> set[str]:
    """Record the generation the worker died in as `crashed` (this process writes it: the folder's one
    writer while the worker is dead). At the point's CRASHES-th crash, every item of the point not done
    is recorded `failed` with the reason, and {its key} is returned: it is not run again, here or by a
    rerun (failed items are done). Else {}: a fresh worker retries it."""
    runtimes = f" in {' or '.join(worker_runtimes(point))}" if native_crash(exitcode) else ""
    line = f"{death_line(exitcode)}{runtimes} while running {description}"
    fields = point.record(sweep=True)  # as the worker's records carry them: Point.from_row(row).key() matches
    results.append({"id": prompt_id, **fields, "repeat": repeat, "status": "crashed", "error": line})
    key = point.key()
    rows = [r for r in results.read() if Point.from_row(r).key() == key]
    if sum(r.get("status") == "crashed" for r in rows) < CRASHES:
        bar.write(f"{line}: recorded as crashed; a fresh worker goes on")
        return set()
    done = {(r["id"], r.get("repeat", 0)) for r in rows if r.get("status") in ("ok", "failed")}
    why = f"crashed {CRASHES} times, last: {line}"
    for item_id, item_repeat in items:  # the group's items of this point: what this sweep still had to run
        if (item_id, item_repeat) not in done:
            results.append({"id": item_id, **fields, "repeat": item_repeat, "status": "failed", "error": why})
            bar.update()
    bar.write(f"{point.label()}: {why}; recorded as failed, not run again")
    return {key}


def crashed_out(rows: list[dict]) -> dict[str, str]:
    """{point label: its last crash's line} for the points that crashed CRASHES times: failed, not rerun."""
    crashes: dict[str, list[str]] = {}
    for row in rows:
        if row.get("status") == "crashed":
            crashes.setdefault(Point.from_row(row).label(), []).append(row["error"])
    return {label: lines[-1] for label, lines in crashes.items() if len(lines) >= CRASHES}
