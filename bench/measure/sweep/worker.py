"""Inside a sweep worker (a fresh process, CPU caps already applied): load models once, run the
group's points, append every record, police the memory cap.

Timing is interleaved: every point gets its engine first, then the prompts run outer and the points
inner (round-robin, the order rotated every prompt), so a prompt's baselines and spec points are
timed back to back and drift of the machine over minutes (another process, thermal state) hits all
points alike instead of whichever point ran during it. `--repeats R` runs that round R times.

`run_group` in parts, one concern each: `items_to_run` (resume), `Placement` (the cores a point runs on),
`build_engine` and `GroupRun.set_up` (a point's engine and the fields of its records), `GroupRun.time` (the
interleaved loop), `GroupRun.warm_up_once`, `GroupRun.watchdog` (the memory cap). What the worker says on its queue:
bench/measure/sweep/messages.py."""
from __future__ import annotations

import json
import os
import signal
import sys
import threading
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bench.core.folder import MACHINE_FILE, os_error_line
from bench.core.network import NetworkProfile, network_cost, profile
from bench.core.point import Deployment, Point, given
from bench.core.prompts import PromptRecord, load_prompts
from bench.core.records import ResultsFile, node_info
from bench.measure.caps import OVER_MEMORY_EXIT, EdgeCaps, MemoryWatchdog, pin_cores
from bench.measure.launch import bind_to_parent
from bench.measure.run import generate_one, prepare, warm_up
from bench.measure.sweep.messages import Exit, Failed, OverCap, PointDone, Record, Running, Tick
from bench.measure.sweep.sweep_config import SweepConfig, service_key
from bench.measure.trackers import reset_peak_rss
from specdec.backends.devices import reset_gpu_peaks
from specdec.core.verdict import CloudLost
from specdec.engine import Engine
from specdec.errors import InputError, SpecdecError
from specdec.models.loading import LoadedModel, LoadSettings, load
from specdec.runtime_registry import runtime_parts
from specdec.settings import KVCache, Mode


def weight_bytes(model: LoadedModel) -> int:
    """A torch model's parameters, or what llama.cpp's backend holds (its weights and KV cache)."""
    if model.backend.model is None:
        assert model.backend.memory_bytes is not None  # a backend without a torch model says what it holds
        return model.backend.memory_bytes
    return sum(p.numel() * p.element_size() for p in model.backend.model.parameters())


def block_costs(out: str | None) -> dict[tuple[str, str], dict]:
    """{(model, runtime): its verify blocks' cost in token steps} from the sweep's DIR/machine.json (the
    calibration its runtimes were chosen from); {} without one (an older folder, a cluster's node)."""
    path = Path(out) / MACHINE_FILE if out is not None else None
    if path is None or not path.is_file():
        return {}
    try:
        entries = json.loads(path.read_text(encoding="utf-8")).get("calibration", [])
    except (OSError, ValueError):
        return {}  # a damaged file costs the prior, never the sweep
    return {(e["model"], e["runtime"]): e["block_steps"] for e in entries
            if isinstance(e, dict) and not e.get("error") and isinstance(e.get("block_steps"), dict)}


class ModelCache:
    """A worker's engines' loader: one load per model and way of running it (its LoadSettings: the runtime, dtype,
    device, KV cache and captured steps, llama.cpp's extra buffers), shared by every point that runs it so: a point
    with another kv_cache gets a model of its own."""

    def __init__(self) -> None:
        self._loaded: dict[tuple, LoadedModel] = {}

    def __call__(self, name: str, settings: LoadSettings, log: Callable[[str], object] = print) -> LoadedModel:
        key = (name, *settings.identity())  # auto on the CPU and dynamic are one load
        if key not in self._loaded:
            self._loaded[key] = load(name, settings, log)
        return self._loaded[key]

    def models(self) -> list[LoadedModel]:
        return list(self._loaded.values())


@dataclass(frozen=True)
class GroupSettings:
    """What a worker runs its group of points under (worker_main builds it on the worker's machine)."""

    config: SweepConfig
    caps: EdgeCaps
    urls: dict[str, str]  # split points: {service_key: the sweep's server or link}
    cloud_ids: list[int] | None = None  # the cloud's cores, where the sweep has split or co-located points
    costs: dict[tuple[str, str], dict] = field(default_factory=dict)  # block_costs: the calibration's, or {}


class Placement:
    """The cores this process runs a point on. With `cloud_ids`, cloud-only and co-located points run on the
    cloud's (the server's machine), the rest on the edge's (this process's cores at the start): the process moves
    between them, pinned again only when a point needs the other side."""

    def __init__(self, cloud_ids: list[int] | None) -> None:
        self.cloud_ids = cloud_ids
        self.edge_ids = sorted(os.sched_getaffinity(0))
        self.pinned = self.edge_ids

    def cores(self, point: Point) -> list[int]:
        if self.cloud_ids and (point.mode == Mode.CLOUD or point.deployment == Deployment.COLOCATED):
            return self.cloud_ids
        return self.edge_ids

    def move_to(self, point: Point) -> None:
        if (wanted := self.cores(point)) != self.pinned:
            pin_cores(wanted)  # threads = cores, on each side
            self.pinned = wanted


@dataclass(frozen=True)
class TimedPoint:
    """A point ready to be timed: its engine built, its models loaded, and the fields every record of it carries."""

    point: Point
    key: str  # point.key()
    engine: Engine
    fields: dict  # its settings as the engine runs them, its network, the caps and its placement
    network: NetworkProfile
    edge: LoadedModel | None  # the edge model, whose memory the cap polices


def items_to_run(group: list, results) -> list[tuple[Point, list]]:
    """`group` ((point, [(prompt id, repeat)]) ...) less what `results` holds: a restarted worker skips that, but
    reruns a generation that crashed its predecessor (sweep.py counts the crashes)."""
    done = {(Point.from_row(r).key(), r["id"], r.get("repeat", 0))
            for r in results.read() if r.get("status") != "crashed"}
    return [(point, [(i, repeat) for i, repeat in items if (point.key(), i, repeat) not in done])
            for point, items in group]


def build_engine(settings: GroupSettings, point: Point, loader: ModelCache) -> Engine:
    """The point's engine on the worker's shared models; a spec point starts from this machine's calibrated block
    costs for its cloud's runtime (`auto` reads them)."""
    config = settings.config
    url = settings.urls.get(service_key(point))  # split points: the sweep's server or link
    engine = Engine(**asdict(config.engine_config(point, url)), spec=config.spec_config(point),
                    decode=config.decode_config(point), deploy=config.deploy_config(point), loader=loader,
                    log=lambda m: None)
    if point.mode == Mode.SPEC:
        runtime = runtime_parts(given(point.cloud_runtime, "cloud_runtime"))[-1]
        if curve := settings.costs.get((config.cloud, runtime)):
            engine.assume_block_costs(curve)
    return engine


def measured_fields(engine: Engine, point: Point) -> dict:
    """The point's settings as its engine runs them (Point.of), with where its cloud runs."""
    measured = Point.of(engine, given(point.prompts, "prompts"), point.link,
                        given(point.turns, "turns")).record(sweep=True)
    if point.deployment == Deployment.SPLIT:  # the engine reaches the cloud by URL; the sweep's server ran it so
        measured["cloud_runtime"] = point.cloud_runtime
    measured["deployment"] = point.deployment  # a co-located point's engine is in process, as inproc's
    return measured


def run_group(settings: GroupSettings, group: list, results, queue) -> None:
    """Run `group` ((point, [(prompt id, repeat)]) ...): every point's engine first, then the items interleaved
    (the module's docstring). `results`: the folder's ResultsFile here, or StreamedResults on a cluster's node;
    `queue`: what the worker says (messages.py)."""
    run = GroupRun(settings, results, queue)
    points = [(run.set_up(point, items), items) for point, items in items_to_run(group, results)]
    run.time(points)
    for timed, _ in points:
        timed.engine.close()  # hang up on the sweep's servers


class GroupRun:
    """One worker's group under way: its models (loaded once, shared by its points' engines), prompts, placement,
    the kinds of engine warmed up so far, and where its records and messages go."""

    def __init__(self, settings: GroupSettings, results, queue) -> None:
        import torch

        self.settings, self.results, self.queue = settings, results, queue
        if settings.caps.cores:
            torch.set_num_threads(settings.caps.cores)
        self.placement = Placement(settings.cloud_ids)
        settings.caps.apply_address_limit()
        self.loader = ModelCache()
        self.prompts = {name: {r.id: r for r in load_prompts(name)} for name in settings.config.prompt_sets()}
        self.warmed: set[tuple] = set()  # one untimed generation per kind of engine and placement

    def set_up(self, point: Point, items: list) -> TimedPoint:
        """The point's engine built, its models loaded and its prompts checked (run.prepare); an edge model that
        alone breaks the memory cap refused before anything runs."""
        config, caps = self.settings.config, self.settings.caps
        engine = build_engine(self.settings, point, self.loader)
        prepare(engine, [self.prompts[given(point.prompts, "prompts")][i] for i in dict.fromkeys(i for i, _ in items)])
        network = profile(config.network_of(point))
        fields = {**measured_fields(engine, point), "network": network.name, "edge_cores": caps.cores,
                  "edge_memory_gb": caps.memory_gb, "node": node_info(),
                  **placement_fields(config, self.settings.cloud_ids, self.placement.cores(point))}
        edge = engine.model("edge") if "edge" in engine.roles else None  # loaded by prepare
        if caps.memory_bytes and edge is not None:
            caps.check_reachable(weight_bytes(edge), f"edge model {config.edge!r} in {point.dtype}")
        return TimedPoint(point, point.key(), engine, fields, network, edge)

    def time(self, points: list[tuple[TimedPoint, list]]) -> None:
        """Every item of every point, interleaved; `PointDone` for a point once its last item has its record."""
        left = {timed.key: len(items) for timed, items in points}
        for key in [key for key, n in left.items() if not n]:
            self.queue.put(PointDone(key))
        for timed, (record_id, repeat) in interleaved(points):
            self.generate(timed, self.prompts[timed.point.prompts][record_id], repeat)
            left[timed.key] -= 1
            if not left[timed.key]:
                self.queue.put(PointDone(timed.key))

    def generate(self, timed: TimedPoint, record: PromptRecord, repeat: int) -> None:
        """One timed generation and its record, on the point's cores, under the memory cap, its kind's warm-up
        first. A bad sample or a lost cloud fails alone; the sweep goes on."""
        self.placement.move_to(timed.point)
        reset_peak_rss()  # points share this process now: each generation's peak is its own
        reset_gpu_peaks()
        fields = {**timed.fields, "repeat": repeat}
        with self.watchdog(timed, record.id):
            warm = self.warm_up_once(timed, record, repeat)
            # said before it runs, so a native crash in it is recorded against it (sweep.py); a Tick ends it
            self.queue.put(Running(timed.key, record.id, repeat, describe(timed.point, record.id)))
            try:
                generate_one(timed.engine, record, {**fields, **warm}, self.results,
                             after=lambda: self.queue.put(Tick()),
                             decorate=lambda row, g: row.update(network_fields(row, g, timed.network)),
                             max_audio_s=self.settings.config.max_audio_s)
            except (InputError, CloudLost) as e:
                self.results.append({"id": record.id, **fields, "status": "failed", "error": str(e)})
                self.queue.put(Tick())

    def warm_up_once(self, timed: TimedPoint, record: PromptRecord, repeat: int) -> dict:
        """One untimed generation before the first timed one of each kind of engine and placement (first-call
        costs are not speed) -> {"warm_up_s": its seconds} for the record that follows it, else {}."""
        point = timed.point
        kind = (point.mode, point.deployment, point.edge_runtime, point.cloud_runtime, point.kv_cache, point.dtype,
                point.link)
        if kind in self.warmed:
            return {}
        self.warmed.add(kind)
        self.queue.put(Running(timed.key, record.id, repeat, describe(point, record.id) + " (its warm-up)"))
        return {"warm_up_s": warm_up(timed.engine, record, self.settings.config.max_audio_s)}

    def watchdog(self, timed: TimedPoint, record_id: str) -> MemoryWatchdog | nullcontext:
        """The memory cap over one generation, warm-up included (none without a cap or an edge model). Past it the
        record says so, the sweep hears `OverCap`, and the worker leaves at once. Memory that is not the edge's
        (a cloud model sharing this process) does not count."""
        caps = self.settings.caps
        if not (caps.memory_bytes and timed.edge):
            return nullcontext()
        exempt = sum(weight_bytes(m) for m in self.loader.models() if m is not timed.edge)

        def over_cap(rss: int) -> None:
            point = timed.point
            line = (f"point {point.mode} k={point.k} thr={point.entropy_threshold} prompt {record_id}: "
                    f"edge RSS {rss / (1 << 30):.2f} GiB over the {caps.memory_gb:g} GiB cap")
            self.results.append({"id": record_id, **timed.fields, "status": "over_memory_cap", "error": line})
            self.queue.put(OverCap(timed.key, line))
            exit_worker(self.queue, OVER_MEMORY_EXIT)

        return MemoryWatchdog(caps.memory_bytes, over_cap, exempt)


class StreamedResults:
    """The records of a worker on a cluster's node: sent on its queue for the sweep's driver, the one
    writer of results.jsonl (bench/measure/sweep/cluster.py), never written on the node. The driver gives a
    task only what is not done, so there is nothing to read back."""

    def __init__(self, queue) -> None:
        self.queue = queue

    def read(self) -> list[dict]:
        return []

    def append(self, record: dict) -> None:
        self.queue.put(Record(record))


def worker_main(config_dict: dict, group: list, out: str | None, urls: dict[str, str], queue, parent: int) -> None:
    """A sweep worker process: caps first, then the group. `out`: the results folder, or None to
    stream the records to the parent (a Ray task relaying them to the sweep's driver). What it says on
    `queue`: messages.py (Running before each warm-up and generation, Tick once its record is written,
    PointDone, OverCap, Failed, and last Exit)."""
    bind_to_parent(parent)  # a sweep killed, even by SIGKILL, leaves no worker appending to its folder
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops this worker on Ctrl-C
    try:  # on a cluster's node the settings meet this machine for the first time (its cores)
        config = SweepConfig.from_mapping(config_dict)
        caps = config.caps()
    except SpecdecError as e:
        queue.put(Failed(str(e)))
        exit_worker(queue, 1)
    # the cloud's cores, read before the caps narrow this process to the edge's
    cloud_ids = (config.cloud_core_ids() or sorted(os.sched_getaffinity(0))) if config.places_cloud() else None
    caps.apply_cpu()
    results = ResultsFile(Path(out) / "results.jsonl") if out is not None else StreamedResults(queue)
    try:
        run_group(GroupSettings(config, caps, urls, cloud_ids, block_costs(out)), group, results, queue)
    except Exception as e:
        line = str(e) if isinstance(e, SpecdecError) else os_error_line(e) if isinstance(e, OSError) else \
            f"{type(e).__name__}: {e}"
        queue.put(Failed(line))
        exit_worker(queue, 1)
    exit_worker(queue, 0)


def describe(point: Point, prompt_id: str) -> str:
    """What a generation runs, for a crash's line: `spec k=4 thr=0 policy=greedy drafter=model edge
    A → cloud B on prompt edit-text-03`, `edge in A on prompt p0`."""
    def text(value) -> str:
        return f"{value:g}" if isinstance(value, float) else str(value)

    if point.mode == Mode.SPEC:
        what = (f"spec k={point.k} thr={text(point.entropy_threshold)} policy={point.policy} drafter={point.drafter} "
                f"edge {point.edge_runtime} → cloud {point.cloud_runtime}")
    else:
        what = f"{point.mode} in {point.edge_runtime if point.mode == Mode.EDGE else point.cloud_runtime}"
    where = f" ({point.deployment})" if point.deployment not in (None, Deployment.INPROC) else ""
    cache = f", {point.kv_cache} KV cache" if point.kv_cache not in (None, KVCache.AUTO) and point.caches_here() else ""
    return f"{what}{cache}{where} on prompt {prompt_id}"


def worker_runtimes(point: Point) -> list[str]:
    """The runtimes that run inside the worker at `point`: a crash there is in one of them (a split
    point's cloud runs in the server, not here)."""
    edge = [point.edge_runtime] if point.mode != Mode.CLOUD else []
    cloud = [point.cloud_runtime] if point.mode != Mode.EDGE and point.deployment != Deployment.SPLIT else []
    return [runtime for runtime in dict.fromkeys(edge + cloud) if runtime is not None]


def placement_fields(config, cloud_ids: list[int] | None, cores: list[int]) -> dict:
    """Where a record ran, in every record of a sweep: `cores` (this process's cores for the point),
    and for a sweep with split points `split_cores` (disjoint: the edge and the server had cores of
    their own; shared: they competed for them) and `cloud_cores` (the server's and co-located points')."""
    return {"cores": ",".join(map(str, cores)), "split_cores": config.split_cores if cloud_ids else None,
            "cloud_cores": ",".join(map(str, cloud_ids)) if cloud_ids else None}


def interleaved(points: list[tuple]) -> list[tuple]:
    """(point, ..., item) in round-robin order: the j-th item of every point, then the (j+1)-th; the
    points' order rotates with j, so no point is always timed first after another's prompt."""
    order = []
    for j in range(max((len(p[-1]) for p in points), default=0)):
        shift = j % len(points)
        for p in points[shift:] + points[:shift]:
            if j < len(p[-1]):
                order.append((*p[:-1], p[-1][j]))
    return order


def network_fields(row: dict, generation, network) -> dict:
    cost = network_cost(row["trace"], network, generation.features_bytes)
    return {
        "network_s": cost.latency_s, "uplink_bytes": cost.uplink_bytes, "downlink_bytes": cost.downlink_bytes,
        "latency_with_network_s": row["latency_s"] + cost.latency_s,
    }


def exit_worker(queue, code: int) -> None:
    """Say goodbye and leave. A multiprocessing.Queue's feeder thread must flush first (launch.py's
    SimpleQueue has none: the message is in the pipe once put). From the main thread the
    worker leaves through SystemExit, so multiprocessing's bootstrap runs this process's finalizers:
    a semaphore made here (tqdm's lock, created while transformers loads a model) is unlinked, where
    os._exit left it to the resource tracker's "leaked semaphore objects" warning at the end of every
    sweep. The memory watchdog's thread (over the cap) cannot raise into the main thread: it leaves at
    once with os._exit."""
    queue.put(Exit())
    if hasattr(queue, "join_thread"):
        queue.close()
        queue.join_thread()
    if threading.current_thread() is threading.main_thread():
        sys.exit(code)
    os._exit(code)
