"""`specbench fleet`: N edges against one verifier server for each N, beside cloud-only serving of
the same N (bench/measure/serving/fleet.py runs it; its flags come from FleetConfig's fields)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench.commands.options import field_options, values
from bench.core.folder import canonical_path
from bench.core.prompts import canonical_prompts
from bench.measure.serving.fleet import run_fleet
from bench.measure.serving.fleet_config import FleetConfig
from specdec.core.config import DecodeConfig, SpecConfig
from specdec.models.architecture import PREFIX as ARCH
from specdec.models.architecture import is_architecture


def add_fleet_parser(sub) -> None:
    p = sub.add_parser("fleet", help="N edges against one verifier server for each N (replayed or real), beside "
                                     "cloud-only serving of the same N: the server's capacity curve")
    p.add_argument("--out", required=True, type=Path, help="results directory (rerun to resume)")
    for cls in (FleetConfig, SpecConfig, DecodeConfig):
        for option in field_options(cls):
            option.add_to(p)


def canonical_model(name: str | None) -> str | None:
    """A model as one setting wherever the fleet is run from: a path made absolute, after `arch:` too."""
    if name is not None and is_architecture(name):
        return ARCH + canonical_path(name.removeprefix(ARCH))
    return canonical_path(name)


def cmd_fleet(args: argparse.Namespace) -> int:
    spec, decode = SpecConfig(**values(SpecConfig, args)), DecodeConfig(**values(DecodeConfig, args))
    config = FleetConfig(**{**values(FleetConfig, args), "prompts": canonical_prompts(args.prompts),
                            "edge": canonical_path(args.edge), "cloud": canonical_model(args.cloud),
                            "edge_replay": canonical_path(args.edge_replay), "token_file": canonical_path(args.token_file)})
    counts, summary = run_fleet(config, spec, decode, args.out)
    print(", ".join(f"{n} {status}" for status, n in sorted(counts.items())), file=sys.stderr, flush=True)
    if not summary.empty:
        columns = ["cloud_runtime", "mode", "clients", "server_accepted_tokens_per_s", "edge_tokens_per_s_p50",
                   "verify_latency_p50_s", "mean_batch_size", "cloud_busy_fraction"]
        print(summary[[c for c in columns if c in summary]].to_string(index=False, float_format=lambda v: f"{v:.3g}"),
              file=sys.stderr, flush=True)
    print(f"summary: {args.out / 'summary.csv'}", file=sys.stderr, flush=True)
    return 0
