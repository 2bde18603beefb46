"""Settings typed end to end: words parsed once into enums where they enter, a registry of runtime loaders instead of
a chain of ifs, core reading no runtime's constant, and speculative_decode's options as one typed object."""
import ast
import inspect
import json
import typing
from dataclasses import fields
from pathlib import Path

import pytest

from specdec.core.config import DecodeConfig, DeployConfig, EngineConfig, SpecConfig
from specdec.core.decode import SpecOptions, speculative_decode
from specdec.core.policies import POLICIES, PolicyTraits, policies_that, registry, traits
from specdec.errors import ConfigError, ModelError
from specdec.models.loading import LoadSettings
from specdec.remote.server_config import ServeConfig, ServedModel
from specdec.runtime_registry import RuntimeChoices, runtimes
from specdec.settings import (
    CudaGraphs,
    DType,
    ExtraBuffers,
    KVCache,
    Mode,
    OnCloudLoss,
    Overlap,
    Profile,
    ServerCache,
    Uncertainty,
    as_words,
    choices,
    enum_of,
    parse,
)

ROOT = Path(__file__).parent.parent
# The modules of one runtime: core may import backends' shared modules (base, devices), never these.
RUNTIME_MODULES = ("llamacpp", "llamacpp_probe", "onnxrt", "openvino", "packed", "whisper", "omni_thinker",
                   "static_cache", "static_slots", "cuda_graphs")


@pytest.mark.parametrize("kind", [Mode, DType, KVCache, ServerCache, CudaGraphs, ExtraBuffers, OnCloudLoss, Overlap,
                                  Uncertainty, Profile])
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


CONFIGS = (EngineConfig, SpecConfig, DeployConfig, DecodeConfig, ServedModel, ServeConfig)


def test_every_closed_setting_is_an_enum_and_only_registries_stay_words():
    """A setting whose values are a fixed list is typed by its enum (parsed where it enters, compared as members); the
    ones that stay words are the open registries a new file extends (runtimes, policies, verifiers, drafters...)."""
    for config in CONFIGS:
        hints = typing.get_type_hints(config)
        for f in fields(config):
            allowed = f.metadata.get("choices")
            if allowed is None:
                continue
            kind = enum_of(hints[f.name])
            if isinstance(allowed, (dict, RuntimeChoices)):  # a live registry: what is filed later is a choice too
                assert kind is None, f"{config.__name__}.{f.name}"
            else:
                assert kind is not None and tuple(allowed) == choices(kind), f"{config.__name__}.{f.name} is a word"


def test_each_config_holds_members_after_its_parse_and_records_keep_the_words():
    engine = EngineConfig(mode="spec", edge="e", cloud="c", dtype="float32", constraints="zh")
    spec, deploy = SpecConfig(uncertainty="mean"), DeployConfig(overlap="auto")
    assert (engine.mode, engine.dtype, engine.constraints) == (Mode.SPEC, DType.FLOAT32, Profile.ZH)
    assert spec.uncertainty is Uncertainty.MEAN and deploy.overlap is Overlap.AUTO
    assert DeployConfig(overlap="yes").overlap is True and DeployConfig(overlap=False).overlap is False
    assert json.dumps([engine.mode, engine.constraints, deploy.overlap]) == '["spec", "zh", "auto"]'
    with pytest.raises(ConfigError, match="^overlap must be auto, true or false, got 'maybe'$"):
        DeployConfig(overlap="maybe")
    with pytest.raises(ConfigError, match="^unknown uncertainty 'median': use one of max, mean, first$"):
        SpecConfig(uncertainty="median")
    with pytest.raises(ConfigError, match="^unknown mode 'both': use one of edge, cloud, spec$"):
        EngineConfig(mode="both", cloud="c")
    # A record or a sweep's grid holds the word: bench's Point and sweep fields are typed by it.
    assert as_words(KVCache) is str and as_words(bool | Overlap) == bool | str and as_words(int | None) == int | None


def test_a_policys_declared_traits_decide_what_callers_once_asked_by_its_name(monkeypatch):
    """draft_topn, the temperature a sampler needs and token trees' greedy rule follow what a policy declares: a new
    sampling policy is one file, with no caller naming it."""
    assert policies_that("samples") == ("sample",) and policies_that("argmax") == ("greedy",)
    assert set(policies_that("lossless")) == {"greedy", "sample"} and not traits("threshold").samples
    monkeypatch.setitem(POLICIES, "toy-sampler", lambda accept_threshold: None)
    monkeypatch.setitem(registry._TRAITS, "toy-sampler", PolicyTraits(samples=True, lossless=True))
    assert SpecConfig(policy="toy-sampler", draft_topn=8).draft_topn == 8  # a sampler takes top-N drafts
    with pytest.raises(ConfigError, match="^draft_topn truncates sampled drafts: use it with --policy sample or "
                                          "toy-sampler, or leave it unset$"):
        SpecConfig(policy="threshold", draft_topn=8)
    with pytest.raises(ConfigError, match="^policy 'toy-sampler' needs temperature > 0: set --temperature, or use "
                                          "--policy greedy for greedy decoding$"):
        SpecConfig(policy="toy-sampler").check_decoding(DecodeConfig(temperature=0.0))


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
