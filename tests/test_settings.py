"""Settings typed end to end: words parsed once into enums where they enter, a registry of runtime loaders instead of
a chain of ifs, core reading no runtime's constant, and speculative_decode's options as one typed object."""
import ast
import inspect
import json
from pathlib import Path

import pytest

from specdec.core.config import DeployConfig, EngineConfig
from specdec.core.decode import SpecOptions, speculative_decode
from specdec.errors import ConfigError, ModelError
from specdec.models.loading import LoadSettings
from specdec.runtime_registry import runtimes
from specdec.settings import CudaGraphs, ExtraBuffers, KVCache, OnCloudLoss, ServerCache, choices, parse

ROOT = Path(__file__).parent.parent
# The modules of one runtime: core may import backends' shared modules (base, devices), never these.
RUNTIME_MODULES = ("llamacpp", "llamacpp_probe", "onnxrt", "openvino", "packed", "whisper", "omni_thinker",
                   "static_cache", "static_slots", "cuda_graphs")


@pytest.mark.parametrize("kind", [KVCache, ServerCache, CudaGraphs, ExtraBuffers, OnCloudLoss])
def test_a_setting_parses_its_words_and_refuses_others_in_one_line(kind):
    for word in choices(kind):
        value = parse(kind, word, "the_setting")
        assert value is kind(word) and value == word and json.dumps(value) == json.dumps(word)
    with pytest.raises(ConfigError) as refused:
        parse(kind, "nonsense", "the_setting")
    assert str(refused.value) == f"unknown the_setting 'nonsense': use one of {', '.join(choices(kind))}"


def test_the_configs_hold_parsed_settings_that_still_read_as_their_words():
    config = EngineConfig(mode="cloud", cloud="m", kv_cache="static", cuda_graphs="off", llamacpp_extra_buffers="on")
    assert (config.kv_cache, config.cuda_graphs, config.llamacpp_extra_buffers) == (
        KVCache.STATIC, CudaGraphs.OFF, ExtraBuffers.ON)
    assert isinstance(config.kv_cache, KVCache) and config.kv_cache == "static"
    assert DeployConfig(on_cloud_loss="edge").on_cloud_loss is OnCloudLoss.EDGE
    assert isinstance(EngineConfig(mode="cloud", cloud="m").kv_cache, KVCache)  # the default too
    with pytest.raises(ConfigError, match="unknown kv_cache 'warm': use one of auto, dynamic, static, compiled"):
        EngineConfig(mode="cloud", cloud="m", kv_cache="warm")


def test_every_runtime_declares_a_loader_that_imports():
    assert all(callable(r.resolved_loader()) for r in runtimes())
    assert all(callable(r.converter()) for r in runtimes() if r.conversion)
    settings = LoadSettings(runtime="llamacpp", kv_cache="auto", extra_buffers="off")
    assert settings.kv_cache is KVCache.AUTO and settings.extra_buffers is ExtraBuffers.OFF
    with pytest.raises(ModelError, match="unknown runtime 'tpu-int2': use one of torch, "):
        LoadSettings(runtime="tpu-int2")
    with pytest.raises(ModelError, match="unknown dtype 'float8'"):
        LoadSettings(dtype="float8")


def imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def test_core_reads_no_runtimes_constant():
    """core (the loop and its config) knows the backend interface and the devices, not one runtime's module."""
    found = [f"{path.relative_to(ROOT)} imports {name}" for path in sorted(ROOT.glob("specdec/core/**/*.py"))
             for name in imported_modules(path) if name.removeprefix("specdec.backends.") in RUNTIME_MODULES]
    assert found == []


def test_speculative_decode_takes_its_options_as_one_typed_object():
    parameters = inspect.signature(speculative_decode).parameters
    assert list(parameters) == ["edge", "cloud", "prompt", "spec", "decode", "options"]
    assert SpecOptions(on_cloud_loss="edge").on_cloud_loss is OnCloudLoss.EDGE
    with pytest.raises(ConfigError, match="unknown on_cloud_loss 'retry'"):
        SpecOptions(on_cloud_loss="retry")
