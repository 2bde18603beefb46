"""The edge's side of the verifier protocol: a `Cloud` (see `specdec.core.cloud`) behind a server.

One persistent WebSocket per engine (its handshake is paid once, like a model load); a session is
opened lazily with the first escalated block (the `open` message travels back to back with that
verify, so it costs no extra round trip) and closed when the generation ends. Bytes are counted on
the socket itself: what crossed, WebSocket framing included.
"""
from __future__ import annotations

import socket
import ssl
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, NoReturn, TypeVar

import msgspec
import torch
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI
from websockets.sync.client import ClientConnection, connect

from specdec.backends.prompt import Prompt
from specdec.core.config import DecodeConfig, SpecConfig
from specdec.core.policies import traits
from specdec.core.processors import Constraints
from specdec.core.running import ema
from specdec.core.session import AcceptedSequence
from specdec.core.tree import TokenTree
from specdec.core.verdict import CloudLost, Verdict
from specdec.errors import ConfigError
from specdec.remote.payloads import pack_probs, pack_tensors
from specdec.remote.protocol import (
    SCHEMA,
    Close,
    Hello,
    Message,
    Open,
    ProtocolError,
    Ready,
    Refusal,
    Reply,
    UnexpectedMessage,
    VerdictReply,
    Verify,
    decode,
    encode,
    parse_address,
    within,
)

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

MAX_REPLY_MB = 16  # a ready or a verdict is bytes long: a server may not send the edge more than this
R = TypeVar("R", bound=Reply)


class CloudUnreachable(ConfigError):
    """The verifier server cannot be reached or refused us at the start: nothing was generated."""


class Counting(socket.socket):
    """A TCP socket that counts the bytes it sends and receives, and notes when bytes last arrived
    (the recv side runs on the WebSocket library's reader thread, which reads a reply as soon as it
    lands even while the edge is busy drafting ahead; int increments are atomic under the GIL).
    A mixin: CountingSocket and CountingTLSSocket put it before the socket class that does the I/O."""

    sent = 0
    received = 0
    last_arrival = 0.0  # time.perf_counter() of the last bytes read

    # The signatures of ssl.SSLSocket's (a plain socket's take the same arguments, positionally).
    def sendall(self, data: ReadableBuffer, flags: int = 0) -> None:
        super().sendall(data, flags)
        self.sent += memoryview(data).nbytes

    def recv(self, buflen: int = 1024, flags: int = 0) -> bytes:
        data = super().recv(buflen, flags)
        self.last_arrival = time.perf_counter()
        self.received += len(data)
        return data


class CountingSocket(Counting, socket.socket):
    pass


class CountingTLSSocket(Counting, ssl.SSLSocket):
    """The same counts over TLS (wss://): the WebSocket's bytes before encryption (TLS records add
    about 29 bytes each)."""


@dataclass(frozen=True)
class SessionSettings:
    """What the server needs besides the prompt: the edge's stop ids and constraint profile."""

    constraints: str = "none"
    eos_ids: tuple[int, ...] = ()


class RemoteCloud:
    def __init__(self, url: str, token: str | None = None, settings: SessionSettings = SessionSettings(),
                 timeout_s: float = 60.0, connect_timeout_s: float = 10.0, ca_file: str | None = None) -> None:
        if not timeout_s > 0 or not connect_timeout_s > 0:
            raise ConfigError(f"cloud timeouts must be > 0 seconds, got {timeout_s} and {connect_timeout_s}")
        self.url, self.token, self.settings = url, token, settings
        self.host, self.port = parse_address(url, "--cloud-url")
        # wss://: TLS, the server's certificate checked against the system's authorities (SSL_CERT_FILE
        # names others) or `ca_file` (a self-signed server's own certificate).
        self.tls: ssl.SSLContext | None = None
        if url.strip().startswith("wss://"):
            self.tls = ssl.create_default_context(cafile=ca_file)
            self.tls.sslsocket_class = CountingTLSSocket
        self.timeout_s, self.connect_timeout_s = timeout_s, connect_timeout_s
        self.ws: ClientConnection | None = None
        self.sock: Counting | None = None
        self.server: Ready | None = None  # what the server said it is (its `ready`), once connected
        self.landed: bytes | str | None = None  # a reply read early (`reply_landed`), not yet taken by `receive`
        self.handshake_s: float | None = None

    # -- connection ------------------------------------------------------------------------------
    def connect(self) -> dict:
        """Connect and handshake; returns the server's `ready` (model, vocab_size, tokenizer_sha256, ...) as a map."""
        self.close()
        try:
            plain = socket.create_connection((self.host, self.port), timeout=self.connect_timeout_s)
        except OSError as e:
            raise CloudUnreachable(
                f"cannot reach the cloud verifier at {self.url}: {e.strerror or e}; start it with "
                "`specbench serve --model MODEL` or fix --cloud-url"
            ) from None
        plain.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # small request/reply messages
        self.sock = CountingSocket(plain.family, plain.type, plain.proto, fileno=plain.detach())
        try:
            scheme = "wss" if self.tls else "ws"
            self.ws = connect(f"{scheme}://{self.host}:{self.port}/", sock=self.sock, open_timeout=self.connect_timeout_s,
                              max_size=MAX_REPLY_MB << 20, compression=None, close_timeout=1, ssl=self.tls,
                              server_hostname=self.host if self.tls else None)
            sock = self.ws.socket  # over TLS: the wrapping socket, which counts the same way
            assert isinstance(sock, Counting)  # ours, or the TLS context's sslsocket_class (CountingTLSSocket) around it
            self.sock = sock
            start = time.perf_counter()
            self.send(Hello(schema=SCHEMA, token=self.token))
            ready = self.receive(Ready, self.connect_timeout_s)
            self.handshake_s = time.perf_counter() - start  # one bare round trip: a floor for a verify's
        except ConnectionClosed as e:  # refused before our hello went out (a server at capacity closes at once)
            reason = e.rcvd.reason if e.rcvd and e.rcvd.reason else "connection lost"
            self.close()
            raise CloudUnreachable(f"the cloud verifier at {self.url} did not complete the handshake: {reason}") from None
        except (OSError, InvalidHandshake, InvalidURI, TimeoutError, CloudLost, ssl.SSLError) as e:
            self.close()
            raise CloudUnreachable(f"the cloud verifier at {self.url} did not complete the handshake: {e}") from None
        if ready.schema != SCHEMA:  # a server of another schema that took our hello all the same
            self.close()
            raise CloudUnreachable(f"the cloud verifier at {self.url} speaks schema {ready.schema}, this edge {SCHEMA}: "
                                   "run the same specbench version on both sides")
        self.server = ready
        return msgspec.structs.asdict(ready)

    @property
    def connected(self) -> bool:
        return self.ws is not None and self.ws.state.name == "OPEN"

    def close(self) -> None:
        if self.ws is not None:
            try:
                self.ws.close()
            except Exception:  # already broken: nothing left to release but the socket
                pass
        self.ws, self.sock, self.landed = None, None, None

    def _connection(self) -> ClientConnection:
        """The live WebSocket: a session exists only once `open` connected, and a lost connection ended it with
        CloudLost before anything else was sent or read on it."""
        assert self.ws is not None, f"not connected to the cloud verifier at {self.url}"
        return self.ws

    def _socket(self) -> Counting:
        """The counting socket under the live WebSocket (as `_connection`)."""
        assert self.sock is not None, f"not connected to the cloud verifier at {self.url}"
        return self.sock

    def _ready(self) -> Ready:
        """The server's `ready`, which the Cloud interface reads once connected (`connect` holds it or raises)."""
        assert self.server is not None, f"the cloud verifier at {self.url} was never connected"
        return self.server

    def send(self, message: Message) -> None:
        try:
            self._connection().send(encode(message))
        except (ConnectionClosed, OSError) as e:
            self.close()
            raise CloudLost(f"the cloud verifier at {self.url} is gone: {e}") from None

    def reply_landed(self) -> bool:
        """Has a reply arrived? Never blocks: one that has is kept for `receive`."""
        if self.landed is None:
            try:
                self.landed = self._connection().recv(timeout=0)
            except TimeoutError:
                return False
            except ConnectionClosed:
                return True  # `receive` reports it
        return True

    def receive(self, expect: type[R], timeout_s: float | None = None) -> R:
        """The next reply (one that landed already, or waited for up to `timeout_s`, default the
        cloud's timeout), decoded as `expect`. A refusal, a silence, a lost connection or a reply that
        breaks the protocol fails as a lost cloud, in one line with the reason."""
        raw, self.landed = self.landed, None
        if raw is None:
            timeout_s = self.timeout_s if timeout_s is None else timeout_s
            try:
                raw = self._connection().recv(timeout=timeout_s)
            except TimeoutError:
                self.close()
                raise CloudLost(f"no reply from the cloud verifier at {self.url} within {timeout_s:g} s") from None
            except ConnectionClosed as e:
                reason = e.rcvd.reason if e.rcvd and e.rcvd.reason else "connection lost"
                self.close()
                raise CloudLost(f"the cloud verifier at {self.url} closed the connection: {reason}") from None
        try:
            reply = decode(raw, expect, Refusal)
        except UnexpectedMessage as e:
            self.close()
            raise CloudLost(f"the cloud verifier at {self.url} sent {e.kind!r} where {expect.kind()!r} was due") from None
        except ProtocolError as e:
            self.violated(str(e))
        if isinstance(reply, Refusal):
            self.close()
            raise CloudLost(f"the cloud verifier at {self.url} refused: {reply.message}")
        assert isinstance(reply, expect)  # decode returns one of the types asked for, and it is not the refusal
        return reply

    def violated(self, reason: str) -> NoReturn:
        """A reply that breaks the protocol fails this prompt as a lost cloud would, with the reason."""
        self.close()
        raise CloudLost(f"the cloud verifier at {self.url} broke the protocol: {reason}")

    # -- the Cloud interface -----------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self._ready().vocab_size

    @property
    def accepts_audio(self) -> bool:
        return self._ready().accepts_audio

    @property
    def accepts_trees(self) -> bool:
        """The server's runtime verifies token trees (`ready.trees`; an older server's missing word: chains only)."""
        return self._ready().trees

    def open(self, prompt: Prompt, spec: SpecConfig, decode_config: DecodeConfig, constraints: Constraints, vocab: int,
             generator: torch.Generator) -> RemoteCloudSession:
        """`constraints` is the edge's copy: the server builds its own from `settings.constraints`."""
        if not self.connected:
            try:
                self.connect()
            except CloudUnreachable as e:
                raise CloudLost(str(e)) from None
        self.landed = None  # a reply an abandoned session read early is not this session's
        opening = Open(
            prompt_ids=prompt.input_ids.tolist(), max_new_tokens=decode_config.max_new_tokens,
            temperature=float(decode_config.temperature), seed=decode_config.seed, policy=spec.policy,
            accept_threshold=float(spec.accept_threshold), verifier=spec.verifier, constraints=self.settings.constraints,
            eos_ids=list(self.settings.eos_ids), vocab=vocab,
            features=pack_tensors(prompt.features) if prompt.features else None,
        )
        return RemoteCloudSession(self, opening, traits(spec.policy).samples, spec.draft_topn)


def kept_path(tree: TokenTree, reply: VerdictReply) -> tuple[int, ...]:
    """A tree's verdict's path, checked to be `accepted` nodes of the tree that was sent, root to leaf, each the
    child of the one before: a server cannot make the edge keep tokens it did not propose."""
    path = reply.path
    if path is None or len(path) != reply.accepted:
        raise ProtocolError(f"verdict.path must list the {reply.accepted} kept nodes of the tree sent, got {path}")
    for depth, node in enumerate(path):
        if not 0 <= node < tree.size or tree.parents[node] != (path[depth - 1] if depth else -1):
            raise ProtocolError(f"verdict.path {path} is no path from the root of the tree sent")
    return tuple(path)


@dataclass
class PendingVerify:
    """The block in flight: what was sent, and the socket's counts and clock when it left."""

    sent_bytes: int  # the socket's bytes out before the block (and the open with it) left
    received_bytes: int  # the socket's bytes in then
    start_s: float  # time.perf_counter() at sending
    base: int  # the edge's accepted length the block extends
    drafted: int  # its draft tokens: the verdict accepts at most these
    with_open: bool  # the session's `open` went with it (its features: once per session)
    tree: TokenTree | None = None  # the block's tree (its tokens are the nodes); None: a chain


class RemoteCloudSession:
    """One session. `server_length` is how much of the accepted sequence the server holds."""

    def __init__(self, cloud: RemoteCloud, opening: Open, send_probs: bool, topn: int | None) -> None:
        self.cloud, self.vocab = cloud, opening.vocab
        self.opening: Open | None = opening  # sent with the first verify, then None
        self.has_features = opening.features is not None
        # Expected send -> verdict time: the handshake's bare round trip until a verify is measured,
        # then the round trips so far (EMA, alpha 0.5). Drafting ahead stops at its expected end.
        self.round_trip_s = cloud.handshake_s
        self.server_length = len(opening.prompt_ids)  # the prompt goes up with `open`
        self.send_probs, self.topn = send_probs, topn
        self.compute_s = 0.0
        self.pending: PendingVerify | None = None

    def verify(self, seq: AcceptedSequence, draft_tokens: torch.Tensor, draft_probs: torch.Tensor | None) -> Verdict:
        self.send(seq, draft_tokens, draft_probs)
        return self.receive()

    def send(self, seq: AcceptedSequence, draft_tokens: torch.Tensor, draft_probs: torch.Tensor | None,
             tree: TokenTree | None = None) -> None:
        """Send a block (and, the first time, the session's `open` right before it); the verdict
        is read by `receive`, so the edge can draft meanwhile. `tree`: the tokens are its nodes (the server's
        `ready.trees` said it verifies them)."""
        cloud, sock = self.cloud, self.cloud._socket()
        self.pending = PendingVerify(sock.sent, sock.received, time.perf_counter(), seq.length, draft_tokens.numel(),
                                     with_open=self.opening is not None, tree=tree)
        if self.opening is not None:
            cloud.send(self.opening)
            self.opening = None
        # A draft-free block has no distributions: the server takes each token as a point mass.
        probs = pack_probs(draft_probs.cpu(), self.topn) if self.send_probs and draft_probs is not None else None
        cloud.send(Verify(base=seq.length, new=seq.ids[self.server_length:].tolist(), draft=draft_tokens.tolist(),
                          probs=probs, parents=None if tree is None else list(tree.parents)))

    def ready(self) -> bool:
        """Has the verdict arrived? Never blocks."""
        return self.cloud.reply_landed()

    def receive(self) -> Verdict:
        pending, sock = self.pending, self.cloud._socket()
        assert pending is not None, "receive follows send"  # CloudLink reads a verdict only for a block it sent
        reply = self.cloud.receive(VerdictReply)
        # Checked against what was sent before any of it is used: a server cannot index the edge out of range.
        try:
            within("verdict.accepted", reply.accepted, 0, pending.drafted)
            within("verdict.token", reply.token, 0, self.vocab - 1)
            path = () if pending.tree is None else kept_path(pending.tree, reply)
        except ProtocolError as e:
            self.cloud.violated(str(e))
        # Send -> the verdict's last byte on the socket: the round trip itself, even when the edge
        # was still drafting ahead when it landed (then it reads the verdict later: edge_wait_s).
        wait_s = sock.last_arrival - pending.start_s
        if wait_s:
            self.round_trip_s = ema(self.round_trip_s, wait_s)
        self.compute_s += reply.compute_s
        self.server_length = pending.base + reply.accepted
        return Verdict(
            accepted=reply.accepted, next_token=reply.token, tokens_in=reply.tokens_in,
            sent_features=pending.with_open and self.has_features,  # once per session: the server keeps them
            wire_up_bytes=sock.sent - pending.sent_bytes, wire_down_bytes=sock.received - pending.received_bytes,
            wait_s=wait_s, server_queue_s=reply.queue_s, path=path,
        )

    def rollback(self, length: int, seq: AcceptedSequence) -> None:
        assert length == self.server_length, f"server holds {self.server_length} tokens, the edge kept {length}"

    def close(self) -> None:
        if self.cloud.connected and self.opening is None:
            try:
                self.cloud.send(Close())
            except CloudLost:  # gone already: `send` closed our side
                pass
