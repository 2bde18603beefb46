"""caps.pin_cores, the one way a process is pinned to cores: the sweep worker moves between the edge's
and the cloud's cores with it, so the threads it already has (OpenMP's pool among them) must move too,
and the thread pools must shrink to the cores."""
import os
import threading

import torch

from bench.measure.caps import pin_cores

POOL_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def thread_affinities() -> set[tuple[int, ...]]:
    return {tuple(sorted(os.sched_getaffinity(int(tid)))) for tid in os.listdir("/proc/self/task")}


def test_pin_cores_moves_every_existing_thread_and_sizes_the_pools():
    before, torch_threads = sorted(os.sched_getaffinity(0)), torch.get_num_threads()
    env = {v: os.environ.get(v) for v in POOL_VARS}
    started, stop = threading.Event(), threading.Event()
    waiting = threading.Thread(target=lambda: (started.set(), stop.wait()))
    waiting.start()
    started.wait()
    try:
        pin_cores([before[-1]])
        assert thread_affinities() == {(before[-1],)}  # the waiting thread too, not only the caller
        assert [os.environ[v] for v in POOL_VARS] == ["1", "1"]
        assert torch.get_num_threads() == 1
    finally:
        stop.set()
        waiting.join()
        for tid in os.listdir("/proc/self/task"):
            try:
                os.sched_setaffinity(int(tid), before)
            except OSError:
                pass
        torch.set_num_threads(torch_threads)
        for var, value in env.items():
            if value is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = value
