"""A split run recorded for a fleet to replay (`specbench fleet --edge-replay DIR`): the edge's loop against the
server at `url`, its records with their traces in `out`."""
from __future__ import annotations

from pathlib import Path

from bench.cli import main


def record_split(edge: str, url: str, prompts: str, out: Path, settings: list[str]) -> Path:
    assert main(["run", "--mode", "spec", "--edge", edge, "--cloud-url", url, "--prompts", prompts, "--out", str(out),
                 *settings]) == 0
    return out
