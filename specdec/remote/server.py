"""`specbench serve`: the cloud verifier as a server process.

One asyncio loop speaks the protocol (`specdec.remote.protocol`) on any number of WebSocket
connections; every model forward runs on ONE compute thread, so requests queue for the model and
the time they wait is measured apart from the time they compute. Requests of different sessions
that wait together run as one batched forward (`specdec.remote.batcher`). A session can also ask
the server to generate every token itself (`generate`): cloud-only serving, batched the same way,
the baseline a fleet is compared with. Sessions are bounded: at most
`max_sessions` open at once (one more is refused with the reason), each freed on `close`, when its
connection ends, or after `session_ttl_s` without a message.
"""
from __future__ import annotations

import asyncio
import hmac
import ipaddress
import logging
import signal
import ssl
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import torch
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.protocol import State

from specdec.backends.base import Prompt
from specdec.core.shared_forward import BatchRow, RowFailed
from specdec.core.cloud import LocalCloudSession
from specdec.core.verdict import Verdict
from specdec.core.config import CONSTRAINT_PROFILES, DecodeConfig, SpecConfig
from specdec.errors import ConfigError, SpecdecError
from specdec.models.loading import LoadedModel
from specdec.core.policies import POLICIES
from specdec.constraint_profiles import build_constraints
from specdec.remote.background import Background
from specdec.remote.batcher import Batcher, Stopped
from specdec.remote.protocol import (
    MAX_DRAFT_TOKENS, OPEN_FIELDS, SCHEMA, ProtocolError, decode, encode, field as get, token_ids,
    tokenizer_sha256, unpack_probs, unpack_tensors,
)
from specdec.core.session import AcceptedSequence
from specdec.core.verifier import VERIFIERS

# The server's sampling stream must not be the edge's: seeding both with the same seed would feed
# the acceptance test the very uniforms that drew the draft tokens.
CLOUD_SEED_OFFSET = 0x9E3779B9
SEED_RANGE = 1 << 64  # torch seeds are 64-bit: the cloud's seed wraps instead of overflowing
SHUTDOWN_ANSWER_POLLS = 200  # 10 ms each: at most 2 s for requests in flight to get their error verdict
SHUTDOWN = "the server is shutting down (SIGTERM or SIGINT): retry against a running server"
INTERNAL = "the server failed on this session (its log has the details): retry, or report it with that log"
logger = logging.getLogger("specbench.serve")


@dataclass(frozen=True)
class ServeConfig:
    host: str = field(default="127.0.0.1", metadata={"help": "address to bind; anything but loopback needs --token-file"})
    port: int = field(default=0, metadata={"help": "TCP port; 0 picks a free one"})
    max_sessions: int = field(default=16, metadata={"help": "open sessions at most; one more is refused"})
    session_ttl_s: float = field(default=300.0, metadata={"help": "free a session after this many idle seconds"})
    max_message_mb: float = field(default=64.0, metadata={"help": "largest message accepted (MiB)"})
    token: str | None = field(default=None, metadata={"help": "shared secret every session must present"})
    max_batch: int = field(default=16, metadata={"help": "verify requests of different sessions run as one forward, at most this many (1: unbatched)"})
    batch_window_ms: float = field(default=0.0, metadata={"help": "wait this long for more requests before a forward (0: batch only what already queued)"})
    max_connections: int = field(default=256, metadata={"help": "open connections at most; one more is refused at once"})
    idle_timeout_s: float = field(default=30.0, metadata={"help": "close a connection that holds no session after this many idle seconds"})
    max_sessions_per_client: int | None = field(default=None, metadata={"help": "open sessions per client address at most (default: --max-sessions)"})
    share_stats: bool = field(default=False, metadata={"help": "`stats` shows every client the whole batch log (default: "
                                                              "only the forwards that served the asking client's address)"})
    tls_cert: str | None = field(default=None, metadata={"help": "PEM certificate: serve wss:// (TLS) instead of ws://"})
    tls_key: str | None = field(default=None, metadata={"help": "PEM private key of --tls-cert"})
    hello_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"port must be in [0, 65535], got {self.port}")
        if self.max_sessions < 1:
            raise ConfigError(f"max_sessions must be >= 1, got {self.max_sessions}")
        if not self.session_ttl_s > 0:
            raise ConfigError(f"session_ttl_s must be > 0 seconds, got {self.session_ttl_s}")
        if self.max_connections < 1:
            raise ConfigError(f"max_connections must be >= 1, got {self.max_connections}")
        if not self.idle_timeout_s > 0:
            raise ConfigError(f"idle_timeout_s must be > 0 seconds, got {self.idle_timeout_s}")
        if self.max_sessions_per_client is not None and self.max_sessions_per_client < 1:
            raise ConfigError(f"max_sessions_per_client must be >= 1 (or unset), got {self.max_sessions_per_client}")
        if self.max_batch < 1:
            raise ConfigError(f"max_batch must be >= 1 (1 = unbatched), got {self.max_batch}")
        if not 0 <= self.batch_window_ms <= 1000:
            raise ConfigError(f"batch_window_ms must be in [0, 1000] ms, got {self.batch_window_ms}")
        if not self.max_message_mb > 0:
            raise ConfigError(f"max_message_mb must be > 0, got {self.max_message_mb}")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ConfigError("TLS needs both --tls-cert and --tls-key (PEM files), or neither")
        if not is_loopback(self.host) and not self.token:
            raise ConfigError(
                f"refusing to bind {self.host}: only loopback is served without credentials; "
                "give --token-file FILE (a shared secret) or bind 127.0.0.1"
            )


def server_tls(config: ServeConfig) -> ssl.SSLContext | None:
    """The TLS context of --tls-cert/--tls-key, or None for plain ws:// (a bad file is one line)."""
    if config.tls_cert is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(config.tls_cert, config.tls_key)
    except (OSError, ssl.SSLError) as e:
        raise ConfigError(f"cannot load the TLS certificate {config.tls_cert} with key {config.tls_key}: "
                          f"{getattr(e, 'strerror', None) or e}; give PEM files that belong together") from None
    return context


def client_address(ws: ServerConnection) -> str:
    address = ws.remote_address
    return str(address[0]) if address else "unknown"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class ServerSession:
    """One edge generation on the server: a mirror of the edge's accepted sequence (the server's
    one source of truth) and the cloud session built on it."""

    def __init__(self, model: LoadedModel, message: dict) -> None:
        vocab_limit = model.backend.vocab_size
        settings = {name: get(message, name, kind) for name, kind in OPEN_FIELDS.items()}
        prompt_ids = token_ids(message, "prompt_ids", vocab_limit)
        if not prompt_ids:
            raise ProtocolError("open: prompt_ids is empty")
        if settings["policy"] not in POLICIES or settings["verifier"] not in VERIFIERS:
            raise ProtocolError(f"open: policy must be one of {tuple(POLICIES)} and verifier one of {tuple(VERIFIERS)}")
        if settings["constraints"] not in CONSTRAINT_PROFILES:
            raise ProtocolError(f"open: constraints must be one of {CONSTRAINT_PROFILES}")
        if not 1 <= settings["vocab"] <= vocab_limit:
            raise ProtocolError(f"open: vocab must be in [1, {vocab_limit}]")
        features = unpack_tensors(message["features"], "features") if message.get("features") is not None else {}
        if features and not model.backend.accepts_audio:
            raise ProtocolError(f"open: model {model.name!r} is text-only but the session carries audio features",
                                code="no_audio")
        try:
            spec = SpecConfig(k=1, policy=settings["policy"], accept_threshold=settings["accept_threshold"],
                              verifier=settings["verifier"])
            decode_config = DecodeConfig(max_new_tokens=settings["max_new_tokens"], temperature=settings["temperature"],
                                         seed=settings["seed"])
            spec.check_decoding(decode_config)
        except SpecdecError as e:
            raise ProtocolError(f"open: {e}") from None
        limit = model.max_positions
        if limit is not None and len(prompt_ids) + decode_config.max_new_tokens > limit:
            raise ProtocolError(f"open: a prompt of {len(prompt_ids)} tokens and max_new_tokens "
                                f"{decode_config.max_new_tokens} need more positions than model {model.name!r} has "
                                f"({limit}): lower max_new_tokens", code="too_long")
        self.vocab, self.policy = settings["vocab"], settings["policy"]
        eos_ids = frozenset(token_ids(message, "eos_ids", self.vocab))  # the constraints index the session's vocab
        self.constraints = constraints = build_constraints(model, settings["constraints"], self.vocab, eos_ids)
        prompt = Prompt(torch.tensor(prompt_ids, dtype=torch.long), features)
        generator = torch.Generator().manual_seed((settings["seed"] + CLOUD_SEED_OFFSET) % SEED_RANGE)
        # Mirror of the edge's accepted sequence: it grows by `new` and by the accepted draft tokens.
        self.seq = AcceptedSequence(prompt.input_ids, decode_config.max_new_tokens)
        self.cloud = LocalCloudSession(model.backend, prompt, spec, decode_config, constraints, self.vocab, generator)
        self.features_pending = bool(features)
        # The last verdict's correction or bonus: the edge's next `new` carries it back, and a
        # `generate` after a verify takes it into the mirror first (the cache has seen every token of
        # the mirror then: the step needs at least one it has not).
        self.pending: int | None = None
        self.edge_takes_the_token = True  # the row in flight is a verify (its token comes back in `new`), not a `generate` step
        self.last_active = time.monotonic()

    def prepare(self, message: dict) -> BatchRow:
        """Validate a verify message and take in its unseen accepted tokens; returns the block to verify."""
        base = get(message, "base", int)
        new = token_ids(message, "new", self.vocab, self.seq.remaining)
        draft = token_ids(message, "draft", self.vocab, MAX_DRAFT_TOKENS)
        if self.seq.length + len(new) != base:
            raise ProtocolError(f"verify: base {base} != server length {self.seq.length} + {len(new)} new tokens",
                                code="out_of_sync")
        if len(new) + len(draft) > self.seq.remaining:
            raise ProtocolError(f"verify: a draft of at most {self.seq.remaining - len(new)} tokens expected, got {len(draft)}")
        if self.pending is not None and not new:  # the cache has seen every accepted token: nothing to predict from
            raise ProtocolError(f"verify: new must carry the last verdict's token ({self.pending})", code="out_of_sync")
        # No `probs`: a draft-free block, each token a point mass (specdec/core/policies/sample.py).
        probs = unpack_probs(message["probs"], len(draft), self.vocab) if message.get("probs") is not None else None
        self.seq.extend(new)
        self.pending, self.edge_takes_the_token = None, True
        return BatchRow(self.cloud.verifier, self.seq, torch.tensor(draft, dtype=torch.long), probs)

    def take_pending(self) -> int | None:
        """Before cloud-only steps: the last verdict's token joins the mirror, as the edge took it
        (None if there was none, or the budget is spent)."""
        token, self.pending = self.pending, None
        if token is None or not self.seq.remaining:
            return None
        self.seq.extend([token])
        return token

    def next_step(self) -> BatchRow:
        """A next-token step of cloud-only serving: a block with no draft."""
        no_draft = torch.empty(0, self.vocab) if self.policy == "sample" else None
        self.edge_takes_the_token = False
        return BatchRow(self.cloud.verifier, self.seq, torch.empty(0, dtype=torch.long), no_draft)

    def conclude(self, row: BatchRow, logits: torch.Tensor) -> Verdict:
        """After the forward (compute thread): the verdict from the row's logits, then the mirror
        follows it. A verify (an empty one too: a draft-free drafter's plain step): the accepted draft
        tokens join the mirror and the cache is cropped to exactly that prefix (the correction, bonus or
        next token arrives with the next `new`). A `generate` step: the token joins the mirror (the cache
        holds every position before it)."""
        verdict = self.cloud.decide(self.seq, row.draft_tokens, row.draft_probs, logits)
        if self.edge_takes_the_token:  # a verify, an empty block (a draft-free drafter's plain step) included
            self.seq.extend(row.draft_tokens[: verdict.accepted].tolist())
            self.cloud.rollback(self.seq.length, self.seq)
            self.pending = verdict.next_token
        else:
            self.seq.extend([verdict.next_token])
        return verdict


class VerifierServer:
    def __init__(self, model: LoadedModel, config: ServeConfig, log=print) -> None:
        self.model, self.config, self.log = model, config, log
        self.tls = server_tls(config)
        self.compute = ThreadPoolExecutor(max_workers=1, thread_name_prefix="verify")
        self.batcher = Batcher(model.backend, self.compute, config.max_batch, config.batch_window_ms / 1e3)
        self.sessions: dict[ServerConnection, ServerSession] = {}
        self.answering: set[ServerConnection] = set()  # connections with a request not yet answered
        self.connections = 0  # open now
        ready = dict(schema=SCHEMA, vocab_size=model.backend.vocab_size, tokenizer_sha256=tokenizer_sha256(model.tokenizer),
                     accepts_audio=model.backend.accepts_audio, runtime=model.runtime,
                     device=str(getattr(model.backend, "device", "cpu")))
        # A client on this machine gets the model's folder (`specbench score` loads the cloud from the
        # records); one elsewhere only the folder's name: the server's file layout is not its business.
        self.ready = encode("ready", model=model.name, **ready)
        self.ready_remote = encode("ready", model=Path(model.name).name if Path(model.name).is_dir() else model.name,
                                   **ready)
        self.stats = {"connections": 0, "sessions": 0, "verifies": 0, "generated": 0, "errors": 0, "refused": 0}

    async def handle(self, ws: ServerConnection) -> None:
        self.stats["connections"] += 1
        self.connections += 1
        try:
            if self.connections > self.config.max_connections:
                self.stats["refused"] += 1
                raise ProtocolError(f"server at capacity: {self.config.max_connections} connections open "
                                    "(--max-connections); retry later", code="capacity")
            hello = decode(await asyncio.wait_for(ws.recv(), self.config.hello_timeout_s), expect=("hello",))
            if hello.get("schema") != SCHEMA:
                raise ProtocolError(f"schema {hello.get('schema')!r} is not supported: this server speaks schema {SCHEMA}",
                                    code="schema")
            token = hello.get("token")
            # Compared as UTF-8 bytes: compare_digest refuses str with non-ASCII characters.
            if self.config.token and not (isinstance(token, str) and
                                          hmac.compare_digest(token.encode(), self.config.token.encode())):
                raise ProtocolError("bad or missing token: give the server's --token-file to the client", code="auth")
            await ws.send(self.ready if is_loopback(client_address(ws)) else self.ready_remote)
            while True:
                # Without a session a connection costs a slot and nothing else: it may idle only so long.
                idle_s = None if ws in self.sessions else self.config.idle_timeout_s
                try:
                    raw = await asyncio.wait_for(ws.recv(), idle_s)
                except asyncio.TimeoutError:
                    raise ProtocolError(f"no session on this connection for {idle_s:g} s: closed",
                                        code="idle") from None
                self.answering.add(ws)
                await self.dispatch(ws, decode(raw, expect=("open", "verify", "generate", "close", "stats")))
                self.answering.discard(ws)
        except (ProtocolError, SpecdecError) as e:  # the client's input or its session's own failure: one line
            code = getattr(e, "code", None) or ("shutdown" if isinstance(e, Stopped) else
                                                "verify_failed" if isinstance(e, RowFailed) else "refused")
            self.stats["errors"] += 1
            logger.warning("refused a client (%s): %s", code, e)
            await self.refuse(ws, code, str(e))
        except (ConnectionClosed, asyncio.TimeoutError):
            pass
        except Exception as e:  # a bug must not take the server down: report it, close this session only
            self.stats["errors"] += 1
            logger.exception("session failed")  # the traceback stays in the server's log, not on the wire
            await self.refuse(ws, "internal", INTERNAL)
        finally:
            self.connections -= 1
            self.answering.discard(ws)
            self.sessions.pop(ws, None)

    async def dispatch(self, ws: ServerConnection, message: dict) -> None:
        kind = message["type"]
        if kind == "stats":  # the batch log since entry `since`: the fleet's per-batch cost curve
            since = get(message, "since", int)
            if since < 0:
                raise ProtocolError(f"stats: since must be >= 0, got {since}")
            batches, following = self.batcher.entries(since, None if self.config.share_stats else client_address(ws))
            live = None  # what a soak watches return to its baseline; a remote client sees it only if shared
            if self.config.share_stats or is_loopback(client_address(ws)):
                live = {"connections": self.connections, "sessions": len(self.sessions), "tasks": len(asyncio.all_tasks())}
            await ws.send(encode("stats", batches=batches, next=following, live=live))
            return
        if kind == "close":
            self.sessions.pop(ws, None)
            return
        if kind == "open":
            if ws in self.sessions:
                raise ProtocolError("open: this connection already has a session; close it first")
            if len(self.sessions) >= self.config.max_sessions:
                self.stats["refused"] += 1
                raise ProtocolError(f"server at capacity: {len(self.sessions)} sessions open (--max-sessions "
                                    f"{self.config.max_sessions}); retry later or raise --max-sessions", code="capacity")
            limit, client = self.config.max_sessions_per_client, client_address(ws)
            if limit is not None and sum(client_address(other) == client for other in self.sessions) >= limit:
                self.stats["refused"] += 1
                raise ProtocolError(f"client {client} already holds {limit} sessions (--max-sessions-per-client "
                                    f"{limit}): close one first", code="capacity")
            self.sessions[ws] = ServerSession(self.model, message)
            self.stats["sessions"] += 1
            return
        session = self.sessions.get(ws)
        if session is None:
            raise ProtocolError("verify before open: open a session first", code="no_session")
        session.last_active = time.monotonic()
        if kind == "generate":
            await ws.send(encode("generated", **await self.generate(session, ws)))
        else:
            row = session.prepare(message)
            served = await self.batcher.submit(session, row, client_address(ws))
            self.stats["verifies"] += 1
            await ws.send(encode("verdict", accepted=served.verdict.accepted, token=served.verdict.next_token,
                                 tokens_in=served.verdict.tokens_in, compute_s=served.compute_s,
                                 queue_s=served.queue_s, batch=served.batch_rows))
        session.last_active = time.monotonic()

    async def generate(self, session: ServerSession, ws: ServerConnection) -> dict:
        """Cloud-only serving: every token a next-token step of this server, each step queued and
        batched with every other session's steps and verifies."""
        steps: list[dict] = []
        stopped_by = "max_new_tokens"
        taken = session.take_pending()  # after a verify: its correction or bonus first
        if taken is not None and session.constraints.stop.stops(taken, len(session.seq.generated)):
            stopped_by = "stop_token"
        while session.seq.remaining and stopped_by != "stop_token":
            if ws.state is not State.OPEN:  # its client is gone: stop generating for no one
                raise ConnectionClosed(None, None)
            served = await self.batcher.submit(session, session.next_step(), client_address(ws))
            steps.append({"queue_s": served.queue_s, "compute_s": served.compute_s, "batch": served.batch_rows})
            session.last_active = time.monotonic()
            if session.constraints.stop.stops(served.verdict.next_token, len(session.seq.generated)):
                stopped_by = "stop_token"
                break
        self.stats["generated"] += 1
        return {"tokens": session.seq.generated, "stopped_by": stopped_by,
                "queue_s": [s["queue_s"] for s in steps], "compute_s": [s["compute_s"] for s in steps],
                "batch": [s["batch"] for s in steps]}

    async def refuse(self, ws: ServerConnection, code: str, message: str) -> None:
        try:
            await ws.send(encode("error", code=code, message=message))
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


class BackgroundServer(Background):
    """The server on a thread of this process, for tests and benchmarks:

        with BackgroundServer(model) as url:   # "127.0.0.1:PORT"
            ...
    """

    def __init__(self, model: LoadedModel, config: ServeConfig = ServeConfig()) -> None:
        self.server = VerifierServer(model, config)
        super().__init__(lambda stop, on_listening: self.server.serve(stop, on_listening), "verifier server")
