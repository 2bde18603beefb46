"""The server's batcher: verify requests of different sessions that are waiting together become
one forward (`specdec.batching`).

Requests queue on the event loop. When the compute thread is free the batcher takes the oldest
request, then every request already queued, and, with a window > 0, waits up to `window_s` more for
others (`max_batch` requests at most). A window of 0 adds no latency: batches form only from
requests that queued while the previous forward ran. A batch runs as one forward per group of
similar block lengths (`specdec.batching`). Each forward is logged (rows, tokens, seconds): the
per-batch cost curve the fleet report draws.
"""
from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable

import torch

from specdec.backends.base import Backend
from specdec.batching import Forward, Row, RowFailed, verify_rows
from specdec.cloud import Verdict
from specdec.errors import SpecdecError


LOG_ENTRIES = 100_000  # forwards kept for `stats` (a fleet level reads its own as it ends)
YIELDS = 3  # event-loop turns between answering a batch and taking the next (future -> coroutine -> queue)


class Stopped(SpecdecError):
    """The server is shutting down: a request queued or in its forward gets this instead of a verdict."""


@dataclass
class Request:
    row: Row
    finish: Callable[[Verdict], None]  # runs on the compute thread right after the forward (accept, crop)
    future: asyncio.Future
    owner: str = ""  # the client address the request came from: `stats` shows a client its own forwards
    queued: float = field(default_factory=time.perf_counter)


@dataclass(frozen=True)
class Served:
    """What one request got: its verdict and what it waited for."""

    verdict: Verdict
    queue_s: float  # queued -> its forward began
    compute_s: float  # its forward began -> its batch was decided and cropped (shared with the rows beside it)
    batch_rows: int  # rows in its forward


class Batcher:
    def __init__(self, backend: Backend, compute: ThreadPoolExecutor, max_batch: int = 16, window_s: float = 0.0) -> None:
        self.backend, self.compute, self.max_batch, self.window_s = backend, compute, max_batch, window_s
        self.queue: asyncio.Queue[Request] = asyncio.Queue()
        # One entry per forward: t_s (since start), rows, tokens, max_block, positions, forward_s, batch
        # (requests taken together). The newest LOG_ENTRIES only: a long-lived server must not grow.
        self.log: deque[dict] = deque(maxlen=LOG_ENTRIES)
        self.owners: deque[frozenset[str]] = deque(maxlen=LOG_ENTRIES)  # per entry: the clients in that forward
        self.logged = 0  # entries ever logged: entry i is log[i - (logged - len(log))] while kept
        self.started = time.perf_counter()
        self.taken: list[Request] = []  # the batch being collected or on the compute thread now
        self.stopped: str | None = None  # why no request is taken any more

    async def submit(self, row: Row, finish: Callable[[Verdict], None], owner: str = "") -> Served:
        if self.stopped:
            raise Stopped(self.stopped)
        request = Request(row, finish, asyncio.get_running_loop().create_future(), owner)
        await self.queue.put(request)
        return await request.future

    def stop(self, reason: str) -> None:
        """Shutting down (the `run` task is cancelled beside this): every request queued or in the
        forward now gets `Stopped`, so no handler waits for a verdict that will never come."""
        self.stopped = reason
        pending = list(self.taken)
        while not self.queue.empty():
            pending.append(self.queue.get_nowait())
        for request in pending:
            if not request.future.done():
                request.future.set_exception(Stopped(reason))

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = await self._collect(loop)
            if not batch:
                continue
            try:
                verdicts, forwards, ended = await loop.run_in_executor(self.compute, self._forward, batch)
            except Exception as e:  # a bug in one forward fails its requests; the server goes on
                for request in batch:
                    if not request.future.done():
                        request.future.set_exception(e)
                continue
            finally:
                self.taken = []
            for forward in forwards:
                self.logged += 1
                self.log.append({"t_s": forward.start - self.started, "rows": len(forward.rows), "tokens": forward.tokens,
                                 "max_block": forward.max_block,
                                 "positions": sum(batch[i].row.draft_tokens.numel() + 1 for i in forward.rows),  # scored
                                 "forward_s": forward.seconds, "batch": len(batch)})
                self.owners.append(frozenset(batch[i].owner for i in forward.rows))
                for i in forward.rows:
                    request, verdict = batch[i], verdicts[i]
                    if request.future.done():  # its session may have gone meanwhile
                        continue
                    if isinstance(verdict, RowFailed):  # this row alone: its neighbours got theirs
                        request.future.set_exception(verdict)
                    else:
                        request.future.set_result(Served(verdict, forward.start - request.queued,
                                                         ended - forward.start, len(forward.rows)))
            # Let the requests just answered run on to their next submit (a cloud-only session's next
            # step is immediate) before the next batch is taken: otherwise a closed loop splits into
            # cohorts that alternate, each forward carrying half of them.
            for _ in range(YIELDS):
                await asyncio.sleep(0)

    async def _collect(self, loop) -> list[Request]:
        self.taken = batch = [await self.queue.get()]
        deadline = loop.time() + self.window_s
        while len(batch) < self.max_batch:
            if not self.queue.empty():
                batch.append(self.queue.get_nowait())
                continue
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            try:
                batch.append(await asyncio.wait_for(self.queue.get(), remaining))
            except asyncio.TimeoutError:
                break
        return [r for r in batch if not r.future.done()]  # a cancelled request: its client is gone

    @torch.inference_mode()  # the accepting and cropping too: they touch inference tensors
    def entries(self, since: int, owner: str | None = None) -> tuple[list[dict], int]:
        """The entries from index `since` on (those still kept; with `owner`, only the forwards that
        served that client), and the index to ask from next."""
        first_kept = self.logged - len(self.log)
        start = min(max(since - first_kept, 0), len(self.log))  # islice takes no index past sys.maxsize
        kept = itertools.islice(zip(self.log, self.owners), start, None)
        return [entry for entry, owners in kept if owner is None or owner in owners], self.logged

    def _forward(self, batch: list[Request]) -> tuple[list[Verdict | RowFailed], list[Forward], float]:
        """The batch's forwards, verdicts (constraints, policy) and crops; and when all were done."""
        verdicts, forwards = verify_rows(self.backend, [r.row for r in batch])
        for i, (request, verdict) in enumerate(zip(batch, verdicts)):
            if isinstance(verdict, RowFailed):
                continue
            try:
                request.finish(verdict)
            except Exception as e:  # this session's accept or crop: it fails alone
                verdicts[i] = RowFailed(f"this session's verdict failed: {type(e).__name__}: {e}")
        return verdicts, forwards, time.perf_counter()
