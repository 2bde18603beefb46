"""`specbench serve` (the cloud verifier as a server), `specbench link` (a shaped TCP relay) and
`specbench fleet` (many edges against one server, and cloud-only serving of as many)."""
from __future__ import annotations

import argparse
import asyncio
import math
import signal
import sys
from pathlib import Path

from bench.measure.caps import parse_cores, pin_cores
from bench.measure.fleet import run_fleet
from bench.measure.fleet_config import FleetConfig
from bench.commands.options import field_options, values
from bench.core.folder import canonical_path
from bench.measure.link import Link
from bench.core.prompts import canonical_prompts
from bench.core.network import PRESETS, NetworkProfile, profile
from specdec.config import DecodeConfig, SpecConfig
from specdec.errors import ConfigError
from specdec.models.loading import load_model
from specdec.remote.protocol import parse_address, read_token
from specdec.remote.server import ServeConfig, is_loopback, run_server


def add_serve_parser(sub) -> None:
    p = sub.add_parser("serve", help="serve a cloud model as a verifier for edge clients (`run --cloud-url`)")
    p.add_argument("--model", required=True, help="cloud model: registry alias or local directory")
    p.add_argument("--host", default=ServeConfig.host, help="address to bind (default loopback; others need --token-file)")
    p.add_argument("--port", type=int, default=ServeConfig.port, help="TCP port; 0 picks a free one (printed)")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="bfloat16")
    p.add_argument("--cores", help="pin the server to these cores, e.g. 1 or 0-3 (torch threads follow)")
    p.add_argument("--max-sessions", type=int, default=ServeConfig.max_sessions, help="open sessions at most")
    p.add_argument("--session-ttl", type=float, default=ServeConfig.session_ttl_s, help="free a session idle this many s")
    p.add_argument("--max-message-mb", type=float, default=ServeConfig.max_message_mb, help="largest message (MiB)")
    p.add_argument("--token-file", type=Path, help="file holding a shared secret every client must present")
    p.add_argument("--max-batch", type=int, default=ServeConfig.max_batch,
                   help="verify requests of different sessions run as one forward, at most this many (1: unbatched)")
    p.add_argument("--batch-window-ms", type=float, default=ServeConfig.batch_window_ms,
                   help="wait this long for more requests before a forward (default 0: batch what already queued)")


def cmd_serve(args: argparse.Namespace) -> int:
    token = read_token(args.token_file) if args.token_file else None
    config = ServeConfig(host=args.host, port=args.port, max_sessions=args.max_sessions,
                         session_ttl_s=args.session_ttl, max_message_mb=args.max_message_mb, token=token,
                         max_batch=args.max_batch, batch_window_ms=args.batch_window_ms)
    if args.cores:
        pin_cores(parse_cores(args.cores))
    model = load_model(args.model, args.dtype, log=lambda m: print(m, file=sys.stderr, flush=True))
    try:
        stats = run_server(model, config, announce=lambda line: print(line, flush=True))
    except OSError as e:  # the address: taken, or not this machine's
        raise ConfigError(f"cannot serve on {args.host}:{args.port}: {e.strerror or e}; pick another --host or --port "
                          "(--port 0 picks a free one)") from None
    print(f"stopped: {stats['sessions']} sessions, {stats['verifies']} verifies, {stats['generated']} generated, {stats['errors']} errors, "
          f"{stats['refused']} refused", file=sys.stderr, flush=True)
    return 0


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
        raise ConfigError("a link needs --preset NAME, or all of --rtt, --up and --down (e.g. --rtt 50ms --up 5mbit --down 20mbit)")
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


def add_fleet_parser(sub) -> None:
    p = sub.add_parser("fleet", help="N edges against one verifier server for each N (replayed or real), beside "
                                     "cloud-only serving of the same N: the server's capacity curve")
    p.add_argument("--out", required=True, type=Path, help="results directory (rerun to resume)")
    for cls in (FleetConfig, SpecConfig, DecodeConfig):
        for option in field_options(cls):
            option.add_to(p)


def cmd_fleet(args: argparse.Namespace) -> int:
    spec, decode = SpecConfig(**values(SpecConfig, args)), DecodeConfig(**values(DecodeConfig, args))
    config = FleetConfig(**{**values(FleetConfig, args), "prompts": canonical_prompts(args.prompts),
                            "edge": canonical_path(args.edge), "cloud": canonical_path(args.cloud),
                            "edge_replay": canonical_path(args.edge_replay), "token_file": canonical_path(args.token_file)})
    counts, summary = run_fleet(config, spec, decode, args.out)
    print(", ".join(f"{n} {status}" for status, n in sorted(counts.items())), file=sys.stderr, flush=True)
    if not summary.empty:
        columns = ["mode", "clients", "server_accepted_tokens_per_s", "edge_tokens_per_s_p50", "verify_latency_p50_s",
                   "mean_batch_size", "cloud_busy_fraction"]
        print(summary[[c for c in columns if c in summary]].to_string(index=False, float_format=lambda v: f"{v:.3g}"),
              file=sys.stderr, flush=True)
    print(f"summary: {args.out / 'summary.csv'}", file=sys.stderr, flush=True)
    return 0
