"""`specbench link`: a real shaped link in user space (this kernel has no `netem` qdisc).

An asyncio TCP relay: every chunk read from one side is delivered to the other after its
serialization time on a token bucket (bytes * 8 / rate, queued behind earlier bytes) plus the
one-way latency (RTT / 2) plus optional jitter. Delivery times never decrease, so byte order holds
(jitter delays, it never reorders). Chunks are cut at 16 KiB so a large message streams through
the bucket instead of leaving as one lump. The presets are `bench.core.network`'s.
"""
from __future__ import annotations

import asyncio
import math
import random
from dataclasses import dataclass, field

from bench.core.network import NetworkProfile
from specdec.remote.background import Background

CHUNK_BYTES = 16 * 1024


@dataclass
class Direction:
    """One direction of the link: a token bucket and a one-way delay."""

    rate_bps: float
    delay_s: float
    jitter_s: float = 0.0
    rng: random.Random = field(default_factory=lambda: random.Random(0))

    def __post_init__(self) -> None:
        self.free_at = 0.0  # when the bucket has sent everything queued so far
        self.last_delivery = 0.0

    def schedule(self, nbytes: int, now: float) -> float:
        """When a chunk of `nbytes` read at `now` reaches the other side."""
        start = max(now, self.free_at)
        self.free_at = start + (8 * nbytes / self.rate_bps if math.isfinite(self.rate_bps) else 0.0)
        jitter = self.rng.uniform(0.0, self.jitter_s) if self.jitter_s else 0.0
        self.last_delivery = max(self.free_at + self.delay_s + jitter, self.last_delivery)
        return self.last_delivery


@dataclass
class LinkStats:
    connections: int = 0
    up_bytes: int = 0  # client -> server
    down_bytes: int = 0


class Link:
    """Relay `listen` -> `target` shaped by `profile` (+ `jitter_s` per direction)."""

    def __init__(self, profile: NetworkProfile, target: tuple[str, int], jitter_s: float = 0.0) -> None:
        self.profile, self.target, self.jitter_s = profile, target, jitter_s
        self.stats = LinkStats()
        self.writers: set[asyncio.StreamWriter] = set()  # open sockets, closed when the link stops

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, shape: Direction, counter: str) -> None:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()

        async def deliver() -> None:
            while True:
                at, data = await queue.get()
                delay = at - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                if data is None:
                    break
                writer.write(data)
                await writer.drain()
            if writer.can_write_eof():
                writer.write_eof()

        delivering = asyncio.create_task(deliver())
        try:
            while data := await reader.read(CHUNK_BYTES):
                setattr(self.stats, counter, getattr(self.stats, counter) + len(data))
                queue.put_nowait((shape.schedule(len(data), loop.time()), data))
        except ConnectionError:
            pass
        queue.put_nowait((shape.schedule(0, loop.time()), None))  # the close travels like data
        try:
            await delivering
        except ConnectionError:
            pass

    async def _relay(self, client_reader, client_writer) -> None:
        self.stats.connections += 1
        try:
            server_reader, server_writer = await asyncio.open_connection(*self.target)
        except OSError:
            client_writer.close()
            return
        self.writers |= {client_writer, server_writer}
        half_rtt = self.profile.rtt_s / 2
        up = Direction(self.profile.uplink_bps, half_rtt, self.jitter_s, random.Random(1))
        down = Direction(self.profile.downlink_bps, half_rtt, self.jitter_s, random.Random(2))
        await asyncio.gather(
            self._pump(client_reader, server_writer, up, "up_bytes"),
            self._pump(server_reader, client_writer, down, "down_bytes"),
            return_exceptions=True,
        )
        for writer in (server_writer, client_writer):
            writer.close()
            self.writers.discard(writer)

    async def serve(self, host: str, port: int, stop: asyncio.Event, on_listening=None) -> None:
        server = await asyncio.start_server(self._relay, host, port)
        bound_host, bound_port = server.sockets[0].getsockname()[:2]
        if on_listening:
            on_listening(bound_host, bound_port)
        async with server:
            await stop.wait()
        for writer in self.writers:  # connections still open: close them before their loop goes
            writer.close()


class BackgroundLink(Background):
    """The link on a thread of this process: `with BackgroundLink(profile, target) as url:`."""

    def __init__(self, profile: NetworkProfile, target: tuple[str, int], jitter_s: float = 0.0,
                 host: str = "127.0.0.1") -> None:
        self.link = Link(profile, target, jitter_s)
        super().__init__(lambda stop, on_listening: self.link.serve(host, 0, stop, on_listening), "link", 10.0)
