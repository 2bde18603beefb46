"""`specbench serve`: the cloud verifier as a server process.

One asyncio loop speaks the protocol (`specdec.remote.protocol`) on any number of WebSocket
connections; every model forward runs on ONE compute thread, so requests queue for the model and
the time they wait is measured apart from the time they compute. Requests of different sessions
that wait together run as one batched forward (`specdec.remote.batcher`). A session can also ask
the server to generate every token itself (`generate`): cloud-only serving, batched the same way,
the baseline a fleet is compared with. Sessions are bounded: at most
`max_sessions` open at once (one more is refused with the reason), each freed on `close`, when its
connection ends, or after `session_ttl_s` without a message.

This module holds a connection's life (the handshake, then each request to its handler in
`handlers.py`, a refusal as one `error` line), the TTL reaper and the shutdown; the session and its
verify/generate state machine are `server_session.py`, the settings and TLS `server_config.py`, the
server on a thread for tests `background.py`.
"""
from __future__ import annotations

import asyncio
import hmac
import logging
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import msgspec
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from specdec.backends.static_slots import server_cache
from specdec.core.shared_forward import RowFailed
from specdec.errors import SpecdecError
from specdec.models.loading import LoadedModel
from specdec.remote.batcher import Batcher, Stopped
from specdec.remote.handlers import HANDLERS
from specdec.remote.protocol import SCHEMA, Hello, ProtocolError, Ready, Refusal, decode, encode, tokenizer_sha256
from specdec.remote.server_config import ServeConfig, client_address, is_loopback, server_tls
from specdec.remote.server_session import ServerSession

SHUTDOWN_ANSWER_POLLS = 200  # 10 ms each: at most 2 s for requests in flight to get their error verdict
SHUTDOWN = "the server is shutting down (SIGTERM or SIGINT): retry against a running server"
INTERNAL = "the server failed on this session (its log has the details): retry, or report it with that log"
logger = logging.getLogger("specbench.serve")


class VerifierServer:
    def __init__(self, model: LoadedModel, config: ServeConfig, log=print) -> None:
        self.model, self.config, self.log = model, config, log
        self.tls = server_tls(config)
        self.compute = ThreadPoolExecutor(max_workers=1, thread_name_prefix="verify")
        self.sessions: dict[ServerConnection, ServerSession] = {}
        self.batcher = Batcher(model.backend, self.compute, config.max_batch, config.batch_window_ms / 1e3,
                               senders=lambda: self.connections)
        self.answering: set[ServerConnection] = set()  # connections with a request not yet answered
        self.connections = 0  # open now
        ready = Ready(schema=SCHEMA, model=model.name, vocab_size=model.backend.vocab_size,
                      tokenizer_sha256=tokenizer_sha256(model.tokenizer), accepts_audio=model.backend.accepts_audio,
                      runtime=model.runtime, device=str(model.backend.device or "cpu"), follows=config.follow_verdicts,
                      kv_cache=server_cache(model.backend), trees=model.backend.accepts_trees)
        # A client on this machine gets the model's folder (`specbench score` loads the cloud from the
        # records); one elsewhere only the folder's name: the server's file layout is not its business.
        self.ready = encode(ready)
        self.ready_remote = encode(msgspec.structs.replace(
            ready, model=Path(model.name).name if Path(model.name).is_dir() else model.name))
        self.stats = {"connections": 0, "sessions": 0, "verifies": 0, "generated": 0, "errors": 0, "refused": 0}

    async def handle(self, ws: ServerConnection) -> None:
        self.stats["connections"] += 1
        self.connections += 1
        try:
            await self.handshake(ws)
            while True:
                # Without a session a connection costs a slot and nothing else: it may idle only so long.
                idle_s = None if ws in self.sessions else self.config.idle_timeout_s
                try:
                    raw = await asyncio.wait_for(ws.recv(), idle_s)
                except TimeoutError:
                    raise ProtocolError(f"no session on this connection for {idle_s:g} s: closed",
                                        code="idle") from None
                self.answering.add(ws)
                request = decode(raw, *HANDLERS)
                await HANDLERS[type(request)](self, ws, request)
                self.answering.discard(ws)
        except (ProtocolError, SpecdecError) as e:  # the client's input or its session's own failure: one line
            code = getattr(e, "code", None) or ("shutdown" if isinstance(e, Stopped) else
                                                "verify_failed" if isinstance(e, RowFailed) else "refused")
            self.stats["errors"] += 1
            logger.warning("refused a client (%s): %s", code, e)
            await self.refuse(ws, code, str(e))
        except (TimeoutError, ConnectionClosed):
            pass
        except Exception:  # a bug must not take the server down: report it, close this session only
            self.stats["errors"] += 1
            logger.exception("session failed")  # the traceback stays in the server's log, not on the wire
            await self.refuse(ws, "internal", INTERNAL)
        finally:
            self.connections -= 1
            self.answering.discard(ws)
            self.sessions.pop(ws, None)

    async def handshake(self, ws: ServerConnection) -> None:
        """`hello` -> `ready`; refused past --max-connections, for another schema or a bad token."""
        if self.connections > self.config.max_connections:
            self.stats["refused"] += 1
            raise ProtocolError(f"server at capacity: {self.config.max_connections} connections open "
                                "(--max-connections); retry later", code="capacity")
        hello = decode(await asyncio.wait_for(ws.recv(), self.config.hello_timeout_s), Hello)
        if hello.schema != SCHEMA:
            raise ProtocolError(f"schema {hello.schema!r} is not supported: this server speaks schema {SCHEMA}", code="schema")
        # Compared as UTF-8 bytes: compare_digest refuses str with non-ASCII characters.
        if self.config.token and not (hello.token is not None and
                                      hmac.compare_digest(hello.token.encode(), self.config.token.encode())):
            raise ProtocolError("bad or missing token: give the server's --token-file to the client", code="auth")
        await ws.send(self.ready if is_loopback(client_address(ws)) else self.ready_remote)

    async def refuse(self, ws: ServerConnection, code: str, message: str) -> None:
        try:
            await ws.send(encode(Refusal(code=code, message=message)))
            await ws.close(1008, message[:120])
        except ConnectionClosed:
            pass

    async def reap(self) -> None:
        """Close connections whose session has been idle longer than the TTL."""
        while True:
            await asyncio.sleep(min(1.0, self.config.session_ttl_s / 4))
            now = time.monotonic()
            for ws, session in list(self.sessions.items()):
                if now - session.last_active > self.config.session_ttl_s:
                    self.sessions.pop(ws, None)
                    await self.refuse(ws, "expired", f"session expired after {self.config.session_ttl_s:g} s idle")

    async def serve(self, stop: asyncio.Event, on_listening=None) -> None:
        limit = int(self.config.max_message_mb * (1 << 20))
        async with serve(self.handle, self.config.host, self.config.port, max_size=limit, compression=None, ssl=self.tls,
                         ping_interval=20, ping_timeout=20, close_timeout=2) as server:
            host, port = server.sockets[0].getsockname()[:2]
            if on_listening:
                on_listening(host, port)
            tasks = [asyncio.create_task(self.reap()), asyncio.create_task(self.batcher.run())]
            await stop.wait()
            # Fail what is queued or computing before the connections close: their handlers await
            # those verdicts, and leaving this block waits for every handler (a SIGTERM with requests
            # in flight hung here). Then the connections close (1001, at most close_timeout 2 s).
            self.batcher.stop(SHUTDOWN)
            for task in tasks:
                task.cancel()
            for _ in range(SHUTDOWN_ANSWER_POLLS):  # their error verdicts go out before the close
                if not self.answering:
                    break
                await asyncio.sleep(0.01)
        self.compute.shutdown(wait=True, cancel_futures=True)


def run_server(model: LoadedModel, config: ServeConfig, announce=print) -> dict:
    """Serve until SIGTERM or SIGINT, then stop cleanly (sessions dropped, compute thread joined).
    `announce` gets the one line `listening on HOST:PORT` once the port is bound."""
    server = VerifierServer(model, config)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        await server.serve(stop, on_listening=lambda host, port: announce(f"listening on {host}:{port}"))

    logging.getLogger("websockets").setLevel(logging.CRITICAL)  # bad handshakes are the client's problem
    asyncio.run(main())
    return server.stats
