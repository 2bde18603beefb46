import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import json
import shutil
import subprocess

import pytest
import torch

from tests.tiny import save_tiny_pair

# Tiny models run fastest on one thread, and tests must not fight each other for cores.
torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    """`cuda` tests skip where torch sees no CUDA device (every CPU machine, CI included)."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (bench/gpu/check.sh runs these on one: docs/gpu.md)")
    for item in items:
        if item.get_closest_marker("cuda") is not None:
            item.add_marker(skip)


# The tiny edge/cloud pair saved as HF folders, and three short prompts: one copy per test module
# (a module may damage its copy on purpose), shared by the modules that do not define their own.
@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return save_tiny_pair(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="module")
def prompts(tmp_path_factory):
    path = tmp_path_factory.mktemp("prompts") / "p.jsonl"
    path.write_text("".join(json.dumps({"id": f"p{i}", "prompt": t}) + "\n"
                            for i, t in enumerate(["hello world", "one two three", "say yes"])))
    return str(path)


# Three short texts, and each cloud runtime's own greedy decoding of them on the tiny cloud (once per module): what
# greedy speculation verified in that runtime must reproduce (tests/test_converted_runtimes.py, tests/test_packed.py).
PLAIN_TEXTS = ("hello world", "what is one two", "say three")


@pytest.fixture(scope="module")
def plain(pair):
    from specdec.core.config import DecodeConfig
    from specdec.engine import Engine

    found = {}

    def of(runtime: str) -> list[list[int]]:
        if runtime not in found:
            engine = Engine(mode="cloud", cloud=pair["cloud"], cloud_runtime=runtime, dtype="float32",
                            decode=DecodeConfig(max_new_tokens=16), log=lambda message: None)
            assert engine.model("cloud").runtime == runtime
            try:
                found[runtime] = [engine.generate(text).tokens for text in PLAIN_TEXTS]
            finally:
                engine.close()
        return found[runtime]
    return of


# Headless Chromium for the tests that open a report in a browser (tests/test_report.py, tests/test_fonts.py).
@pytest.fixture(scope="session")
def chromium():
    """Headless Chromium; installed from Debian when missing (skipped only when apt is unavailable)."""
    found = shutil.which("chromium")
    if found is None:
        if shutil.which("apt-get") is None:
            pytest.skip("chromium is not installed and apt-get is unavailable to install it")
        for command in (["apt-get", "update"], ["apt-get", "install", "-y", "chromium"]):
            done = subprocess.run(command, capture_output=True, text=True, timeout=900)
            assert done.returncode == 0, f"{' '.join(command)} failed: {done.stderr[-2000:]}"
        found = shutil.which("chromium")
    return found
