"""`specbench fleet`: N edges against one verifier server, for each fleet size N, and cloud-only
serving of the same N clients (bench/measure/serving/fleet_config.py says what; bench/measure/serving/clients.py speaks to
the server; bench/measure/serving/fleet_edge.py is one real edge process).

A level = (mode, N, repeat): N clients at once, each generating for every prompt (client i starts
at prompt i, so they are not in lockstep), closed loop or Poisson arrivals. Raw records go to
DIR/results.jsonl as each generation ends, every forward of the server to DIR/batches.jsonl and a
finished level's wall time to DIR/levels.jsonl. A rerun skips finished levels; an interrupted
level is run again whole (its numbers need all N clients running together), and the records it
had written stay in the file under their own `level_run`.
"""
from __future__ import annotations

import asyncio
import json
import os
import random
import time
import uuid
from contextlib import AsyncExitStack, ExitStack
from dataclasses import asdict
from pathlib import Path

import pandas as pd
from tqdm import tqdm

from bench.core.folder import IDENTITY_FILES, claim, differences, has_results, write_identity, writer
from bench.core.network import NO_LINK, profile
from bench.core.point import FIELDS, Deployment
from bench.core.prompts import load_prompts
from bench.core.records import ResultsFile, environment, read_records
from bench.derive.fleet_summary import BATCHES, LEVELS, UNKNOWN_RUNTIME, summarize_fleet
from bench.measure.caps import pin_besides
from bench.measure.launch import ServerProcess, edge_ready, start_edge, stop_edges
from bench.measure.link import Link
from bench.measure.serving.clients import Script, cloud_only, replay, script_of, server_info, server_log
from bench.measure.serving.fleet_config import FleetConfig
from specdec.core.config import DecodeConfig, SpecConfig
from specdec.core.verdict import CloudLost
from specdec.errors import InputError
from specdec.remote.protocol import read_token
from specdec.runtime_registry import served_runtime
from specdec.settings import Mode


def run_fleet(config: FleetConfig, spec: SpecConfig, decode: DecodeConfig, out: Path,
              progress: bool = True) -> tuple[dict, pd.DataFrame]:
    """Run every level not done yet, then write DIR/summary.csv; returns counts by status and the summary."""
    config.check_spec(spec)
    settings = json.loads(json.dumps({"fleet": asdict(config), "spec": asdict(spec), "decode": asdict(decode)}))
    prompts = [r.id for r in load_prompts(config.prompts)[: config.limit]]
    scripts = replay_scripts(config, settings, prompts) if config.edge_replay else {}
    token = read_token(config.token_file) if config.token_file else None
    with writer(out):
        identity = {**settings["fleet"], **settings["spec"], **settings["decode"]}  # flat: a refusal names the field
        # A folder written before `cloud_runtime` was: its own server ran the default, a --cloud-url one is unknown.
        claim(out, "fleet", identity, before={"cloud_runtime": config.cloud and served_runtime(config.cloud, None),
                                               "cloud_device": "cpu", "follow_verdicts": False, "kv_cache": "dynamic",
                                               "cuda_graphs": "on"})
        if not (has_results(out) and (out / IDENTITY_FILES["fleet"]).is_file()):
            write_identity(out, "fleet", {"config": identity, "environment": environment()})
        done = {(lv["mode"], lv["clients"], lv["repeat"]) for lv in ResultsFile(out / LEVELS, ("mode", "clients")).read()}
        modes = ("spec", "cloud") if config.baseline else ("spec",)
        # Sizes interleaved within a repeat, and spec beside cloud-only at each size: drift hits both.
        plan = [(mode, n, r) for r in range(config.repeats) for n in config.clients for mode in modes
                if (mode, n, r) not in done]
        with ExitStack() as services:
            bar = services.enter_context(tqdm(total=sum(n * len(prompts) for _, n, _ in plan), desc="fleet",
                                              unit="generation", disable=not progress))
            if config.cloud_url:
                url = config.cloud_url
            else:
                assert config.cloud is not None and config.cloud_runtime is not None  # FleetConfig's, without cloud_url
                url = services.enter_context(ServerProcess(
                    config.cloud, config.dtype, config.cloud_cores,
                    "--runtime", config.cloud_runtime, "--device", config.cloud_device,
                    "--max-batch", str(config.max_batch), "--batch-window-ms", str(config.batch_window_ms),
                    "--max-sessions", str(2 * max(config.clients) + 2),
                    *(["--follow-verdicts"] if config.follow_verdicts else []),
                    "--kv-cache", config.kv_cache, "--cuda-graphs", config.cuda_graphs))
            if config.cloud and config.cloud_cores:  # this process and its edge processes: the other cores
                pin_besides(config.cloud_cores, "--cloud-cores")
            fleet = Fleet(config, settings, prompts, scripts, url, token, out, bar)
            asyncio.run(fleet.run(plan))
        summary = summarize_fleet(out)
        summary.to_csv(out / "summary.csv", index=False)
    counts: dict[str, int] = {}
    for row in read_records(out / "results.jsonl"):
        counts[row["status"]] = counts.get(row["status"], 0) + 1
    return counts, summary


def replay_scripts(config: FleetConfig, settings: dict, prompts: list[str]) -> dict[str, Script]:
    """One script per prompt from the replay folder: its split records of this point and prompt set."""
    assert config.edge_replay is not None  # run_fleet reads scripts only for a replayed fleet
    source = Path(config.edge_replay) / "results.jsonl"
    # A replayed record shares every point field the fleet sets (the rest, e.g. overlap, is the recording's own).
    fleet_sets = {**settings["spec"], **settings["decode"], "dtype": config.dtype, "constraints": config.constraints}
    wanted = {name: value for name, value in fleet_sets.items() if name in FIELDS}
    records = [r for r in read_records(source) if r.get("deployment") == Deployment.SPLIT and r.get("status") == "ok"
               and r.get("mode") == Mode.SPEC and r.get("prompts") == config.prompts and r.get("repeat", 0) == 0]
    matching = [r for r in records if all(r.get(name) == value for name, value in wanted.items())]
    scripts = {r["id"]: script_of(r) for r in matching}
    missing = [p for p in prompts if p not in scripts]
    if missing:
        nearest = min(records, key=lambda r: sum(r.get(n) != wanted[n] for n in wanted), default=None)
        hint = ("; its split records differ in " + differences({n: nearest.get(n) for n in wanted}, wanted)) if nearest else ""
        raise InputError(f"--edge-replay {config.edge_replay} has no finished split generation of prompt "
                         f"{missing[0]!r} ({config.prompts}) at this point{hint}: record it with `specbench run --mode "
                         "spec --cloud-url ...` and the same settings")
    return {p: scripts[p] for p in prompts}


def arrivals(count: int, rate_per_client: float | None, seed: int) -> list[float]:
    """Seconds after the level starts at which a client's prompts arrive: all at 0 in a closed
    loop (the next starts when one ends), Poisson otherwise."""
    if rate_per_client is None:
        return [0.0] * count
    draw, t = random.Random(seed), 0.0
    times = []
    for _ in range(count):
        t += draw.expovariate(rate_per_client)
        times.append(t)
    return times


class Fleet:
    """The levels of one fleet against the server at `url`. `settings`: the fleet's, its spec's and its decoding's
    fields as JSON ({"fleet": ..., "spec": ..., "decode": ...}), as its records and edge processes carry them."""

    def __init__(self, config: FleetConfig, settings: dict, prompts: list[str], scripts: dict[str, Script], url: str,
                 token: str | None, out: Path, bar: tqdm) -> None:
        self.config, self.settings = config, settings
        self.prompts, self.scripts, self.server_url, self.token, self.out, self.bar = prompts, scripts, url, token, out, bar
        self.results = ResultsFile(out / "results.jsonl")
        self.levels = ResultsFile(out / LEVELS, ("mode", "clients"))
        self.batches = ResultsFile(out / BATCHES, ("mode", "clients"))

    async def run(self, plan: list[tuple[str, int, int]]) -> None:
        async with AsyncExitStack() as stack:
            self.url = self.server_url
            if self.config.link != NO_LINK:  # every client's connection shaped on its own
                stop, listening = asyncio.Event(), asyncio.get_running_loop().create_future()
                host, port = self.server_url.rsplit(":", 1)
                link = Link(profile(self.config.link), (host.strip("[]"), int(port)))
                task = asyncio.create_task(link.serve("127.0.0.1", 0, stop, lambda h, p: listening.set_result(f"{h}:{p}")))
                stack.push_async_callback(lambda: asyncio.wait_for(task, 10))
                stack.callback(stop.set)
                self.url = await asyncio.wait_for(listening, 10)
            info = await server_info(self.server_url, self.token)
            self.cloud_model, self.vocab = info["model"], info["vocab_size"]
            # What the server says it runs; an older server does not say: the fleet's own server runs what it was
            # started with, someone else's (--cloud-url) is unknown, never guessed.
            self.cloud_runtime = info.get("runtime") or self.config.cloud_runtime or UNKNOWN_RUNTIME
            self.cloud_device = info.get("device", "cpu")  # an older server does not say: it ran on the CPU
            # The cache the server keeps (its `auto` resolved); an older server does not say: what it was started with.
            self.kv_cache = info.get("kv_cache") or (self.config.kv_cache if self.config.cloud else None)
            if self.config.follow_verdicts and not info.get("follows"):
                raise InputError(f"--follow-verdicts: the server at {self.server_url} keeps its own verdicts; start it "
                                 "with `specbench serve --follow-verdicts`")
            await self.warm_up()
            for mode, clients, repeat in plan:
                await self.level(mode, clients, repeat)

    async def warm_up(self) -> None:
        """One untimed generation each way first: a server's first forwards run slow (thread pools,
        allocator), and that must not land in the first level."""
        script = next(iter(self.scripts.values()), None)
        if script is not None:
            await replay(self.url, script, self.vocab, self.token, self.config.cloud_timeout_s, self.config.follow_verdicts)
            if self.config.baseline:
                await cloud_only(self.url, script, self.vocab, self.token)

    def point(self, mode: str, clients: int, repeat: int, run_id: str) -> dict:
        kind = None if mode == Mode.CLOUD else ("replay" if self.config.edge_replay else "process")
        spec = self.settings["spec"]
        return {"mode": mode, "clients": clients, "repeat": repeat, "level_run": run_id, "edge_kind": kind,
                "cloud": self.cloud_model, "cloud_runtime": self.cloud_runtime, "cloud_device": self.cloud_device,
                "kv_cache": self.kv_cache,
                "prompts": self.config.prompts,
                "dtype": self.config.dtype,
                "link": self.config.link, "rate": self.config.rate, "max_batch": self.config.max_batch,
                "batch_window_ms": self.config.batch_window_ms, "policy": spec["policy"], "k": spec["k"],
                "entropy_threshold": spec["entropy_threshold"], "max_new_tokens": self.settings["decode"]["max_new_tokens"]}

    async def level(self, mode: str, clients: int, repeat: int) -> None:
        run_id = uuid.uuid4().hex[:12]
        point = self.point(mode, clients, repeat, run_id)
        rate = self.config.rate / clients if self.config.rate else None
        edges = mode == Mode.SPEC and not self.config.edge_replay
        processes = await self.start_edges(point, clients, rate) if edges else []
        try:
            _, since = await server_log(self.server_url, 1 << 40, self.token)  # the level's forwards start here
            started = time.perf_counter()
            if edges:
                failed = await self.go(processes)
            else:
                scripts = self.scripts or self.recorded_scripts()
                failed = sum(await asyncio.gather(*(
                    self.client(point, i, scripts, arrivals(len(self.prompts), rate, self.seed(point, i)), started)
                    for i in range(clients))))
            wall_s = time.perf_counter() - started
        finally:
            await stop_edges(processes)
        batches, _ = await server_log(self.server_url, since, self.token)
        for batch in batches:
            self.batches.append({"mode": mode, "clients": clients, "repeat": repeat, "level_run": run_id,
                                 "cloud_runtime": self.cloud_runtime, **batch})
        if failed:
            raise InputError(f"{failed} generations of the {mode} level with {clients} clients failed (recorded with "
                             f"their error in {self.results.path}); fix the cause and rerun to redo that level")
        self.levels.append({"mode": mode, "clients": clients, "repeat": repeat, "level_run": run_id,
                            "cloud_runtime": self.cloud_runtime, "kv_cache": point["kv_cache"], "wall_s": wall_s,
                            "generations": clients * len(self.prompts)})

    def seed(self, point: dict, index: int) -> int:
        """Poisson arrivals per (seed, N, client, repeat): the same for spec and cloud-only."""
        return ((self.settings["decode"]["seed"] * 1_000_003 + point["clients"]) * 1009 + index) * 31 + point["repeat"]

    def recorded_scripts(self) -> dict[str, Script]:
        """Cloud-only serving after edge processes: the prompts and lengths of this fleet's own spec generations."""
        scripts = {}
        for record in self.results.read():
            if record.get("mode") == Mode.SPEC and record.get("status") == "ok" and record["id"] not in scripts:
                scripts[record["id"]] = script_of(record)
        missing = [p for p in self.prompts if p not in scripts]
        if missing:
            raise InputError(f"cloud-only serving needs a spec generation of prompt {missing[0]!r} first; rerun the fleet")
        return scripts

    async def client(self, point: dict, index: int, scripts: dict[str, Script], arrive: list[float], started: float) -> int:
        order = self.prompts[index % len(self.prompts):] + self.prompts[: index % len(self.prompts)]
        failed = 0
        for prompt_id, arrival in zip(order, arrive):
            await asyncio.sleep(max(started + arrival - time.perf_counter(), 0.0))
            begin = time.perf_counter()
            try:
                if point["mode"] == Mode.SPEC:
                    measured = await replay(self.url, scripts[prompt_id], self.vocab, self.token, self.config.cloud_timeout_s,
                                            self.config.follow_verdicts)
                else:
                    measured = await cloud_only(self.url, scripts[prompt_id], self.vocab, self.token)
                row = {"id": prompt_id, **point, "client": index, "status": "ok", **measured}
            except CloudLost as e:
                row = {"id": prompt_id, **point, "client": index, "status": "failed", "error": str(e)}
                failed += 1
            end = time.perf_counter()
            row.update(arrival_s=arrival, start_s=begin - started, end_s=end - started, response_s=end - started - arrival)
            if row["status"] == "ok":
                row["tokens_per_s"] = row["new_tokens"] / row["latency_s"]
            self.results.append(row)
            self.bar.update()
        return failed

    async def start_edges(self, point: dict, clients: int, rate: float | None) -> list:
        """N real edge processes (bench/measure/serving/fleet_edge.py), each loaded and warmed up; they share this
        machine's cores with the server unless it is pinned (records carry `cores_shared`)."""
        job = {"edge": self.config.edge, "url": self.url, "token_file": self.config.token_file,
               "dtype": self.config.dtype, "chat_template": self.config.chat_template,
               "constraints": self.config.constraints, "prompts": self.config.prompts, "limit": self.config.limit,
               "spec": self.settings["spec"], "decode": self.settings["decode"], "point": point,
               "cloud_timeout_s": self.config.cloud_timeout_s, "cores_shared": os.cpu_count()}
        processes = []
        try:
            for index in range(clients):
                order = self.prompts[index % len(self.prompts):] + self.prompts[: index % len(self.prompts)]
                spec = {**job, "client": index, "order": order,
                        "arrivals": arrivals(len(order), rate, self.seed(point, index))}
                processes.append(await start_edge("bench.measure.serving.fleet_edge", json.dumps(spec)))
            for process in processes:  # each says `ready` once its model is loaded and warm
                if not await edge_ready(process):
                    raise InputError(f"an edge process of the fleet did not start (exit {await process.wait()}); "
                                     "run the same settings with `specbench run` to see why")
        except BaseException:
            await stop_edges(processes)
            raise
        return processes

    async def go(self, processes: list) -> int:
        for process in processes:
            process.stdin.write(b"go\n")
            await process.stdin.drain()
        return sum(await asyncio.gather(*(self.collect(process) for process in processes)))

    async def collect(self, process) -> int:
        failed = 0
        while line := await process.stdout.readline():
            row = json.loads(line)
            failed += row["status"] != "ok"
            self.results.append(row)
            self.bar.update()
        if await process.wait() != 0:
            raise InputError(f"an edge process of the fleet exited with {process.returncode}; "
                             "run the same settings with `specbench run` to see why")
        return failed
