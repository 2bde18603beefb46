"""The soak: one `specbench serve` and N replayed edges for a set time, with faults on a schedule,
watching what the server holds (bench/test_bench_soak.py runs it; docs/soak.md has its figures).

  0 .. warm-up           edges start; nothing is judged (first forwards run slow)
  warm-up .. 30 %        `before`: no faults, the steady state every later figure is compared with
  30 % .. 70 %           `faults`: an edge SIGKILLed and restarted every 10-30 s, the server SIGSTOPped
                         for 5 s and SIGCONTed, a client that opens a session and vanishes (SIGSTOPped,
                         its connection left open: no FIN, no pong), a client that asks ten `stats` a
                         second and reads one reply in two
  70 % .. end            `after`: no faults, compared with `before`

The edges are processes (bench/measure/serving/soak_edge.py) replaying the soak's own recording: first it
records one split generation per prompt against the same server (`specbench run --mode spec
--cloud-url`), so every later verdict is checked against a recorded one. Every second a sampler
records the server's RSS, open file descriptors and threads (psutil, from outside) and its live
connections, sessions and asyncio tasks (`stats`' `live`, over one connection of its own).

DIR/results.jsonl gets every row as it happens (kind `sample`, `fault`, `generation`), each with the
run's id: a soak is one time series, so a rerun of an interrupted soak runs again whole, and the rows
of the interrupted run stay in the file under their own `run`. A generation cut by an edge's SIGKILL
is recorded failed with that reason by the soak, from the edge's `start` line; nothing is dropped.
bench/derive/soak_summary.py judges the rows.
"""
from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil
from tqdm import tqdm
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from bench.core.folder import claim, write_identity, writer
from bench.core.records import ResultsFile, environment, read_records
from bench.measure.caps import pin_besides
from bench.measure.launch import ServerProcess, die_with_parent, piped, start_edge
from bench.measure.serving.clients import Connection, script_of, server_info
from bench.measure.serving.soak_edge import write_scripts
from specdec.core.verdict import CloudLost
from specdec.errors import ConfigError, InputError
from specdec.remote.protocol import SCHEMA, Hello, Ready, StatsRequest, decode, encode
from specdec.runtime_registry import check_name

ROWS = ("kind", "run")  # every row of a soak's results.jsonl has these
WARM_UP_S = 30.0  # at most; a short soak warms up for 10 % of its time
FAULT_WINDOW = (0.3, 0.7)  # the faults' share of the time
SLOW_READER = (10.0, 2.0)  # it asks this many `stats` per second and reads one reply every this many seconds
SAMPLE_S = 1.0
SETTLE_S = 3.0  # after the edges stop: the end state is sampled then
# ... and again for up to this long while it is not yet the idle server's: one run in two here saw one FD more at
# 3 s (a SIGKILLed client's socket still closing) and none a run later; a leak never returns, so it still fails
SETTLE_MORE_S = 10.0


@dataclass(frozen=True)
class SoakConfig:
    edge: str  # the edge model that records the split run the edges replay
    cloud: str
    prompts: str
    cloud_runtime: str | None = None
    dtype: str = "float32"
    limit: int = 4
    edges: int = 4
    duration_s: float = 1200.0
    k: int = 4
    max_new_tokens: int = 32
    cloud_cores: str | None = None  # pin the server here; this process and the edges get the other cores
    kill_every_s: tuple[float, float] = (10.0, 30.0)
    stop_s: float = 5.0
    timeout_s: float = 60.0
    seed: int = 0
    extra_serve: tuple[str, ...] = field(default=())  # more `serve` flags, e.g. ("--max-batch", "8")

    def __post_init__(self) -> None:
        if self.edges < 1:
            raise ConfigError(f"edges must be >= 1, got {self.edges}")
        if not self.duration_s >= 20:
            raise ConfigError(f"duration_s must be >= 20 s (warm-up, before, faults, after), got {self.duration_s}")
        low, high = self.kill_every_s
        if not 0 < low <= high:
            raise ConfigError(f"kill_every_s must be (low, high) with 0 < low <= high, got {self.kill_every_s}")
        if self.cloud_runtime is not None:
            check_name(self.cloud_runtime, "cloud_runtime")
        if self.limit < 1 or self.k < 1 or self.max_new_tokens < 1:
            raise ConfigError("limit, k and max_new_tokens must be >= 1")

    @property
    def warm_up_s(self) -> float:
        return min(WARM_UP_S, 0.1 * self.duration_s)

    def phase(self, t: float) -> str:
        start, end = (share * self.duration_s for share in FAULT_WINDOW)
        return "warm_up" if t < self.warm_up_s else "before" if t < start else "faults" if t < end else "after"


def schedule(config: SoakConfig) -> list[dict]:
    """The faults, by seconds after the start: drawn from the seed, so a rerun injects the same ones."""
    draw = random.Random(config.seed)
    start, end = (share * config.duration_s for share in FAULT_WINDOW)
    faults = [{"t": start, "fault": "vanish"},  # first: the server frees it only by ping timeout (<= 40 s)
              {"t": start + 0.5, "fault": "slow_reader", "until": end},
              {"t": (start + end) / 2, "fault": "server_stop", "until": (start + end) / 2 + config.stop_s}]
    t = start + 1.0
    while t < end:
        faults.append({"t": t, "fault": "edge_kill", "edge": draw.randrange(config.edges)})
        t += draw.uniform(*config.kill_every_s)
    return sorted(faults, key=lambda f: f["t"])


def record_scripts(config: SoakConfig, url: str, out: Path) -> list:
    """Record one split generation per prompt against the soak's server (an edge process of its own,
    `specbench run`), then read them back as replay scripts. A finished recording is reused."""
    recording = out / "recording"
    command = [sys.executable, "-m", "bench.cli", "run", "--mode", "spec", "--edge", config.edge, "--cloud-url", url,
               "--prompts", config.prompts, "--limit", str(config.limit), "--dtype", config.dtype,
               "--policy", "greedy", "--entropy-threshold", "0", "--k", str(config.k),
               "--max-new-tokens", str(config.max_new_tokens), "--out", str(recording)]
    done = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, preexec_fn=die_with_parent)
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
        raise InputError(f"the soak's recording failed ({why}): `{' '.join(command[2:])}` shows it on its own")
    records = [r for r in read_records(recording / "results.jsonl") if r.get("status") == "ok"]
    if not records:
        raise InputError(f"the soak's recording in {recording} has no finished generation; delete it and rerun")
    return [script_of(r) for r in records]


class Soak:
    def __init__(self, config: SoakConfig, server: ServerProcess, url: str, out: Path, bar) -> None:
        self.config, self.server, self.url, self.out, self.bar = config, server, url, out, bar
        self.pid = server.process.pid
        self.results = ResultsFile(out / "results.jsonl", ROWS)
        self.run_id = uuid.uuid4().hex[:12]
        self.edges: dict[int, asyncio.subprocess.Process] = {}
        self.incarnations: dict[int, int] = {}  # edge index -> times it was started
        self.killed: set[int] = set()  # pids the soak SIGKILLed: their cut generation's reason
        self.holders: list[asyncio.subprocess.Process] = []
        self.readers: list[asyncio.Task] = []

    def write(self, kind: str, **row) -> None:
        self.results.append({"kind": kind, "run": self.run_id, **row})

    def now(self) -> float:
        return time.time() - self.started

    async def run(self) -> None:
        info = await server_info(self.url)
        self.vocab = info["vocab_size"]
        self.started = time.time()
        self.deadline = self.started + self.config.duration_s
        self.before = await self.measure_server()  # the server idle, before any client: the end must return here
        self.write("baseline", t=0.0, **self.before)
        sampler = asyncio.create_task(self.sample())
        try:
            for index in range(self.config.edges):
                await self.start_edge(index)
            await asyncio.gather(*(self.inject(fault) for fault in schedule(self.config)))
            await asyncio.gather(*self.readers)  # every edge ends its last generation after the deadline
        finally:  # on an error too: no client outlives the soak
            for process in [*self.edges.values(), *self.holders]:
                if process.returncode is None:
                    process.kill()
                    await process.wait()
        await asyncio.sleep(SETTLE_S)
        sampler.cancel()
        end = await self.measure_server()
        deadline = time.monotonic() + SETTLE_MORE_S
        while not self.back_to_idle(end) and time.monotonic() < deadline:  # a killed client's socket closing late
            await asyncio.sleep(SAMPLE_S / 2)
            end = await self.measure_server()
        self.write("end", t=self.now(), **end)

    def back_to_idle(self, state: dict) -> bool:
        """No session or connection left, and the FDs and tasks the idle server had before the first client."""
        return (state["sessions"] == 0 and state["connections"] == 0 and state["fds"] == self.before["fds"]
                and state["tasks"] == self.before["tasks"])

    async def start_edge(self, index: int) -> None:
        incarnation = self.incarnations[index] = self.incarnations.get(index, -1) + 1
        job = {"role": "edge", "client": index, "incarnation": incarnation, "scripts": str(self.out / "scripts.json"),
               "url": self.url, "vocab": self.vocab, "deadline": self.deadline, "timeout_s": self.config.timeout_s}
        process = await start_edge("bench.measure.serving.soak_edge", json.dumps(job))
        self.edges[index] = process
        self.readers.append(asyncio.create_task(self.collect(index, process)))

    async def collect(self, index: int, process) -> None:
        """An edge's lines into rows; the generation it started and never ended, failed with why."""
        started = None
        while line := await process.stdout.readline():
            event = json.loads(line)
            if event["event"] == "start":
                started = event
                continue
            started = None
            t = event["t"] - self.started
            self.write("generation", **{k: v for k, v in event.items() if k not in ("event", "t")},
                       t=t, phase=self.config.phase(t))
            self.bar.update()
        code = await process.wait()
        if started is not None:
            t = time.time() - self.started
            why = ("the edge process was SIGKILLed by the soak (fault)" if process.pid in self.killed
                   else f"the edge process exited with code {code} mid-generation")
            self.write("generation", **{k: v for k, v in started.items() if k not in ("event", "t")},
                       status="failed", error=why, t=t, phase=self.config.phase(t))
            self.bar.update()

    async def inject(self, fault: dict) -> None:
        await asyncio.sleep(max(self.started + fault["t"] - time.time(), 0.0))
        self.write("fault", **fault, at=self.now())
        if fault["fault"] == "edge_kill":
            victim = self.edges[fault["edge"]]
            if victim.returncode is None:
                self.killed.add(victim.pid)
                victim.kill()
                await victim.wait()
                await self.start_edge(fault["edge"])
        elif fault["fault"] == "server_stop":
            os.kill(self.pid, signal.SIGSTOP)
            await asyncio.sleep(fault["until"] - fault["t"])
            os.kill(self.pid, signal.SIGCONT)
        elif fault["fault"] == "vanish":
            await self.vanish()
        elif fault["fault"] == "slow_reader":
            await self.slow_reader(fault["until"] - fault["t"])
        self.write("fault_end", fault=fault["fault"], t=fault["t"], at=self.now())

    async def vanish(self) -> None:
        job = {"role": "hold", "client": len(self.holders), "scripts": str(self.out / "scripts.json"), "url": self.url,
               "vocab": self.vocab, "deadline": self.deadline, "timeout_s": self.config.timeout_s}
        holder = await start_edge("bench.measure.serving.soak_edge", json.dumps(job))
        self.holders.append(holder)
        line = await piped(holder.stdout).readline()
        if json.loads(line or b"{}").get("event") != "held":
            raise InputError(f"the soak's vanishing client did not open its session (exit {await holder.wait()})")
        os.kill(holder.pid, signal.SIGSTOP)  # gone without a word: its socket stays open, nothing answers

    async def slow_reader(self, seconds: float) -> None:
        """Ten requests a second, one reply read every two: the server must not buffer without bound
        or stall the others while its sends to this client wait. Sending and reading are two tasks:
        once the server stops reading this client (backpressure, as it should), the sends wait."""
        asks, every = SLOW_READER

        async def ask(ws) -> None:
            while True:
                await ws.send(encode(StatsRequest(since=0)))  # the whole batch log: replies grow as the soak runs
                await asyncio.sleep(1.0 / asks)

        async def read(ws) -> None:
            while True:
                await asyncio.sleep(every)
                await ws.recv()

        # No keepalive of its own: its pongs queue behind the replies it does not read, and a client
        # that gives up on its own pings (a first 20-minute soak's did, after 9 min) is not a slow one.
        async with connect(f"ws://{self.url}/", compression=None, max_size=None, max_queue=1, close_timeout=2,
                           ping_interval=None) as ws:
            await ws.send(encode(Hello(schema=SCHEMA, token=None)))
            decode(await ws.recv(), Ready)
            tasks = [asyncio.create_task(ask(ws)), asyncio.create_task(read(ws))]
            done, _ = await asyncio.wait(tasks, timeout=seconds, return_when=asyncio.FIRST_EXCEPTION)
            for task in tasks:
                task.cancel()
            for task in done:
                try:
                    task.result()
                except ConnectionClosed as e:  # the server may drop a client that will not read: kept, with why
                    self.write("fault_note", fault="slow_reader", at=self.now(), note=f"connection closed: {e}")

    async def measure_server(self) -> dict:
        """The server's RSS, FDs and threads (from outside) and its live counts (over a connection of
        our own, which it counts: `connections` here excludes it)."""
        process = psutil.Process(self.pid)
        row = {"rss_bytes": process.memory_info().rss, "fds": process.num_fds(), "threads": process.num_threads()}
        try:
            async with Connection(self.url, None, SAMPLE_S) as server:
                await server.send("stats", since=1 << 40)
                live = (await server.receive("stats")).get("live") or {}
            row.update(connections=live.get("connections", 0) - 1, sessions=live.get("sessions"), tasks=live.get("tasks"))
        except CloudLost:  # stopped (the SIGSTOP fault) or too busy to answer within a second
            row.update(connections=None, sessions=None, tasks=None)
        return row

    async def sample(self) -> None:
        while True:
            tick = time.time()
            row = await self.measure_server()
            t = self.now()
            self.write("sample", t=t, phase=self.config.phase(t), **row)
            await asyncio.sleep(max(SAMPLE_S - (time.time() - tick), 0.0))


def run_soak(config: SoakConfig, out: Path, progress: bool = True) -> Path:
    """Record, then soak; returns the results file. The server and every client stop on the way out."""
    out = Path(out)
    settings = json.loads(json.dumps(asdict(config)))
    with writer(out):
        claim(out, "soak", settings)
        write_identity(out, "soak", {"config": settings, "environment": environment()})
        serve = ServerProcess(config.cloud, config.dtype, config.cloud_cores,
                              *(["--runtime", config.cloud_runtime] if config.cloud_runtime else []),
                              "--max-sessions", str(2 * config.edges + 8), *config.extra_serve)
        with serve as url:
            if config.cloud_cores:  # the edges (this process's children) get the other cores
                pin_besides(config.cloud_cores, "cloud_cores")
            write_scripts(out / "scripts.json", record_scripts(config, url, out))
            with tqdm(desc="soak", unit="generation", disable=not progress) as bar:
                asyncio.run(Soak(config, serve, url, out, bar).run())
    return out / "results.jsonl"

