"""`specbench link`: a shaped TCP relay (bench/measure/link.py) between an edge and a verifier server."""
from __future__ import annotations

import argparse
import asyncio
import math
import signal
import sys

from bench.core.network import PRESETS, NetworkProfile, profile
from bench.measure.link import Link
from specdec.errors import ConfigError
from specdec.remote.protocol import parse_address
from specdec.remote.server_config import is_loopback


def _duration(text: str) -> float:
    try:
        return profile(f"rtt={text},up=1gbit,down=1gbit").rtt_s
    except ConfigError:
        raise ConfigError(f"--jitter {text!r} is not a duration: write e.g. 5ms (0ms for none)") from None


def add_link_parser(sub) -> None:
    p = sub.add_parser("link", help="a shaped TCP relay (delay + bandwidth + jitter) between an edge and a server")
    p.add_argument("--listen", default="127.0.0.1:0", help="HOST:PORT to accept edges on (loopback; port 0 = free)")
    p.add_argument("--to", required=True, help="HOST:PORT of the verifier server")
    p.add_argument("--preset", choices=sorted(PRESETS), help="a network preset of `bench.core.network`")
    p.add_argument("--rtt", help="round-trip time, e.g. 50ms")
    p.add_argument("--up", help="edge -> cloud rate, e.g. 5mbit")
    p.add_argument("--down", help="cloud -> edge rate, e.g. 20mbit")
    p.add_argument("--jitter", default="0ms", help="extra one-way delay drawn uniformly in [0, J], e.g. 5ms")


def link_profile(args: argparse.Namespace) -> NetworkProfile:
    custom = [args.rtt, args.up, args.down]
    if args.preset and any(custom):
        raise ConfigError("give --preset or --rtt/--up/--down, not both")
    if args.preset:
        return profile(args.preset)
    if not all(custom):
        raise ConfigError("a link needs --preset NAME, or all of --rtt, --up and --down "
                          "(e.g. --rtt 50ms --up 5mbit --down 20mbit)")
    return profile(f"rtt={args.rtt},up={args.up},down={args.down}")


def cmd_link(args: argparse.Namespace) -> int:
    host, port = parse_address(args.listen, "--listen")
    if not is_loopback(host):
        raise ConfigError(f"--listen {args.listen}: the link accepts edges on loopback only; run it on the edge machine")
    target = parse_address(args.to, "--to")
    shape = link_profile(args)
    jitter_s = _duration(args.jitter)
    link = Link(shape, target, jitter_s)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        rates = "/".join("inf" if math.isinf(r) else f"{r / 1e6:g}mbit" for r in (shape.uplink_bps, shape.downlink_bps))
        await link.serve(host, port, stop, on_listening=lambda h, p: print(
            f"listening on {h}:{p} -> {target[0]}:{target[1]} (rtt {shape.rtt_s * 1e3:g} ms, up/down {rates}, "
            f"jitter {jitter_s * 1e3:g} ms)", flush=True))

    asyncio.run(main())
    print(f"stopped: {link.stats.connections} connections, {link.stats.up_bytes} B up, {link.stats.down_bytes} B down",
          file=sys.stderr, flush=True)
    return 0
