"""`MODEL@int8t`, the per-token int8 derivation, is batch-invariant: its Linear quantizes each row
(token) on its own range with fixed quantization parameters for every call and an exact int32
product, so a row's output is bit for bit the same alone and batched with other rows (torch's
dynamic int8 Linear, one scale per call, which @int8 and runtime torch-int8 run, is not: checked, so
the test has teeth); a batched forward gives each row its own logits; and one forward alone is at
least as close to the float model as dynamic int8 was."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from specdec.backends.hf_util import cache_kwarg
from specdec.backends.prompt import Prompt
from specdec.models.derive import TokenScaledInt8, quantize_int8
from specdec.models.loading import load_model

QUIET = dict(log=lambda m: None)


def int8_layer(linear: nn.Linear, per_channel: bool) -> TokenScaledInt8:
    """The `@int8t` Linear, as `quantize_int8` builds it in a model."""
    layer = quantize_int8(nn.Sequential(copy.deepcopy(linear)), per_channel, per_token=True)[0]
    assert isinstance(layer, TokenScaledInt8)
    return layer


def dynamic_int8(linear: nn.Linear) -> nn.Module:
    """torch's dynamic int8 Linear (one activation scale per call): what @int8 and runtime torch-int8 run."""
    from torch.ao.quantization import quantize_dynamic

    return quantize_dynamic(nn.Sequential(copy.deepcopy(linear)), {nn.Linear}, dtype=torch.qint8)[0]


@pytest.mark.parametrize("per_channel", [False, True])
def test_a_rows_output_is_bitwise_the_same_alone_and_batched(per_channel):
    torch.manual_seed(0)
    linear = nn.Linear(48, 40)
    rows = torch.randn(6, 48)
    rows[3] *= 40  # an outlying row: under one scale per call it coarsens every other row
    quantized = int8_layer(linear, per_channel)
    with torch.inference_mode():
        batched = quantized(rows)
        alone = torch.cat([quantized(rows[i : i + 1]) for i in range(6)])
        as_blocks = quantized(rows.view(2, 3, 48)).view(6, 40)  # [B, n, D] as a batched verify feeds it
        assert torch.equal(batched, alone) and torch.equal(as_blocks, alone)
        old = dynamic_int8(linear)
        old_alone = torch.cat([old(rows[i : i + 1]) for i in range(6)])
        assert not torch.equal(old(rows), old_alone)  # the dynamic Linear's rows move with their batch


def test_a_row_whose_scaled_max_rounds_past_one_moves_no_other_row():
    """(x - c) / h rounds to 1 + 1 ulp at this row's max; unclamped it, not the anchor, set the whole
    call's quantization range, and a row batched beside it moved by 0.009."""
    layer = int8_layer(nn.Linear(48, 40), per_channel=False)
    edge = torch.linspace(-1584.07568359375, -546.8223876953125, 48)
    low, high = edge.min(), edge.max()
    assert ((edge - (high + low) / 2) / ((high - low) / 2)).abs().max() > 1  # the case is real in fp32
    torch.manual_seed(0)
    others = torch.randn(3, 48)
    with torch.inference_mode():
        assert torch.equal(layer(torch.cat([others, edge.view(1, -1)]))[:3], layer(others))


@pytest.mark.parametrize("pasts", [(0, 9, 4, 1), (3, 9, 4, 1), (12, 12, 2, 7)])
def test_an_int8_backends_rows_are_bitwise_their_single_forwards(pair, pasts):
    """Through the server's batched forward (left-padded pasts, right-padded blocks, other rows) each
    row's logits are bit for bit its own forward's: every Linear per token, attention per row. (With
    SDPA over the padded batch the last two rows of the first case moved by up to 0.006 on this tiny
    model, and the real 1.5B's logits by 1.1-1.9 with the greedy token changed.)"""
    backend = load_model(f"{pair['cloud']}@int8t", "float32", **QUIET).backend
    assert backend.model.config._attn_implementation == "specbench_rowwise"
    torch.manual_seed(0)
    pasts = [torch.randint(0, 60, (n,)) for n in pasts]
    blocks = [torch.randint(0, 60, (n,)) for n in (5, 1, 3, 2)]
    alone, batched = [], []
    with torch.inference_mode():
        for past in pasts:
            for states in (alone, batched):
                states.append(backend.prefill(Prompt(torch.tensor([1])), past)[0])
        expected = [backend.forward(s, b, keep=b.numel()) for s, b in zip(alone, blocks)]
        got = backend.forward_batch(batched, blocks, [b.numel() for b in blocks])
        again = [backend.forward(s, b, keep=b.numel()) for s, b in zip(batched, blocks)]  # the caches batching wrote
        follow = [backend.forward(s, b, keep=b.numel()) for s, b in zip(alone, blocks)]
    for want, have in zip(expected, got):
        assert torch.equal(have, want)
    for want, have in zip(follow, again):
        assert torch.equal(have, want)


def test_rowwise_attention_is_the_models_own_attention_up_to_rounding(pair):
    """Row by row, the attention computes what SDPA over the whole call does (the same model, its
    own attention back): a prefill, a block after a past, and one token."""
    from specdec.models import rowwise_attention

    model = load_model(pair["cloud"], "float32", **QUIET).backend.model
    cache = cache_kwarg(model.forward)
    ids = torch.randint(0, 60, (1, 12))
    outputs = []
    for implementation in ("sdpa", rowwise_attention.NAME):
        if implementation == rowwise_attention.NAME:
            rowwise_attention.install(model)
        else:
            model.set_attn_implementation("sdpa")
        with torch.inference_mode():
            prefill = model(ids[:, :8], use_cache=True)
            block = model(ids[:, 8:11], **{cache: prefill.past_key_values}, use_cache=True)
            step = model(ids[:, 11:], **{cache: block.past_key_values})
        outputs.append([prefill.logits, block.logits, step.logits])
    for sdpa, rowwise in zip(*outputs):
        assert torch.allclose(sdpa, rowwise, atol=1e-5)


def test_int8_alone_is_at_least_as_close_to_float_as_dynamic_int8(pair):
    exact = load_model(pair["cloud"], "float32", **QUIET).backend.model
    ours = load_model(f"{pair['cloud']}@int8t", "float32", **QUIET).backend.model
    from torch.ao.quantization import quantize_dynamic

    old = quantize_dynamic(copy.deepcopy(exact), {nn.Linear}, dtype=torch.qint8)
    ids = torch.arange(1, 20).view(1, -1)
    with torch.inference_mode():
        reference = exact(ids).logits
        error_ours = (ours(ids).logits - reference).abs().max()
        error_old = (old(ids).logits - reference).abs().max()
    assert 0 < error_ours <= error_old


def mapped(path: str) -> bool:
    """Whether any file under `path` is mapped into this process."""
    with open("/proc/self/maps", encoding="utf-8") as maps:
        return any(path in line for line in maps)


@pytest.fixture(scope="module")
def biased(tmp_path_factory):
    """A tiny Qwen2 (q/k/v biases, as the real pair has) saved with the pair's tokenizer."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from tests.omni_fixtures import tiny_omni_tokenizer

    tokenizer = tiny_omni_tokenizer()
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2,
                                         eos_token_id=tokenizer.eos_token_id))
    path = tmp_path_factory.mktemp("models") / "qwen2"
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


@pytest.mark.parametrize("op", ["int8", "int8t"])
def test_an_int8_model_keeps_no_view_of_its_checkpoint_file(biased, op):
    """The float tensors an int8 model keeps, parameters and the biases packed in its int8 Linears, are
    copies: the mapped checkpoint is let go as the load returns (on the real 1.5B it held 7 of 11.6 GB
    resident). A plain load maps it: the check has teeth."""
    import gc

    plain = load_model(biased, "float32", **QUIET)
    assert mapped(biased)
    del plain
    gc.collect()
    quantized = load_model(f"{biased}@{op}", "float32", **QUIET)
    assert not mapped(biased)
    ids = torch.arange(1, 9)
    with torch.inference_mode():
        assert quantized.backend.prefill(Prompt(ids[:1]), ids, keep=1)[1].isfinite().all()


@pytest.mark.parametrize("past", [1, 9, 40])
def test_an_int8t_blocks_rows_are_bitwise_its_steps(pair, past):
    """What makes greedy speculation verified in torch-int8t that runtime's own plain decoding: a block of n
    tokens computes, row for row, the logits of n one-token steps (attention one query at a time)."""
    backend = load_model(f"{pair['cloud']}@int8t", "float32", **QUIET).backend
    torch.manual_seed(1)
    context, block = torch.randint(0, 60, (past,)), torch.randint(0, 60, (6,))
    with torch.inference_mode():
        state, _ = backend.prefill(Prompt(torch.tensor([1])), context)
        rows = backend.forward(state, block, keep=block.numel())
        backend.crop(state, past)
        steps = torch.cat([backend.forward(state, block[i : i + 1], keep=1) for i in range(block.numel())])
    assert torch.equal(rows, steps)
