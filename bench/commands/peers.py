"""`specbench peers`: the field's CPU engines in venvs of their own (bench/measure/peers/envs.py): list, install."""
from __future__ import annotations

import argparse
import sys

from bench.measure.peers import envs


def add_peers_parser(sub) -> None:
    peers = sub.add_parser("peers", help="peer engines (vLLM, OpenVINO GenAI) in venvs of their own")
    peers_sub = peers.add_subparsers(dest="peers_command", required=True)
    peers_sub.add_parser("list", help="each peer, what it runs, whether it is installed and how big")
    install = peers_sub.add_parser("install", help="build a peer's pinned venv under $SPECBENCH_HOME/peers/ from the "
                                                   "package index (this environment's pins do not move)")
    install.add_argument("names", nargs="+", metavar="NAME", help=", ".join(envs.PEER_ENVS))


def cmd_peers(args: argparse.Namespace) -> int:
    if args.peers_command == "list":
        for name, spec in envs.PEER_ENVS.items():
            print(f"{name:16} {envs.state(name):22} {' '.join(spec.packages)}\n{'':16} {spec.about}")
        return 0
    for name in args.names:  # every name checked before the first install starts
        envs.peer_dir(name)
    for name in args.names:
        print(envs.install(name, log=lambda m: print(m, file=sys.stderr, flush=True)))
    return 0
