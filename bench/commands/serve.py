"""`specbench serve`: the cloud verifier (specdec/remote/server.py) as a server for edge clients."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench.commands.options import Option, field_options, values
from bench.measure.caps import parse_cores, pin_cores
from specdec.errors import ConfigError
from specdec.models.loading import load
from specdec.remote.protocol import read_token, token_file_warning
from specdec.remote.server import run_server
from specdec.remote.server_config import ServeConfig, ServedModel


def serve_options() -> list[Option]:
    """`serve`'s flags, generated from the settings they fill as `run`'s and `sweep`'s are (the model it serves, then
    the server's own), then the two that fill no field: the cores to pin and the file the token is read from."""
    return [*field_options(ServedModel), *field_options(ServeConfig),
            Option("cores", ("--cores",), "store", str, None, False,
                   "pin the server to these cores, e.g. 1 or 0-3 (torch threads follow)", None),
            Option("token_file", ("--token-file",), "store", Path, None, False,
                   "file holding a shared secret every client must present (needed to bind beyond loopback)", None)]


def add_serve_parser(sub) -> None:
    p = sub.add_parser("serve", help="serve a cloud model as a verifier for edge clients (`run --cloud-url`)")
    for option in serve_options():
        option.add_to(p)


def cmd_serve(args: argparse.Namespace) -> int:
    token = read_token(args.token_file) if args.token_file else None
    if token and (warning := token_file_warning(args.token_file)):
        print(warning, file=sys.stderr, flush=True)
    config = ServeConfig(**values(ServeConfig, args), token=token)
    served = ServedModel(**values(ServedModel, args))
    if args.cores:
        pin_cores(parse_cores(args.cores))
    # Sessions interleave: a static cache holds --max-sessions sequences (specdec/backends/static_slots.py).
    model = load(served.model, served.load_settings(config.max_sessions), log=lambda m: print(m, file=sys.stderr, flush=True))
    try:
        stats = run_server(model, config, announce=lambda line: print(line, flush=True))
    except OSError as e:  # the address: taken, or not this machine's
        raise ConfigError(f"cannot serve on {config.host}:{config.port}: {e.strerror or e}; pick another --host or --port "
                          "(--port 0 picks a free one)") from None
    print(f"stopped: {stats['sessions']} sessions, {stats['verifies']} verifies, {stats['generated']} generated, "
          f"{stats['errors']} errors, {stats['refused']} refused", file=sys.stderr, flush=True)
    return 0
