"""The sweep worker's messages (bench/measure/sweep/messages.py): each kind survives pickling (a multiprocessing
queue, Ray's object store), each reaches its effect in the local sweep's reader (sweep.py's `_follow`) and the
cluster's (cluster.py's `_handle`), the worker's own producers send the typed ones, and a message a reader does
not know (a tuple, as an older worker sent) is refused in one line. Fake workers only: no process, no model."""
import pickle
import signal
import typing

import pytest

from bench.core.point import Point
from bench.core.records import ResultsFile
from bench.measure.sweep import messages
from bench.measure.sweep.cluster import RayExecutor, Request, Task
from bench.measure.sweep.messages import Ended, Exit, Failed, OverCap, PointDone, Record, Running, Started, Tick, is_exit
from bench.measure.sweep.sweep import _follow
from bench.measure.sweep.worker import StreamedResults, exit_worker
from specdec.errors import SpecdecError

POINT = Point(mode="spec", k=2, entropy_threshold=0.0, policy="greedy", drafter="model", edge_runtime="torch",
              cloud_runtime="torch", dtype="float32", prompts="p")
KEY = POINT.key()
SAID = "spec k=2 thr=0 policy=greedy drafter=model edge torch → cloud torch on prompt p0"
ONE_OF_EACH = [Running(KEY, "p0", 1, SAID), Tick(), PointDone(KEY), OverCap(KEY, "edge RSS 2.00 GiB over the 1 GiB cap"),
               Failed("model 'x' not found"), Exit(), Record({"id": "p0", "status": "ok", "tokens": [1, 2]}),
               Started({"hostname": "node-1"}, 4242), Ended(-11)]


class Bar:
    """tqdm's part the readers use."""

    def __init__(self) -> None:
        self.ticks, self.lines = 0, []

    def update(self) -> None:
        self.ticks += 1

    def write(self, line: str) -> None:
        self.lines.append(line)


class Worker:
    """WorkerProcess's part `_follow` uses: these messages, then this exit code."""

    def __init__(self, said: list, exitcode: int = 0) -> None:
        self.said, self.exitcode = said, exitcode

    def messages(self, last):
        for message in self.said:
            yield message
            if last(message):
                return

    def wait(self) -> int:
        return self.exitcode


class Queue(list):
    put = list.append


def test_every_kind_is_listed_once_and_round_trips_through_pickle():
    assert {type(m) for m in ONE_OF_EACH} == set(typing.get_args(messages.Message))
    for message in ONE_OF_EACH:
        assert pickle.loads(pickle.dumps(message)) == message


@pytest.mark.parametrize("reader", ["local", "cluster"])
@pytest.mark.parametrize("message", [("tick",), "exit", None], ids=["a tuple", "a string", "None"])
def test_a_message_the_reader_does_not_know_is_refused_in_one_line(tmp_path, reader, message):
    with pytest.raises(SpecdecError) as refused:
        if reader == "local":
            _follow(Worker([message, Exit()]), Bar(), [(POINT, [("p0", 0)])], ResultsFile(tmp_path / "r.jsonl"))
        else:
            RayExecutor._handle(task(), message, ResultsFile(tmp_path / "r.jsonl"), Bar(), set())
    line = str(refused.value)
    assert f"unknown type {type(message).__name__}:" in line and "\n" not in line


def test_the_local_reader_finishes_points_moves_the_bar_and_stops_at_exit(tmp_path):
    other = Point(mode="edge", edge_runtime="torch", dtype="float32", prompts="p").key()
    said = [Running(KEY, "p0", 0, SAID + " (its warm-up)"), Running(KEY, "p0", 0, SAID), Tick(), PointDone(KEY),
            OverCap(other, "over the cap"), Exit(), Tick()]  # (nothing after Exit is read)
    bar = Bar()
    finished = _follow(Worker(said), bar, [(POINT, [("p0", 0)])], ResultsFile(tmp_path / "r.jsonl"))
    assert finished == {KEY, other} and bar.ticks == 1 and bar.lines == ["over the cap"]


def test_the_local_reader_raises_the_workers_failure(tmp_path):
    with pytest.raises(SpecdecError, match=r"^model 'x' not found$"):
        _follow(Worker([Failed("model 'x' not found"), Exit()], exitcode=1), Bar(), [], ResultsFile(tmp_path / "r.jsonl"))


def test_a_crash_is_recorded_against_the_last_running_without_its_tick(tmp_path):
    results = ResultsFile(tmp_path / "r.jsonl")
    said = [Running(KEY, "p0", 0, SAID), Tick(), Running(KEY, "p1", 1, SAID.replace("p0", "p1"))]
    assert _follow(Worker(said, exitcode=-signal.SIGSEGV), Bar(), [(POINT, [("p0", 0), ("p1", 1)])], results) == set()
    [row] = results.read()
    assert (row["id"], row["repeat"], row["status"]) == ("p1", 1, "crashed")
    assert row["error"] == f"a native crash (SIGSEGV) in torch while running {SAID.replace('p0', 'p1')}"


def task() -> Task:
    return Task([(POINT, [("p0", 0), ("p1", 0)])], Request(cpus=1, memory_bytes=0, what="the float32 points"))


def test_the_cluster_reader_keeps_each_kinds_effect(tmp_path):
    results, bar, over_cap, running = ResultsFile(tmp_path / "r.jsonl"), Bar(), set(), task()
    row = {"id": "p0", **POINT.record(sweep=True), "repeat": 0, "status": "ok"}
    for message in [Started({"hostname": "node-1"}, 4242), Running(KEY, "p0", 0, SAID), Record(row), Tick(),
                    PointDone(KEY), OverCap(KEY, "over the cap"), Failed("broke"), Exit(), Ended(-9)]:
        RayExecutor._handle(running, message, results, bar, over_cap)
    assert running.where() == "node-1" and results.read() == [row] and running.done == {(KEY, "p0", 0)}
    assert bar.ticks == 1 and bar.lines == ["over the cap"] and over_cap == {KEY}
    assert (running.error, running.exitcode) == ("broke", -9)
    assert running.left(set()) == [(POINT, [("p1", 0)])]  # what a resubmission would run


def test_the_workers_producers_send_typed_messages():
    queue = Queue()
    StreamedResults(queue).append({"id": "p0", "status": "ok"})
    with pytest.raises(SystemExit):
        exit_worker(queue, 0)
    assert queue == [Record({"id": "p0", "status": "ok"}), Exit()]
    assert is_exit(queue[-1]) and not is_exit(("exit",))
