"""One cloud, many edges: verify requests of concurrent sessions batched into one forward.

A batched row is its own forward (fp32): the backend's padded batch gives every row the logits and
cache of its single forward; through the server, 4 concurrent sessions of different prompt lengths
and k (some rolling back while others accept everything) produce, token for token and cycle for
cycle, what the unbatched server and the in-process cloud produce; cloud-only serving (`generate`)
batched the same way equals the cloud's own greedy decoding; a session that vanishes mid-batch does
not disturb the others; the session cap holds under load."""
from __future__ import annotations

import dataclasses
import threading
import time

import pytest
import torch
from websockets.sync.client import connect

from specdec.backends.hf_causal import HFCausalBackend
from specdec.backends.prompt import Prompt
from specdec.core.cloud import LocalCloud
from specdec.core.config import DecodeConfig, SpecConfig
from specdec.core.decode import autoregressive_decode, speculative_decode
from specdec.core.processors import Constraints, StopRule
from specdec.models.loading import load_model
from specdec.remote.background import BackgroundServer
from specdec.remote.client import RemoteCloud
from specdec.remote.protocol import SCHEMA
from specdec.remote.server_config import ServeConfig
from tests.wire import decode, encode

pytestmark = pytest.mark.server  # see CONTRIBUTING.md: the quick loop leaves these out

# Four sessions: prompt lengths 3..11 and k 1..5, so rows differ in past and block length.
SESSIONS = [([5, 9, 14], 1), ([7, 3, 22, 40, 12, 9, 30], 3), ([11, 2, 6, 8, 17, 19, 25, 28, 31, 33, 36], 5),
            ([4, 4, 20, 13, 27], 2)]
DECODE = DecodeConfig(max_new_tokens=18)


@pytest.fixture(scope="module")
def models(pair):
    return {role: load_model(path, "float32") for role, path in pair.items()}


def spec(k: int, verifier: str = "cached") -> SpecConfig:
    return SpecConfig(k=k, entropy_threshold=0.0, policy="greedy", verifier=verifier)


def decisions(generation) -> tuple:
    return generation.tokens, [(c.draft_tokens, c.accepted, c.extra_token, c.extra_kind) for c in generation.cycles]


def concurrently(jobs: list) -> list:
    """Run the callables on threads started together; their results in order (errors re-raised)."""
    results: list = [None] * len(jobs)
    start = threading.Barrier(len(jobs))

    def run(i: int) -> None:
        start.wait(10)
        try:
            results[i] = jobs[i]()
        except BaseException as e:
            results[i] = e

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return results


def over_server(models, url: str, ids: list[int], k: int, verifier: str = "cached"):
    remote = RemoteCloud(url)
    remote.connect()
    try:
        return speculative_decode(models["edge"].backend, remote, Prompt(torch.tensor(ids)), spec(k, verifier), DECODE)
    finally:
        remote.close()


def test_forward_batch_gives_each_row_its_single_forward(models):
    """Rows with pasts of 0..9 tokens and blocks of 1..5: logits and the new cache entries equal
    each row's own forward (fp32, up to rounding)."""
    backend = models["cloud"].backend
    assert backend.batchable
    torch.manual_seed(0)
    pasts = [torch.randint(0, 60, (n,)) for n in (0, 9, 4, 1)]
    blocks = [torch.randint(0, 60, (n,)) for n in (5, 1, 3, 2)]
    alone, batched = [], []
    for past in pasts:
        for states in (alone, batched):
            state, _ = backend.prefill(Prompt(torch.tensor([1])), past)
            states.append(state)
    expected = [backend.forward(s, b, keep=b.numel()) for s, b in zip(alone, blocks)]
    got = backend.forward_batch(batched, blocks, [b.numel() for b in blocks])
    for want, have, a, b in zip(expected, got, alone, batched):
        assert have.shape == want.shape and torch.allclose(have, want, atol=1e-5)
        assert a.length == b.length
        for la, lb in zip(a.cache.layers, b.cache.layers):
            assert torch.allclose(la.keys, lb.keys, atol=1e-5) and torch.allclose(la.values, lb.values, atol=1e-5)
    # A later single step on a batched cache still equals the unbatched one: the caches are whole.
    step = torch.tensor([3])
    for a, b in zip(alone, batched):
        assert torch.allclose(backend.forward(a, step), backend.forward(b, step), atol=1e-5)


@pytest.mark.parametrize("verifiers", [("cached",) * 4, ("cached", "stateless", "cached", "stateless")])
def test_batched_server_equals_unbatched_and_in_process(models, verifiers):
    """Stateless rows (whole context, no cache kept) batch with cached ones."""
    in_process = [speculative_decode(models["edge"].backend, LocalCloud(models["cloud"].backend),
                                     Prompt(torch.tensor(ids)), spec(k, v), DECODE)
                  for (ids, k), v in zip(SESSIONS, verifiers)]
    runs = {}
    for name, config in {"unbatched": ServeConfig(max_batch=1),
                         # A window that lasts until every open connection's row is in: the batches form however
                         # slow this machine is (under emulation a 40 ms window caught one session at a time).
                         "batched": ServeConfig(max_batch=4, batch_window_ms=1000)}.items():
        background = BackgroundServer(models["cloud"], config)
        with background as url:
            runs[name] = concurrently([lambda ids=ids, k=k, v=v: over_server(models, url, ids, k, v)
                                       for (ids, k), v in zip(SESSIONS, verifiers)])
            runs[name + "_log"] = list(background.server.batcher.log)
    assert [decisions(g) for g in runs["batched"]] == [decisions(g) for g in in_process]
    assert [decisions(g) for g in runs["unbatched"]] == [decisions(g) for g in in_process]
    # The batches really formed (the window holds until every open connection's row is in), rows of different sessions
    # shared forwards (all cached, blocks of 2-6 tokens: 3 or more a forward; a stateless row's whole context shares
    # one with the cached rows' short blocks only while it is short: 2 a forward are sure), and rows rolled back while
    # others in a batch accepted everything.
    assert max(b["batch"] for b in runs["batched_log"]) >= 3
    assert max(b["rows"] for b in runs["batched_log"]) >= (2 if "stateless" in verifiers else 3)
    assert all(b["rows"] == 1 for b in runs["unbatched_log"])
    cycles = [c for g in runs["batched"] for c in g.cycles]
    assert any(c.extra_kind == "correction" for c in cycles) and any(c.extra_kind == "bonus" for c in cycles)


def generate_remote(url: str, ids: list[int], max_new_tokens: int, eos_ids: list[int]) -> dict:
    ws = connect(f"ws://{url}/", compression=None)
    ws.send(encode("hello", schema=SCHEMA, token=None))
    assert decode(ws.recv(timeout=10))["type"] == "ready"
    ws.send(encode("open", prompt_ids=ids, features=None, max_new_tokens=max_new_tokens, temperature=0.0, seed=0,
                   policy="greedy", accept_threshold=0.1, verifier="cached", constraints="none", eos_ids=eos_ids,
                   vocab=64))
    ws.send(encode("generate"))
    reply = decode(ws.recv(timeout=60))
    ws.close()
    return reply


def test_cloud_only_serving_equals_the_clouds_own_greedy_decoding(models):
    cloud = models["cloud"]
    eos = sorted(cloud.eos_ids)
    want = [autoregressive_decode(cloud.backend, Prompt(torch.tensor(ids)), DECODE,
                                  Constraints(stop=StopRule(eos_ids=frozenset(eos)))).tokens for ids, _ in SESSIONS]
    background = BackgroundServer(cloud, ServeConfig(max_batch=4, batch_window_ms=20))
    with background as url:
        replies = concurrently([lambda ids=ids: generate_remote(url, ids, DECODE.max_new_tokens, eos)
                                for ids, _ in SESSIONS])
        log = list(background.server.batcher.log)
    assert [r["tokens"] for r in replies] == want
    assert all(len(r["queue_s"]) == len(r["tokens"]) == len(r["batch"]) for r in replies)
    assert max(b["rows"] for b in log) >= 3  # steps of different sessions shared forwards


def test_a_session_that_vanishes_mid_batch_does_not_disturb_the_others(models):
    """A client sends its block and drops the connection while its row waits in a batch window with
    the others' rows; they get exactly their unbatched verdicts, and the server serves on."""
    want = [decisions(speculative_decode(models["edge"].backend, LocalCloud(models["cloud"].backend),
                                         Prompt(torch.tensor(ids)), spec(k), DECODE)) for ids, k in SESSIONS[:3]]
    background = BackgroundServer(models["cloud"], ServeConfig(max_batch=8, batch_window_ms=150))
    with background as url:
        def vanish() -> None:
            for _ in range(3):  # three times, at different points of the others' generations
                ws = connect(f"ws://{url}/", compression=None)
                ws.send(encode("hello", schema=SCHEMA, token=None))
                decode(ws.recv(timeout=10))
                ws.send(encode("open", prompt_ids=list(range(2, 30)), features=None, max_new_tokens=8, temperature=0.0,
                               seed=0, policy="greedy", accept_threshold=0.1, verifier="cached", constraints="none",
                               eos_ids=[], vocab=64))
                ws.send(encode("verify", base=28, new=[], draft=[1, 2, 3, 4]))
                ws.socket.close()  # gone without a close frame, its row already queued
                time.sleep(0.1)

        results = concurrently([lambda ids=ids, k=k: over_server(models, url, ids, k) for ids, k in SESSIONS[:3]]
                               + [vanish])
        server = background.server
        assert [decisions(g) for g in results[:3]] == want
        deadline = time.monotonic() + 10
        while server.sessions and time.monotonic() < deadline:  # the vanished sessions are freed
            time.sleep(0.05)
        assert not server.sessions
        assert any(b["rows"] >= 2 for b in server.batcher.log)
        assert decisions(over_server(models, url, *SESSIONS[3])) == decisions(speculative_decode(
            models["edge"].backend, LocalCloud(models["cloud"].backend), Prompt(torch.tensor(SESSIONS[3][0])),
            spec(SESSIONS[3][1]), DECODE))


def test_session_cap_holds_under_load(models):
    """Two sessions generating; a third open is refused with the reason while they finish intact."""
    background = BackgroundServer(models["cloud"], ServeConfig(max_sessions=2, max_batch=4, batch_window_ms=20))
    long = DecodeConfig(max_new_tokens=300)
    with background as url:
        server = background.server

        def third() -> dict:
            deadline = time.monotonic() + 30
            while len(server.sessions) < 2 and time.monotonic() < deadline:  # both mid-generation
                time.sleep(0.002)
            ws = connect(f"ws://{url}/", compression=None)
            ws.send(encode("hello", schema=SCHEMA, token=None))
            decode(ws.recv(timeout=10))
            ws.send(encode("open", prompt_ids=[1, 2, 3], features=None, max_new_tokens=4, temperature=0.0, seed=0,
                           policy="greedy", accept_threshold=0.1, verifier="cached", constraints="none", eos_ids=[],
                           vocab=64))
            return decode(ws.recv(timeout=10))

        def loaded(ids: list[int], k: int):
            remote = RemoteCloud(url)
            remote.connect()
            try:
                return speculative_decode(models["edge"].backend, remote, Prompt(torch.tensor(ids)), spec(k), long)
            finally:
                remote.close()

        a, b, refusal = concurrently([lambda: loaded(*SESSIONS[1]), lambda: loaded(*SESSIONS[2]), third])
        assert refusal["type"] == "error" and refusal["code"] == "capacity" and "--max-sessions 2" in refusal["message"]
        assert server.stats["refused"] == 1
        for got, (ids, k) in ((a, SESSIONS[1]), (b, SESSIONS[2])):
            want = speculative_decode(models["edge"].backend, LocalCloud(models["cloud"].backend),
                                      Prompt(torch.tensor(ids)), spec(k), long)
            assert decisions(got) == decisions(want) and len(got.tokens) == 300


def test_rows_share_a_forward_only_with_blocks_of_similar_length():
    """A first call (its whole prompt) is not padded together with k + 1-token verifies."""
    from specdec.core.shared_forward import length_groups

    groups = length_groups({0: 5, 1: 120, 2: 4, 3: 5, 4: 131, 5: 1, 6: 300})
    assert sorted(sorted(g) for g in groups) == [[0, 2, 3, 5], [1, 4], [6]]
    assert length_groups({}) == [] and length_groups({7: 3}) == [[7]]


def test_cloud_only_steps_of_all_sessions_share_each_forward(models):
    """Window 0: a session's next step re-queues before the next batch is taken, so a closed loop
    of 8 sessions does not split into cohorts that alternate (it did: forwards of 7 and 1 rows)."""
    background = BackgroundServer(models["cloud"], ServeConfig(max_batch=16, batch_window_ms=0))
    ids = [[1, 2, 3 + i] for i in range(8)]
    with background as url:
        concurrently([lambda i=i: generate_remote(url, i, 30, []) for i in ids])
        rows = [b["rows"] for b in background.server.batcher.log]
    assert sum(r == 8 for r in rows) >= 0.75 * len(rows), rows


def test_the_server_keeps_no_autograd_graph_in_its_caches(models):
    """Forwards on the server's compute thread run in inference mode: a cache tensor carrying a
    grad_fn would keep its forward's activations alive for the session's life (a server carrying
    16 sessions grew past 24 GB)."""
    background = BackgroundServer(models["cloud"], ServeConfig(max_batch=4, batch_window_ms=30))
    with background as url:
        clients = []
        for i in range(3):  # three sessions, verified together, left open
            ws = connect(f"ws://{url}/", compression=None)
            ws.send(encode("hello", schema=SCHEMA, token=None))
            decode(ws.recv(timeout=10))
            ws.send(encode("open", prompt_ids=[2, 3, 4 + i], features=None, max_new_tokens=8, temperature=0.0, seed=0,
                           policy="greedy", accept_threshold=0.1, verifier="cached", constraints="none", eos_ids=[],
                           vocab=64))
            ws.send(encode("verify", base=3, new=[], draft=[5, 6, 7]))
            clients.append(ws)
        for ws in clients:
            assert decode(ws.recv(timeout=30))["type"] == "verdict"
        server = background.server
        assert max(b["rows"] for b in server.batcher.log) >= 2
        caches = [s.cloud.verifier.session.state.cache for s in server.sessions.values()]
        assert len(caches) == 3
        for cache in caches:
            for layer in cache.layers:
                assert layer.keys.grad_fn is None and not layer.keys.requires_grad and layer.keys.is_inference()
        for ws in clients:
            ws.close()


class CropWatcher(HFCausalBackend):
    """The tiny cloud, noting whether each crop of a cache ran in inference mode."""

    def __init__(self, model) -> None:
        super().__init__(model)
        self.crops_in_inference_mode: list[bool] = []

    def crop(self, state, length: int) -> None:
        self.crops_in_inference_mode.append(torch.is_inference_mode_enabled())
        super().crop(state, length)


def test_a_batched_verify_accepts_and_crops_in_inference_mode(models):
    """The crop after a batched verify runs on the compute thread inside the batcher's inference
    mode, like the forward before it: outside it, the cut of a cache's inference tensors runs
    with autograd on (the decorator meant for it once sat on the log reader instead)."""
    watcher = CropWatcher(models["cloud"].backend.model)
    background = BackgroundServer(dataclasses.replace(models["cloud"], backend=watcher),
                                  ServeConfig(max_batch=4, batch_window_ms=30))
    with background as url:
        clients = []
        for i in range(3):  # three sessions, verified together
            ws = connect(f"ws://{url}/", compression=None)
            ws.send(encode("hello", schema=SCHEMA, token=None))
            decode(ws.recv(timeout=10))
            ws.send(encode("open", prompt_ids=[2, 3, 4 + i], features=None, max_new_tokens=8, temperature=0.0, seed=0,
                           policy="greedy", accept_threshold=0.1, verifier="cached", constraints="none", eos_ids=[],
                           vocab=64))
            ws.send(encode("verify", base=3, new=[], draft=[5, 6, 7]))
            clients.append(ws)
        for ws in clients:
            assert decode(ws.recv(timeout=30))["type"] == "verdict"
        assert max(b["rows"] for b in background.server.batcher.log) >= 2  # the batched path ran
        for ws in clients:
            ws.close()
    assert len(watcher.crops_in_inference_mode) == 3, watcher.crops_in_inference_mode  # one per verify
    assert all(watcher.crops_in_inference_mode), watcher.crops_in_inference_mode


def test_the_batch_log_keeps_the_newest_entries_and_their_indices():
    """A long-lived server keeps a bounded log; `stats since=i` still means entry i."""
    from collections import deque
    from concurrent.futures import ThreadPoolExecutor

    from specdec.remote.batcher import Batcher

    batcher = Batcher(backend=None, compute=ThreadPoolExecutor(max_workers=1))
    batcher.log, batcher.owners = deque(maxlen=3), deque(maxlen=3)
    for i in range(5):
        batcher.logged += 1
        batcher.log.append({"i": i})
        batcher.owners.append(frozenset({"10.0.0.1"} if i % 2 else {"10.0.0.2", "10.0.0.3"}))
    assert batcher.entries(0) == ([{"i": 2}, {"i": 3}, {"i": 4}], 5)  # 0 and 1 are gone
    assert batcher.entries(4) == ([{"i": 4}], 5) and batcher.entries(5) == ([], 5) and batcher.entries(1 << 40) == ([], 5)
    # A client sees only the forwards that served it (unless the server shares the log).
    assert batcher.entries(0, "10.0.0.1") == ([{"i": 3}], 5) and batcher.entries(0, "10.0.0.3") == ([{"i": 2}, {"i": 4}], 5)
    assert batcher.entries(0, "10.0.0.9") == ([], 5)
    batcher.compute.shutdown()


def test_a_batch_window_closes_once_every_open_connection_has_a_row_in():
    """No other row can come, so the window does not run on: with two connections open and both rows queued, a batch
    of the two is taken at once (a window of 1,000 s would otherwise run out first: the wait_for below would time
    out); a third connection lets a third row in."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    from specdec.remote.batcher import Batcher, QueuedRow

    open_now = [2]
    batcher = Batcher(backend=None, compute=ThreadPoolExecutor(max_workers=1), max_batch=8, window_s=1000.0,
                      senders=lambda: open_now[0])

    async def collect(rows: int) -> list:
        loop = asyncio.get_running_loop()
        for i in range(rows):
            batcher.queue.put_nowait(QueuedRow(session=None, row=None, future=loop.create_future(), owner=str(i)))
        return await asyncio.wait_for(batcher._collect(loop), 30)

    assert [r.owner for r in asyncio.run(collect(2))] == ["0", "1"]
    open_now[0] = 3
    assert [r.owner for r in asyncio.run(collect(3))] == ["0", "1", "2"]
    # More queued than connections counted (a session pipelining its next block): the queue is still drained.
    open_now[0] = 1
    assert len(asyncio.run(collect(4))) == 4
    batcher.compute.shutdown()
