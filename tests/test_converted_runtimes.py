"""The converted runtimes (onnx-int4, openvino-int8) as a cloud, on the tiny pair: greedy speculation verified
there is that runtime's own plain decoding token for token, with the edge model or prompt lookup drafting,
cached and stateless, in process and behind the server; a missing extra is one line and exit 2."""
from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from specdec.core.config import DecodeConfig, SpecConfig
from specdec.engine import Engine
from specdec.models.loading import load_model
from specdec.remote.background import BackgroundServer
from specdec.runtime_registry import Package, declared
from tests.conftest import PLAIN_TEXTS as TEXTS  # what the `plain` fixture decodes

QUIET = dict(log=lambda message: None)


def package(runtime: str) -> Package:
    found = declared(runtime).package
    assert found is not None, f"{runtime} runs in a package of its own"
    return found


RUNTIMES = [pytest.param(r, marks=pytest.mark.skipif(importlib.util.find_spec(package(r).module) is None,
                                                     reason=f"{package(r).distribution} is not installed"))
            for r in ("onnx-int4", "openvino-int8")]


def _tokens(engine) -> list[list[int]]:
    try:
        return [engine.generate(text).tokens for text in TEXTS]
    finally:
        engine.close()


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("drafter", ["model", "prompt-lookup"])
@pytest.mark.parametrize("verifier", ["cached", "stateless"])
def test_greedy_spec_verified_in_a_converted_runtime_is_its_own_plain_decoding(pair, plain, runtime, drafter, verifier):
    spec = Engine(mode="spec", edge=pair["edge"], cloud=pair["cloud"], cloud_runtime=runtime, dtype="float32",
                  decode=DecodeConfig(max_new_tokens=16),
                  spec=SpecConfig(k=3, entropy_threshold=0, policy="greedy", drafter=drafter, verifier=verifier), **QUIET)
    generations = [spec.generate(text) for text in TEXTS]
    spec.close()
    assert [g.tokens for g in generations] == plain(runtime)
    if drafter == "model":  # every path ran: a correction and a bonus somewhere
        assert {"correction", "bonus"} <= {c.extra_kind for g in generations for c in g.cycles}


@pytest.mark.server
@pytest.mark.parametrize("runtime", RUNTIMES)
def test_greedy_spec_through_a_converted_runtimes_server_is_its_plain_decoding(pair, plain, runtime):
    cloud = load_model(pair["cloud"], "float32", runtime=runtime, **QUIET)
    with BackgroundServer(cloud) as url:
        spec = Engine(mode="spec", edge=pair["edge"], cloud_url=url, dtype="float32",
                      decode=DecodeConfig(max_new_tokens=16),
                      spec=SpecConfig(k=3, entropy_threshold=0, policy="greedy"), **QUIET)
        assert _tokens(spec) == plain(runtime)


@pytest.mark.subprocess  # runs specbench in a child process
@pytest.mark.parametrize("runtime", ["onnx-int4", "openvino-int8"])
def test_a_missing_extra_is_one_line(pair, prompts, tmp_path, runtime):
    needed = package(runtime)
    code = (f"import sys; sys.modules[{needed.module!r}] = None  # as if the extra were not installed\n"
            "from bench.cli import main; sys.exit(main(sys.argv[1:]))")
    run = ["run", "--mode", "cloud", "--cloud", pair["cloud"], "--prompts", prompts, "--dtype", "float32",
           "--max-new-tokens", "3", "--limit", "1", "--cloud-runtime", runtime, "--out", str(tmp_path / "a")]
    result = subprocess.run([sys.executable, "-c", code, *run], capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [
        f"error: --cloud-runtime {runtime} needs {needed.distribution}, which is not installed: {needed.extra}"]
