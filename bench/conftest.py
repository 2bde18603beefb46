"""Fixtures of the pytest-benchmark suites (`pytest bench --benchmark-only`); plain `pytest` runs
`tests/` only (testpaths), so these never run there. Models load once per session."""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest

from bench.measure.workload import CLOUD_ALIAS, EDGE_ALIAS, Pair, real_workload, tiny_workload
from specdec.models.registry import is_fetched


def pytest_configure(config):
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # assisted generation warns on every call about a config path


@pytest.fixture(scope="session")
def tiny_pair():
    """The gate's tiny pair (fp32, 1 thread): 4 prompts x 32 tokens, greedy, k=4, verify every block."""
    with Pair(tiny_workload(), log=lambda message: None) as pair:
        yield pair


@pytest.fixture(scope="session")
def real_pair():
    """The Qwen2.5-Coder pair, bf16, 2 threads: 2 `code` prompts x 32 tokens, greedy, k=4, threshold 0."""
    missing = [alias for alias in (EDGE_ALIAS, CLOUD_ALIAS) if not is_fetched(alias)]
    if missing:
        pytest.skip(f"real pair not fetched ({', '.join(missing)}): run `specbench models fetch {EDGE_ALIAS} {CLOUD_ALIAS}`")
    with Pair(real_workload(max_new_tokens=32, threads=2), log=lambda message: None) as pair:
        yield pair
