"""Loading: the one-time bf16 copy of a registry model equals casting at load time."""
import torch
from transformers import AutoModelForCausalLM

from specdec.models import registry
from specdec.models.loading import cast_copy, load_model
from tests.tiny import save_tiny_pair


def test_bf16_copy_is_bit_identical_to_casting_at_load(tmp_path):
    paths = save_tiny_pair(tmp_path)
    location = tmp_path / "cloud"
    (location / registry.MARKER).write_text('{"sha256": "x"}')  # as a registry-managed dir
    copy = cast_copy(location, "bfloat16", log=lambda m: None)
    assert copy == location / "bfloat16" and (copy / registry.MARKER).exists()
    assert cast_copy(location, "bfloat16", log=lambda m: None) == copy  # made once
    assert cast_copy(location, "float32") == location
    cast_at_load = AutoModelForCausalLM.from_pretrained(location, dtype=torch.bfloat16).state_dict()
    for name, tensor in AutoModelForCausalLM.from_pretrained(copy).state_dict().items():
        assert tensor.dtype == torch.bfloat16 and torch.equal(tensor, cast_at_load[name]), name
    loaded = load_model(str(location), "bfloat16", log=lambda m: None)
    assert loaded.location == str(copy) and loaded.backend.model.dtype == torch.bfloat16
    # A plain user directory is never written to.
    assert str(cast_copy(paths["edge"], "bfloat16")) == paths["edge"]
    assert not (tmp_path / "edge" / "bfloat16").exists()


def test_spec_refuses_a_pair_with_different_tokenizers(tmp_path):
    import pytest
    from transformers import AutoTokenizer

    from specdec import ConfigError
    from specdec.engine import Engine

    paths = save_tiny_pair(tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(paths["cloud"])
    tokenizer.add_tokens(["zebra"])
    tokenizer.save_pretrained(paths["cloud"])
    engine = Engine(mode="spec", edge=paths["edge"], cloud=paths["cloud"], dtype="float32", log=lambda m: None)
    with pytest.raises(ConfigError, match="use different tokenizers"):
        engine.generate("hello world")
