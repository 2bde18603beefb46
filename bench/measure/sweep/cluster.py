"""`specbench sweep --executor ray`: a sweep's groups of points as Ray tasks on a cluster.

This process, the driver, plans, submits and alone writes results.jsonl (through the sweep's
ResultsFile: appended and fsynced per record, resumable, one writer). Each task runs the local
sweep's own worker (bench/measure/sweep/worker.py: caps first, models loaded once, points interleaved per
prompt) as a child process of its Ray worker, so caps, RSS and exit code are the worker's own as
on one machine, and relays the worker's messages as they come (a Ray streaming generator): every
record reaches the driver when its prompt finishes.

- A group (the points of one dtype: they share the loaded models) is split by prompt into as many
  tasks as the cluster can run at once. A prompt's points stay in one task, on one node, timed
  back to back as locally; a point's prompts may spread over nodes (records say which node).
- A task asks for `num_cpus` = --edge-cores (unset: as many as this machine has) and `memory` =
  `memory_request`. Ray's resources are logical: they only place the task on a node with that
  room, and the worker's caps hold it to the room (affinity, threads, the RSS watchdog).
- A task whose worker or node dies is submitted again with what it had not finished: the prompt it
  was running is lost and redone, what it sent is already written. After RETRIES such losses the
  sweep stops with one line; a rerun resumes.

Ray is imported here only, on first use: the base install has no Ray (`pip install -e '.[cluster]'`).
"""
from __future__ import annotations

import fcntl
import math
import os
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bench.core.point import Point
from bench.core.records import ResultsFile, node_info
from bench.measure.caps import OVER_MEMORY_EXIT
from bench.measure.launch import WorkerProcess, death_line
from bench.measure.sweep.messages import (
    Ended,
    Exit,
    Failed,
    Message,
    OverCap,
    PointDone,
    Record,
    Running,
    Started,
    Tick,
    is_exit,
    unknown,
)
from bench.measure.sweep.sweep_config import RAY_HERE, SweepConfig
from bench.measure.sweep.worker import worker_main
from specdec.errors import ConfigError, SpecdecError
from specdec.models import registry
from specdec.remote.protocol import parse_address
from specdec.settings import Mode

RETRIES = 2  # losses of one task's worker or node before the sweep stops
RUNTIME_BYTES = 1 << 30  # a worker's Python + torch + transformers before any weights (measured ~0.6 GiB)
LOCAL_OBJECT_STORE_BYTES = 200 << 20  # records are small; Ray's default would reserve 30 % of memory
CONNECT_TIMEOUT_S = 5.0
CORE_WAIT_S = 300.0  # how long a task waits for cores an ended task's worker still holds: a bound against a hang


def import_ray():
    try:
        import ray
    except ImportError:
        raise ConfigError("--executor ray needs Ray, which is not installed: pip install -e '.[cluster]'") from None
    return ray


@contextmanager
def joined(address: str | None) -> Iterator[object]:
    """The `ray` module, connected: to the cluster at `address` (`auto`: the one `ray start` runs
    here), or to a Ray instance started for this sweep and sized to this machine. A connection the
    caller already holds (a test, a notebook) is used and left open."""
    ray = import_ray()
    if address not in (None, "auto"):  # Ray itself retries an unreachable head for a minute or more
        host, port = parse_address(address, "--ray-address")
        try:
            socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S).close()
        except OSError as e:
            raise ConfigError(f"no Ray cluster answers at {address} ({e.strerror or e}): start its head with "
                              "`ray start --head`, or fix --ray-address") from None
    if ray.is_initialized():
        yield ray
        return
    # ray.init replaces SIGTERM's handler with sys.exit(15) (and a native stack dump); the command's
    # own one makes SIGTERM a Ctrl-C: exit 130 and one line, as with the local executor.
    on_sigterm = signal.getsignal(signal.SIGTERM) if threading.current_thread() is threading.main_thread() else None
    try:
        if address is None:
            ray.init(num_cpus=len(os.sched_getaffinity(0)), include_dashboard=False, log_to_driver=False,
                     object_store_memory=LOCAL_OBJECT_STORE_BYTES, logging_level="ERROR")
        else:
            ray.init(address=address, log_to_driver=False, logging_level="ERROR")
    except (ConnectionError, RuntimeError, ValueError) as e:
        where = "no Ray cluster runs on this machine" if address == RAY_HERE else f"cannot join the Ray cluster at {address}"
        raise ConfigError(f"{where} ({first_line(e)}): start one with `ray start --head`, or drop --ray-address to "
                          "start one for this sweep") from None
    finally:
        if on_sigterm is not None:
            signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield ray
    finally:
        ray.shutdown()


def first_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__


@dataclass(frozen=True)
class Request:
    """What one task of a group asks Ray for."""

    cpus: int
    memory_bytes: int
    what: str  # for messages: "float32 points"

    def options(self) -> dict:
        return {"num_cpus": self.cpus, **({"memory": self.memory_bytes} if self.memory_bytes else {})}


def stored_bytes(name: str | None) -> int:
    """Bytes of a model's float32 safetensors on this machine (a folder, or a fetched alias); 0 when
    unknown here (a hub id, or an alias that each node fetches on first use)."""
    if not name:
        return 0
    folder = Path(name) if Path(name).is_dir() else None
    if folder is None and registry.is_alias(name) and registry.is_fetched(name):
        folder = registry.model_dir(name)
    return sum(p.stat().st_size for p in folder.glob("*.safetensors")) if folder else 0


def memory_request(config: SweepConfig, points: list[Point]) -> int:
    """Memory of one task: the runtime plus the weights of the models its points load (halved in
    bf16), the edge's counted as its cap where there is one. An estimate for placement only: the
    cap itself is the RSS watchdog's."""
    modes, dtype = {p.mode for p in points}, points[0].dtype
    scale = 0.5 if dtype == "bfloat16" else 1.0
    edge = (config.edge_memory_gb * (1 << 30) if config.edge_memory_gb else stored_bytes(config.edge) * scale) \
        if modes - {Mode.CLOUD} else 0
    cloud = stored_bytes(config.cloud) * scale if modes - {Mode.EDGE} else 0
    return int(RUNTIME_BYTES + edge + cloud)


def requests(config: SweepConfig) -> dict[str, Request]:
    """{dtype: what each task of that group asks for}."""
    cpus = config.edge_cores or len(os.sched_getaffinity(0))
    return {dtype: Request(cpus, memory_request(config, [p for p in config.points() if p.dtype == dtype]),
                           f"the {dtype} points")
            for dtype in config.dtype}


def check_room(nodes: list[dict], request: Request) -> int:
    """How many tasks of `request` the cluster's live nodes hold at once; a ConfigError if none
    holds one (Ray would wait for such a node forever)."""
    resources = [n["Resources"] for n in nodes if n.get("Alive")]
    slots = sum(min(r.get("CPU", 0) // request.cpus,
                    r.get("memory", 0) // request.memory_bytes if request.memory_bytes else math.inf)
                for r in resources)
    if slots:
        return int(slots)
    cpus = max((r.get("CPU", 0) for r in resources), default=0)
    memory = max((r.get("memory", 0) for r in resources), default=0) / (1 << 30)
    raise ConfigError(f"no node of the Ray cluster has {request.cpus} CPUs and {request.memory_bytes / (1 << 30):.1f} GiB "
                      f"for {request.what} (--edge-cores {request.cpus}; the largest node has {cpus:g} CPUs and "
                      f"{memory:.1f} GiB): lower --edge-cores, or join a larger node (`ray start --address HEAD "
                      "--num-cpus N`)")


def shards(group: list, n: int) -> list[list]:
    """`group` ((point, [(prompt id, repeat)]) ...) split by prompt id into at most `n` groups,
    every point keeping its order and a prompt's repeats."""
    ids = list(dict.fromkeys(i for _, items in group for i, _ in items))
    parts = [set(ids[s::n]) for s in range(min(n, len(ids)))]
    return [[(point, mine) for point, items in group if (mine := [it for it in items if it[0] in part])]
            for part in parts]


def claim_cores(n: int, wait_s: float = 0.0) -> list[int]:
    """`n` of this node's cores no other sweep task holds: one lock file per core, held until
    `release_cores()` or this process's end. Ray counts CPUs but does not say which: two tasks pinned
    to the first n cores, as a lone local worker is, would share them.

    A task that Ray counts as ended can still hold its cores: the locks go with its worker process,
    and Ray gives the task's CPUs to the next one before that process has exited. A killed worker, or
    one starved on a busy node (Ray's workers run niced; with the other core kept busy, one was still
    there tens of seconds after its task), held them when the next task came. So a task can wait up
    to `wait_s` for cores to be let go, polling and holding none meanwhile (two waiting tasks that
    each held part of their cores could wait for each other)."""
    folder = Path(tempfile.gettempdir()) / "specbench-cores"
    folder.mkdir(exist_ok=True)
    deadline = time.monotonic() + wait_s
    while True:
        fds = []
        for core in sorted(os.sched_getaffinity(0)):
            fd = os.open(folder / str(core), os.O_RDWR | os.O_CREAT, 0o666)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            fds.append((core, fd))
            if len(fds) == n:
                _claimed.extend(fd for _, fd in fds)  # kept open until release_cores() or this worker's end
                return [core for core, _ in fds]
        for _, fd in fds:
            os.close(fd)
        if time.monotonic() >= deadline:
            break
        time.sleep(0.2)
    host = node_info()["hostname"]
    if not wait_s:
        raise ConfigError(f"node {host} has {len(fds)} free cores for --edge-cores {n}: its Ray CPUs overstate its "
                          "cores; start it with `ray start --num-cpus` at most its core count")
    raise ConfigError(f"node {host} had {len(fds)} free cores for --edge-cores {n} for {wait_s:.0f} s: another "
                      "process holds them (another sweep on this node?); let it finish, or run one sweep a node")


def release_cores() -> None:
    """Let go of the cores this process claimed."""
    while _claimed:
        os.close(_claimed.pop())


def node_ray_cpus() -> float:
    """The Ray CPUs of the node this task runs on."""
    import ray

    me = ray.get_runtime_context().get_node_id()
    return next((n["Resources"].get("CPU", 0) for n in ray.nodes() if n["NodeID"] == me), 0)


_claimed: list[int] = []


def group_task(config_dict: dict, group: list) -> Iterator[Message]:
    """On a node: the sweep worker as a child process on cores of its own, its messages relayed as
    they come; first where it runs (Started), last its exit code (Ended)."""
    if config_dict["edge_cores"]:  # the worker's caps take the first cores of the affinity it inherits
        # Cores held on a node whose Ray CPUs do not exceed its cores belong to ending tasks: wait for them.
        overstated = node_ray_cpus() > len(os.sched_getaffinity(0))
        try:
            os.sched_setaffinity(0, claim_cores(config_dict["edge_cores"], 0.0 if overstated else CORE_WAIT_S))
        except ConfigError as e:
            yield Failed(str(e))
            yield Ended(1)
            return
    try:
        worker = WorkerProcess(worker_main, config_dict, group, None, {}).start()
        yield Started(node_info(), os.getpid())
        yield from worker.messages(last=is_exit)
        code = worker.wait()
    finally:
        release_cores()  # before the task ends, not when this Ray worker's process has exited: see claim_cores
    yield Ended(code)


@dataclass
class Task:
    group: list  # (point, [(prompt id, repeat)]) it was given
    request: Request
    losses: int = 0
    node: dict | None = None
    done: set = field(default_factory=set)  # (point key, prompt id, repeat) whose record is written
    error: str | None = None
    exitcode: int | None = None

    def left(self, over_cap: set[str]) -> list:
        out = []
        for point, items in self.group:
            key = point.key()
            todo = [it for it in items if (key, *it) not in self.done]
            if todo and key not in over_cap:
                out.append((point, todo))
        return out

    def where(self) -> str:
        return self.node["hostname"] if self.node else "a node not yet known"


class RayExecutor:
    """Runs a sweep's remaining (point, items) on the joined cluster; `run` returns when every
    task ended, raising one SpecdecError for a task that failed on its own input or was lost too often."""

    def __init__(self, ray, config: SweepConfig) -> None:
        self.ray, self.config = ray, config
        self.requests = requests(config)
        nodes = ray.nodes()
        self.slots = {dtype: check_room(nodes, request) for dtype, request in self.requests.items()}

    def run(self, todo: list, results: ResultsFile, bar) -> None:
        remote = self.ray.remote(max_calls=1)(group_task)  # a fresh Ray worker per task: its cores and locks are its own
        config_dict = asdict(self.config)
        running: dict[object, Task] = {}
        over_cap: set[str] = set()

        def submit(task: Task) -> None:
            options = {**task.request.options(), "max_retries": 0, "num_returns": "streaming"}
            running[remote.options(**options).remote(config_dict, task.group)] = task

        try:
            for dtype in self.config.dtype:
                group = [t for t in todo if t[0].dtype == dtype]
                for shard in shards(group, self.slots[dtype]):
                    submit(Task(shard, self.requests[dtype]))
            while running:
                ready, _ = self.ray.wait(list(running), num_returns=1, timeout=1.0)
                for generator in ready:
                    task = running[generator]
                    try:
                        message = self.ray.get(next(generator))
                    except StopIteration:
                        del running[generator]
                        self._ended(task, over_cap, submit, bar)
                        continue
                    except self.ray.exceptions.RayError as e:  # its worker or node died
                        del running[generator]
                        self._lost(task, f"{type(e).__name__}: {first_line(e)}", over_cap, submit, bar)
                        continue
                    self._handle(task, message, results, bar, over_cap)
        finally:  # an error, Ctrl-C or SIGTERM: nothing keeps computing for a sweep that stopped
            for generator in running:
                self.ray.cancel(generator, force=True)

    @staticmethod
    def _handle(task: Task, message: Message, results: ResultsFile, bar, over_cap: set[str]) -> None:
        match message:
            case Started(node=node):
                task.node = node
            case Record(row=row):
                results.append(row)
                if row.get("status") in ("ok", "failed"):
                    task.done.add((Point.from_row(row).key(), row["id"], row.get("repeat", 0)))
            case Tick():
                bar.update()
            case OverCap(key=key, line=line):
                over_cap.add(key)
                bar.write(line)
            case Failed(line=line):
                task.error = line
            case Ended(exitcode=code):
                task.exitcode = code
            case Running() | PointDone() | Exit():
                pass  # the driver redoes what a lost task had not recorded, whatever it was running
            case _:
                raise unknown(message)

    def _ended(self, task: Task, over_cap: set[str], submit, bar) -> None:
        if task.error:
            raise SpecdecError(task.error)
        if task.exitcode == OVER_MEMORY_EXIT:  # its point is recorded as over the cap; the others go on
            if left := task.left(over_cap):
                submit(Task(left, task.request, task.losses))
        elif task.exitcode != 0:
            assert task.exitcode is not None  # a task's stream ends with group_task's Ended, or raises a RayError
            self._lost(task, f"its worker died: {death_line(task.exitcode)}", over_cap, submit, bar)

    def _lost(self, task: Task, why: str, over_cap: set[str], submit, bar) -> None:
        left = task.left(over_cap)
        if not left:
            return
        if task.losses >= RETRIES:
            raise SpecdecError(f"a sweep task on {task.where()} was lost {task.losses + 1} times, last: {why}; "
                               "rerun the same command to resume")
        n = sum(len(items) for _, items in left)
        bar.write(f"a sweep task on {task.where()} was lost ({why}): submitting its {n} unfinished runs again")
        submit(Task(left, task.request, task.losses + 1))


@contextmanager
def ray_executor(config: SweepConfig) -> Iterator[RayExecutor]:
    """The cluster joined and checked for room, before the results folder is touched."""
    with joined(config.ray_address) as ray:
        yield RayExecutor(ray, config)
