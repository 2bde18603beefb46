"""The shaped link (`specbench link`): RTT and throughput through it match the setting, byte order
holds, and the CLI refuses what it cannot do.

Bounds here are on the shaping itself, not on our code's speed: the relay holds every chunk for at
least its serialization time plus half the RTT, so the lower bounds are exact; the upper bounds
are loose (2x + 0.1 s) and only catch a relay that ignores its setting. Both depend on the wall
clock of a machine that may be busy: they are `timing` tests, run by .ci/run on their own."""
from __future__ import annotations

import asyncio
import socket
import statistics
import threading
import time

import pytest

from bench.cli import main
from bench.core.network import profile
from bench.measure.link import BackgroundLink, Direction

RTT_S = 0.040
UP_BPS, DOWN_BPS = 8e6, 16e6


class EchoServer:
    """Loopback TCP server: echoes every byte back (ping-pong), or with `sink=N` swallows N bytes and
    answers one byte (upstream throughput)."""

    def __init__(self) -> None:
        self.ready = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    async def _handle(self, reader, writer) -> None:
        header = await reader.readexactly(9)
        mode, size = header[:1], int(header[1:])
        if mode == b"e":
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        else:
            await reader.readexactly(size)
            writer.write(b"!")
            await writer.drain()
        writer.close()

    async def _main(self) -> None:
        self.loop, self.stop = asyncio.get_running_loop(), asyncio.Event()
        server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        self.ready.set()
        async with server:
            await self.stop.wait()

    def __enter__(self):
        self.thread.start()
        self.ready.wait(10)
        return ("127.0.0.1", self.port)

    def __exit__(self, *exc):
        self.loop.call_soon_threadsafe(self.stop.set)
        self.thread.join(10)


def connect(url: str) -> socket.socket:
    host, port = url.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=10)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        data += sock.recv(n - len(data))
    return data


@pytest.fixture(scope="module")
def shaped():
    with EchoServer() as target, BackgroundLink(profile(f"rtt={RTT_S * 1e3:g}ms,up=8mbit,down=16mbit"), target) as url:
        yield url


@pytest.mark.timing
def test_round_trip_time_matches_the_setting(shaped):
    sock = connect(shaped)
    sock.sendall(b"e00000000")
    rtts = []
    for i in range(8):
        start = time.perf_counter()
        sock.sendall(bytes([i]))
        assert recv_exactly(sock, 1) == bytes([i])
        rtts.append(time.perf_counter() - start)
    sock.close()
    assert min(rtts) >= RTT_S
    assert statistics.median(rtts) <= 2 * RTT_S + 0.1


@pytest.mark.timing
def test_upstream_throughput_matches_the_rate(shaped):
    size = 200_000
    sock = connect(shaped)
    start = time.perf_counter()
    sock.sendall(b"s" + str(size).zfill(8).encode() + bytes(size))
    assert recv_exactly(sock, 1) == b"!"
    elapsed = time.perf_counter() - start
    sock.close()
    expected = RTT_S + 8 * (size + 9) / UP_BPS  # serialization + one way up + one way down
    assert elapsed >= expected * 0.99
    assert elapsed <= 2 * expected + 0.1


def test_bytes_arrive_in_order_with_jitter():
    with EchoServer() as target, BackgroundLink(profile("rtt=10ms,up=50mbit,down=50mbit"), target, jitter_s=0.02) as url:
        sock = connect(url)
        sock.sendall(b"e00000000")
        payload = bytes(range(256)) * 400
        for start in range(0, len(payload), 1000):  # many small writes, each delayed by its own jitter
            sock.sendall(payload[start:start + 1000])
        assert recv_exactly(sock, len(payload)) == payload
        sock.close()


def test_a_direction_queues_bytes_behind_earlier_ones():
    """Two chunks read at once leave one after the other: the second waits for the first's bits."""
    up = Direction(rate_bps=8000.0, delay_s=0.1)  # 1 byte per ms
    assert up.schedule(1000, now=0.0) == pytest.approx(1.1)
    assert up.schedule(1000, now=0.0) == pytest.approx(2.1)
    assert up.schedule(10, now=5.0) == pytest.approx(5.11)  # an idle bucket starts afresh


@pytest.mark.parametrize("args, message", [
    (["--to", "127.0.0.1:1"], "a link needs --preset NAME, or all of --rtt, --up and --down"),
    (["--to", "127.0.0.1:1", "--preset", "4g", "--rtt", "5ms"], "give --preset or --rtt/--up/--down, not both"),
    (["--to", "nowhere"], "--to 'nowhere' is not HOST:PORT"),
    (["--to", "127.0.0.1:1", "--preset", "4g", "--listen", "0.0.0.0:0"], "accepts edges on loopback only"),
    (["--to", "127.0.0.1:1", "--rtt", "5 parsecs", "--up", "1mbit", "--down", "1mbit"], "bad rtt value"),
])
def test_bad_link_arguments_are_one_line(args, message, capsys):
    assert main(["link", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and err.startswith("error: ")
