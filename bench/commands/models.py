"""`specbench models`: the offline model registry (specdec/models/): list, verify, fetch."""
from __future__ import annotations

import argparse
import sys

from specdec.errors import ModelError
from specdec.models import fetch, registry


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def add_models_parser(sub) -> None:
    models = sub.add_parser("models", help="the offline model registry")
    models_sub = models.add_subparsers(dest="models_command", required=True)
    models_sub.add_parser("list", help="registry aliases and whether they are fetched (and whole: file sizes)")
    verify = models_sub.add_parser("verify", help="check fetched models' files against the sizes and sha256 recorded "
                                                  "when they were converted (all fetched aliases by default)")
    verify.add_argument("aliases", nargs="*")
    fetch_ = models_sub.add_parser("fetch", help="install, verify and convert pinned weights (all aliases by default)")
    fetch_.add_argument("aliases", nargs="*")


def cmd_models(args: argparse.Namespace) -> int:
    if args.models_command == "list":
        for entry in registry.list_models():
            state = registry.state(entry.alias)
            source = f"derived: {entry.load_name}" if getattr(entry, "base", None) else entry.upstream
            gguf = ""
            if entry.format == registry.Format.GGUF and not getattr(entry, "base", None) and state != registry.State.NOT_FETCHED:
                gguf = f"  [gguf {fetch.kept_gguf(entry.alias)[1]}]"  # its size only: `verify` hashes it
            print(f"{entry.alias:24} {entry.size / 1e6:8.0f} MB  {state:12} {source}  ({entry.license}){gguf}")
        return 0
    if args.models_command == "verify":
        return cmd_verify(args.aliases)
    for alias in args.aliases or [e.alias for e in registry.list_models()]:
        registry.get(alias)
        print(fetch.fetch(alias, log=_say))
    return 0


def cmd_verify(aliases: list[str]) -> int:
    """Sizes and sha256 of every fetched model's files against those recorded when it was converted."""
    damaged, bad_gguf = [], []
    for alias in aliases or [e.alias for e in registry.list_models() if not e.base]:
        entry = registry.get(alias)
        if registry.state(alias) == registry.State.NOT_FETCHED:
            print(f"{alias:24} not fetched")
            continue
        problem = registry.damage(alias, hashes=True)
        recorded = "files" in (registry.read_marker(registry.model_dir(alias)) or {})
        ok = "ok" if recorded else "ok (safetensors headers only: fetched before sizes and hashes were recorded)"
        print(f"{alias:24} {'damaged: ' + problem if problem else ok}", flush=True)
        if problem:
            damaged.append(entry.base or alias)
        if entry.format == registry.Format.GGUF:  # the file llama.cpp runs, against the registry's sha256
            path, kept = fetch.kept_gguf(alias, hashed=True)
            print(f"{'':24} {path.name}: {kept if kept != 'kept' else 'kept, sha256 ok'}", flush=True)
            if kept == "damaged":
                bad_gguf.append(path)
    if damaged:
        raise ModelError(f"{len(damaged)} cached model(s) damaged ({', '.join(damaged)}): run `specbench models fetch "
                         f"{' '.join(damaged)}` to fetch them again")
    if bad_gguf:
        raise ModelError(f"kept GGUF {bad_gguf[0]} differs from the registry's size or sha256: delete it, and the next "
                         "llama.cpp load joins it afresh from the verified parts")
    return 0
