"""What the verifier server does with each request of a session, one handler per message type
(`HANDLERS`): the connection loop (server.py) decodes a message as one of the table's types and
awaits its handler. A handler answers on the connection, or raises a ProtocolError the loop turns
into one `error` line."""
from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed
from websockets.protocol import State

from specdec.models.loading import LoadedModel
from specdec.remote.batcher import Batcher
from specdec.remote.protocol import (
    Close,
    Generate,
    Generated,
    Open,
    ProtocolError,
    Request,
    StatsReply,
    StatsRequest,
    VerdictReply,
    Verify,
    encode,
)
from specdec.remote.server_config import ServeConfig, client_address, is_loopback
from specdec.remote.server_session import ServerSession


class Server(Protocol):
    """What a handler reads and changes of the server (server.py's VerifierServer)."""

    model: LoadedModel
    config: ServeConfig
    batcher: Batcher
    sessions: dict[ServerConnection, ServerSession]
    connections: int  # open now
    stats: dict[str, int]  # counts over the server's life


async def on_open(server: Server, ws: ServerConnection, opening: Open) -> None:
    if ws in server.sessions:
        raise ProtocolError("open: this connection already has a session; close it first")
    if len(server.sessions) >= server.config.max_sessions:
        server.stats["refused"] += 1
        raise ProtocolError(f"server at capacity: {len(server.sessions)} sessions open (--max-sessions "
                            f"{server.config.max_sessions}); retry later or raise --max-sessions", code="capacity")
    limit, client = server.config.max_sessions_per_client, client_address(ws)
    if limit is not None and sum(client_address(other) == client for other in server.sessions) >= limit:
        server.stats["refused"] += 1
        raise ProtocolError(f"client {client} already holds {limit} sessions (--max-sessions-per-client "
                            f"{limit}): close one first", code="capacity")
    server.sessions[ws] = ServerSession(server.model, opening)
    server.stats["sessions"] += 1


async def on_verify(server: Server, ws: ServerConnection, verify: Verify) -> None:
    session = session_of(server, ws)
    if verify.follow is not None and not server.config.follow_verdicts:
        raise ProtocolError("verify.follow: this server keeps its own verdicts; start it with --follow-verdicts to "
                            "time recorded edges on a random-weight model", code="no_follow")
    served = await server.batcher.submit(session, session.prepare(verify), client_address(ws))
    server.stats["verifies"] += 1
    await ws.send(encode(VerdictReply(accepted=served.verdict.accepted, token=served.verdict.next_token,
                                 tokens_in=served.verdict.tokens_in, compute_s=served.compute_s,
                                 queue_s=served.queue_s, batch=served.batch_rows,
                                 agreed=session.agreed,
                                 path=list(served.verdict.path) if verify.parents is not None else None)))
    session.last_active = time.monotonic()


async def on_generate(server: Server, ws: ServerConnection, _: Generate) -> None:
    """Cloud-only serving: every token a next-token step of this server, each step queued and
    batched with every other session's steps and verifies."""
    session = session_of(server, ws)
    queue_s, compute_s, batch = [], [], []
    taken = session.take_pending()  # after a verify: its correction or bonus first
    stopped = taken is not None and session.stops(taken)
    while session.seq.remaining and not stopped:
        if ws.state is not State.OPEN:  # its client is gone: stop generating for no one
            raise ConnectionClosed(None, None)
        served = await server.batcher.submit(session, session.next_step(), client_address(ws))
        queue_s.append(served.queue_s)
        compute_s.append(served.compute_s)
        batch.append(served.batch_rows)
        session.last_active = time.monotonic()
        stopped = session.stops(served.verdict.next_token)
    server.stats["generated"] += 1
    await ws.send(encode(Generated(tokens=session.seq.generated, stopped_by="stop_token" if stopped else "max_new_tokens",
                                   queue_s=queue_s, compute_s=compute_s, batch=batch)))
    session.last_active = time.monotonic()


async def on_close(server: Server, ws: ServerConnection, _: Close) -> None:
    server.sessions.pop(ws, None)


async def on_stats(server: Server, ws: ServerConnection, request: StatsRequest) -> None:
    """The batch log since entry `since` (the fleet's per-batch cost curve): the forwards that served
    this client, or every one with --share-stats; and the live counts a soak watches return to their
    baseline, for a client on this machine or when shared."""
    shared = server.config.share_stats
    batches, following = server.batcher.entries(request.since, None if shared else client_address(ws))
    live = None
    if shared or is_loopback(client_address(ws)):
        live = {"connections": server.connections, "sessions": len(server.sessions), "tasks": len(asyncio.all_tasks())}
    await ws.send(encode(StatsReply(batches=batches, next=following, live=live)))


def session_of(server: Server, ws: ServerConnection) -> ServerSession:
    session = server.sessions.get(ws)
    if session is None:
        raise ProtocolError("verify before open: open a session first", code="no_session")
    session.last_active = time.monotonic()
    return session


# A handler takes its own request class (Any here: a table cannot tie each key's class to its value's argument).
Handler = Callable[[Server, ServerConnection, Any], Awaitable[None]]
# The requests a session's connection takes after `hello`, in the order a refusal lists them.
HANDLERS: dict[type[Request], Handler] = {
    Open: on_open, Verify: on_verify, Generate: on_generate, Close: on_close, StatsRequest: on_stats,
}
