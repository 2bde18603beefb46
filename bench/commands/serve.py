"""`specbench serve`: the cloud verifier (specdec/remote/server.py) as a server for edge clients."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench.measure.caps import parse_cores, pin_cores
from specdec.backends.base import DTYPES
from specdec.backends.devices import CUDA_GRAPHS, SERVER_CACHES, check_served_cache, check_served_device
from specdec.errors import ConfigError
from specdec.models.loading import LoadSettings, load
from specdec.remote.protocol import read_token, token_file_warning
from specdec.remote.server import run_server
from specdec.remote.server_config import ServeConfig
from specdec.runtimes import RuntimeChoices, canonical_runtime, default_runtime, runtimes, served_runtime


def add_serve_parser(sub) -> None:
    p = sub.add_parser("serve", help="serve a cloud model as a verifier for edge clients (`run --cloud-url`)")
    p.add_argument("--model", required=True,
                   help="cloud model: registry alias or local directory "
                        "(arch:PATH.json: a random-weight architecture, for timing with --follow-verdicts)")
    p.add_argument("--host", default=ServeConfig.host, help="address to bind (default loopback; others need --token-file)")
    p.add_argument("--port", type=int, default=ServeConfig.port, help="TCP port; 0 picks a free one (printed)")
    p.add_argument("--dtype", choices=list(DTYPES), default="bfloat16", help="the torch runtime's dtype")
    p.add_argument("--runtime", choices=RuntimeChoices(), type=canonical_runtime,
                   help="what runs the model: " + "; ".join(f"{r.name}: {r.summary}" for r in runtimes())
                        + f". Default: the runtime a model file needs (a .gguf path's), else {default_runtime()}")
    p.add_argument("--device", "--cloud-device", default="cpu",
                   help="where the torch model runs: cpu, cuda or cuda:N (docs/gpu.md); llama.cpp and int8: cpu only")
    p.add_argument("--kv-cache", choices=SERVER_CACHES, default="auto",
                   help="the torch model's KV cache: dynamic (transformers' DynamicCache; each forward pads its rows' "
                        "caches into one), static (one preallocated cache of --max-sessions sequences, each row at "
                        "its own positions; on CUDA its forwards replay as captured graphs: docs/gpu.md) or auto "
                        "(default: static on CUDA for the decoders it runs, dynamic on the CPU)")
    p.add_argument("--cuda-graphs", choices=CUDA_GRAPHS, default="on",
                   help="on CUDA with --kv-cache static: replay forwards of up to 16 tokens as CUDA graphs (on) or "
                        "run them eagerly (off)")
    p.add_argument("--cores", help="pin the server to these cores, e.g. 1 or 0-3 (torch threads follow)")
    p.add_argument("--max-sessions", type=int, default=ServeConfig.max_sessions, help="open sessions at most")
    p.add_argument("--session-ttl", type=float, default=ServeConfig.session_ttl_s, help="free a session idle this many s")
    p.add_argument("--max-message-mb", type=float, default=ServeConfig.max_message_mb, help="largest message (MiB)")
    p.add_argument("--token-file", type=Path, help="file holding a shared secret every client must present")
    p.add_argument("--share-stats", action="store_true",
                   help="`stats` shows every client the whole batch log (default: only its own address's forwards)")
    p.add_argument("--tls-cert", help="PEM certificate: serve wss:// (TLS), as two machines need (docs/split-deployment.md)")
    p.add_argument("--tls-key", help="PEM private key of --tls-cert")
    p.add_argument("--max-connections", type=int, default=ServeConfig.max_connections,
                   help="open connections at most; one more is refused at once")
    p.add_argument("--idle-timeout", type=float, default=ServeConfig.idle_timeout_s,
                   help="close a connection that holds no session after this many idle seconds")
    p.add_argument("--max-sessions-per-client", type=int, default=None,
                   help="open sessions per client address at most (default: --max-sessions)")
    p.add_argument("--follow-verdicts", action="store_true",
                   help=ServeConfig.__dataclass_fields__["follow_verdicts"].metadata["help"])
    p.add_argument("--max-batch", type=int, default=ServeConfig.max_batch,
                   help="verify requests of different sessions run as one forward, at most this many (1: unbatched)")
    p.add_argument("--batch-window-ms", type=float, default=ServeConfig.batch_window_ms,
                   help="wait this long for more requests before a forward (default 0: batch what already queued)")


def cmd_serve(args: argparse.Namespace) -> int:
    token = read_token(args.token_file) if args.token_file else None
    if token and (warning := token_file_warning(args.token_file)):
        print(warning, file=sys.stderr, flush=True)
    config = ServeConfig(host=args.host, port=args.port, max_sessions=args.max_sessions,
                         session_ttl_s=args.session_ttl, max_message_mb=args.max_message_mb, token=token,
                         max_batch=args.max_batch, batch_window_ms=args.batch_window_ms,
                         share_stats=args.share_stats, tls_cert=args.tls_cert, tls_key=args.tls_key,
                         max_connections=args.max_connections, idle_timeout_s=args.idle_timeout,
                         max_sessions_per_client=args.max_sessions_per_client, follow_verdicts=args.follow_verdicts)
    if args.cores:
        pin_cores(parse_cores(args.cores))
    runtime = served_runtime(args.model, args.runtime)
    check_served_device(args.device, runtime)
    check_served_cache(args.kv_cache, runtime)
    # Sessions interleave: a static cache holds --max-sessions sequences (specdec/backends/static_slots.py).
    settings = LoadSettings(args.dtype, runtime, args.device, kv_cache=args.kv_cache, cuda_graphs=args.cuda_graphs,
                            sessions=config.max_sessions)
    model = load(args.model, settings, log=lambda m: print(m, file=sys.stderr, flush=True))
    try:
        stats = run_server(model, config, announce=lambda line: print(line, flush=True))
    except OSError as e:  # the address: taken, or not this machine's
        raise ConfigError(f"cannot serve on {args.host}:{args.port}: {e.strerror or e}; pick another --host or --port "
                          "(--port 0 picks a free one)") from None
    print(f"stopped: {stats['sessions']} sessions, {stats['verifies']} verifies, {stats['generated']} generated, "
          f"{stats['errors']} errors, {stats['refused']} refused", file=sys.stderr, flush=True)
    return 0
