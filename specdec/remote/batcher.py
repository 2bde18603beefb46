"""The server's batcher: verify requests of different sessions that are waiting together become
one forward (`specdec.core.shared_forward`).

Requests queue on the event loop. When the compute thread is free the batcher takes the oldest
request, then every request already queued, and, with a window > 0, waits up to `window_s` more for
others (`max_batch` requests at most). A window of 0 adds no latency: batches form only from
requests that queued while the previous forward ran. A batch runs as one forward per group of
similar block lengths (`specdec.core.shared_forward`). Each forward is logged (rows, tokens, seconds): the
per-batch cost curve the fleet report draws.

One batch, on the compute thread, reads in one direction: the forwards (`batch_logits`), then each
request's session concludes from its row's logits (verdict, then its mirror and cache follow).
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol

import torch

from specdec.backends.base import Backend
from specdec.core.shared_forward import BatchRow, Forward, RowFailed, batch_logits
from specdec.core.verdict import Verdict
from specdec.errors import SpecdecError

logger = logging.getLogger("specbench.serve")
LOG_ENTRIES = 100_000  # forwards kept for `stats` (a fleet level reads its own as it ends)
YIELDS = 3  # event-loop turns between answering a batch and taking the next (future -> coroutine -> queue)


class Stopped(SpecdecError):
    """The server is shutting down: a request queued or in its forward gets this instead of a verdict."""


class Concludes(Protocol):
    def conclude(self, row: BatchRow, logits: torch.Tensor) -> Verdict:
        """On the compute thread, right after the forward: the verdict on `row` from its logits
        [n+1, V], and the session's state brought in line with it (accept, crop)."""
        ...


@dataclass
class QueuedRow:
    session: Concludes
    row: BatchRow
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
    def __init__(self, backend: Backend, compute: ThreadPoolExecutor, max_batch: int = 16, window_s: float = 0.0,
                 senders: Callable[[], int] | None = None) -> None:
        self.backend, self.compute, self.max_batch, self.window_s = backend, compute, max_batch, window_s
        # How many connections could add a row now (the server's open connections: one that has not opened its
        # session yet counts, so a row on its way is waited for): a window closes once that many rows are in, since
        # no other row can come and waiting on would only add latency. None: the window runs out or max_batch fills.
        self.senders = senders
        self.queue: asyncio.Queue[QueuedRow] = asyncio.Queue()
        # One entry per forward: t_s (since start), rows, tokens, max_block, positions, forward_s, batch
        # (requests taken together). The newest LOG_ENTRIES only: a long-lived server must not grow.
        self.log: deque[dict] = deque(maxlen=LOG_ENTRIES)
        self.owners: deque[frozenset[str]] = deque(maxlen=LOG_ENTRIES)  # per entry: the clients in that forward
        self.logged = 0  # entries ever logged: entry i is log[i - (logged - len(log))] while kept
        self.started = time.perf_counter()
        self.taken: list[QueuedRow] = []  # the batch being collected or on the compute thread now
        self.stopped: str | None = None  # why no request is taken any more

    async def submit(self, session: Concludes, row: BatchRow, owner: str = "") -> Served:
        if self.stopped:
            raise Stopped(self.stopped)
        request = QueuedRow(session, row, asyncio.get_running_loop().create_future(), owner)
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

    async def _collect(self, loop) -> list[QueuedRow]:
        self.taken = batch = [await self.queue.get()]
        deadline = loop.time() + self.window_s
        while len(batch) < self.max_batch:
            if not self.queue.empty():
                batch.append(self.queue.get_nowait())
                continue
            if self.senders is not None and len(batch) >= self.senders():
                break  # a row from every open connection is in: nobody else can send one
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            try:
                batch.append(await asyncio.wait_for(self.queue.get(), remaining))
            except TimeoutError:
                break
        return [r for r in batch if not r.future.done()]  # a cancelled request: its client is gone

    def entries(self, since: int, owner: str | None = None) -> tuple[list[dict], int]:
        """The entries from index `since` on (those still kept; with `owner`, only the forwards that
        served that client), and the index to ask from next."""
        first_kept = self.logged - len(self.log)
        start = min(max(since - first_kept, 0), len(self.log))  # islice takes no index past sys.maxsize
        kept = itertools.islice(zip(self.log, self.owners), start, None)
        return [entry for entry, owners in kept if owner is None or owner in owners], self.logged

    @torch.inference_mode()  # thread-local: entered here, on the compute thread, it covers the crops too
    def _forward(self, batch: list[QueuedRow]) -> tuple[list[Verdict | RowFailed], list[Forward], float]:
        """The batch's forwards, verdicts (constraints, policy) and crops; and when all were done.
        The crops (`conclude`) cut the caches' inference tensors: `batch_logits`' own inference
        mode ends when it returns, so this one must span them."""
        logits, forwards = batch_logits(self.backend, [r.row for r in batch])
        return [_conclude_alone(r, row_logits) for r, row_logits in zip(batch, logits)], forwards, time.perf_counter()


def _conclude_alone(request: QueuedRow, logits: torch.Tensor) -> Verdict | RowFailed:
    """One session's verdict, accept and crop; if any of it raises (a distribution that is not
    finite, a policy error) that row fails alone, its neighbours in the forward keep theirs."""
    try:
        return request.session.conclude(request.row, logits)
    except SpecdecError as e:  # one session's settings or policy must not fail the others in its batch
        return RowFailed(f"this session's verdict failed: {e}")
    except Exception:  # a bug: its traceback goes to the server's log, not to the client
        logger.exception("a session's verdict failed")
        return RowFailed("this session's verdict failed on a server bug (the server's log has it)")
