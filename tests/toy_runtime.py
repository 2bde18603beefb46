"""A runtime declared outside specdec, as a plugin would be: SPECBENCH_RUNTIMES=tests.toy_runtime makes every process
of a run know it (tests/test_toy_runtime.py). It runs the model in torch float32 under its own name; nothing else in
the project names it."""
from __future__ import annotations

from dataclasses import replace

from specdec.runtime_registry import CLOUD, EDGE, Runtime, default_runtime, register

NAME = "toy-fp32"


def load(name, settings, log):
    from specdec.models.loading import load as load_in

    loaded = load_in(name, replace(settings, runtime=default_runtime(), dtype="float32"), log)
    loaded.runtime = NAME
    return loaded


RUNTIME = register(Runtime(NAME, "the torch runtime in float32 under another name (a test's plugin)",
                           loader=f"{__name__}:load", order=50, aliases=("toy",), weight_bits=32,
                           auto=frozenset({CLOUD, EDGE})))
