"""Runtimes kernels-int8 and kernels-int4 (specdec/backends/packed.py on specdec/kernels/, this CPU's path): each kernel is the
arithmetic it claims (against a float64 reference of the same quantized numbers) and gives a row the same bits alone
or beside others; a model's (k+1)-token blocks, prefills and other sessions' batched rows are its one-token steps bit
for bit; greedy speculation verified there is that runtime's own plain decoding token for token; and what it cannot
run (a CPU without any vector path, a forced path it lacks, no compiler, another architecture) is one line naming the
fix. tests/test_kernels.py holds every path to the reference, bit for bit."""
from __future__ import annotations

import copy
import subprocess
import sys

import pytest
import torch
from torch.nn import functional as F

from specdec.backends.prompt import Prompt
from specdec.core.config import DecodeConfig, SpecConfig
from specdec.engine import Engine
from specdec.errors import ModelError
from specdec.kernels import KernelError, chosen_path, missing_flags
from specdec.runtime_registry import exact_elsewhere
from tests.conftest import PLAIN_TEXTS
from tests.tiny import random_prompt, tiny_causal

pytestmark = pytest.mark.skipif(bool(missing_flags()), reason=f"{missing_flags()} (the refusal is tested)")
QUIET = dict(log=lambda message: None)
WEIGHTS = ["int8", "int4"]


@pytest.fixture(scope="module")
def ops():
    from specdec.kernels import kernels

    return kernels()


def packed_linear(ops, kind: str, n: int, k: int, seed: int = 0):
    from specdec.kernels import pack

    torch.manual_seed(seed)
    weight, bias = torch.randn(n, k), torch.randn(n)
    packed = pack.int8(weight, bias) if kind == "int8" else pack.int4(weight, bias)

    def run(x, residual=None):
        if kind == "int8":
            return ops.linear_int8(x, packed.weight, packed.scale, packed.bias, residual, n, k)
        return ops.linear_int4(x, packed.weight, packed.scale, packed.bias, residual, n, k, packed.group)
    return packed, run


@pytest.mark.parametrize("kind", WEIGHTS)
@pytest.mark.parametrize("shape", [(100, 200), (48, 64), (37, 1000)])  # N and K off the packing's multiples too
def test_a_linear_is_its_quantized_arithmetic_and_a_rows_bits_do_not_depend_on_its_neighbours(ops, kind, shape):
    from specdec.kernels.pack import dequantized

    n, k = shape
    packed, run = packed_linear(ops, kind, n, k)
    x = torch.randn(11, k)
    x[3] *= 50  # an outlying row: with one scale per call it would coarsen every other row
    x[7] = 0  # an all-zero row: its scale is 0, its output the bias
    residual = torch.randn(11, n)
    out = run(x, residual)
    alone = torch.cat([run(x[i : i + 1].contiguous(), residual[i : i + 1].contiguous()) for i in range(11)])
    assert torch.equal(out, alone)
    scale = x.abs().amax(dim=1, keepdim=True) / 127
    rows = torch.where(scale > 0, torch.round(x / torch.where(scale > 0, scale, 1)) * scale, 0)  # per-row int8
    reference = rows.double() @ dequantized(packed).double().T + packed.bias.double() + residual.double()
    assert torch.allclose(out.double(), reference, rtol=1e-5, atol=1e-3 * reference.abs().max().item() / 100)
    assert torch.equal(out[7], (packed.bias + residual[7]))


@pytest.mark.parametrize("kind", WEIGHTS)
def test_a_linear_writes_into_the_output_it_is_given_and_refuses_one_that_does_not_fit(ops, kind):
    """`out` (a workspace the backend reuses: a fresh 57 MB tensor is new pages every call) gets the same bits."""
    packed, run = packed_linear(ops, kind, 48, 64)
    x, residual = torch.randn(5, 64), torch.randn(5, 48)
    linear = ops.linear_int8 if kind == "int8" else ops.linear_int4
    extra = () if kind == "int8" else (packed.group,)
    out = torch.full((5, 48), float("nan"))
    got = linear(x, packed.weight, packed.scale, packed.bias, residual, 48, 64, *extra, out=out)
    assert got.data_ptr() == out.data_ptr() and torch.equal(out, run(x, residual))
    for bad, says in ((torch.empty(4, 48), "out must be a contiguous float32 [M, N] tensor"),
                      (torch.empty(48, 5).T, "out must be a contiguous float32 [M, N] tensor"),
                      (residual, "out must not be the activations or the residual")):
        with pytest.raises(RuntimeError, match=says.replace("[", r"\[").replace("]", r"\]")):
            linear(x, packed.weight, packed.scale, packed.bias, residual, 48, 64, *extra, out=bad)


def test_norm_and_gated_activation_match_torch(ops):
    torch.manual_seed(0)
    x, weight = torch.randn(5, 200) * 3, torch.randn(200)
    reference = weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))
    assert torch.allclose(ops.rms_norm(x, weight, 1e-6), reference, rtol=1e-5, atol=1e-6)
    gate_up = torch.randn(5, 2 * 90) * 4
    gate, up = gate_up.chunk(2, dim=1)
    assert torch.allclose(ops.silu_mul(gate_up), F.silu(gate) * up, rtol=1e-5, atol=1e-6)


def test_attention_writes_the_cache_and_matches_causal_sdpa_with_grouped_heads(ops):
    torch.manual_seed(0)
    heads, kv_heads, dim, start, n = 4, 2, 32, 6, 5
    cache_k, cache_v = torch.zeros(16, kv_heads, dim), torch.zeros(16, kv_heads, dim)
    cache_k[:start], cache_v[:start] = torch.randn(start, kv_heads, dim), torch.randn(start, kv_heads, dim)
    cos, sin = torch.ones(16, dim), torch.zeros(16, dim)  # the identity rotation: the plain attention below
    qkv = torch.randn(n, (heads + 2 * kv_heads) * dim)
    out = ops.attention(qkv, cache_k, cache_v, start, cos, sin, heads, kv_heads, dim ** -0.5)
    q, k, v = qkv.split([heads * dim, kv_heads * dim, kv_heads * dim], dim=1)
    assert torch.equal(cache_k[start : start + n], k.view(n, kv_heads, dim))
    assert torch.equal(cache_v[start : start + n], v.view(n, kv_heads, dim))
    keys = cache_k[: start + n].repeat_interleave(heads // kv_heads, dim=1).transpose(0, 1)  # [H, L, d]
    values = cache_v[: start + n].repeat_interleave(heads // kv_heads, dim=1).transpose(0, 1)
    mask = torch.ones(n, start + n, dtype=torch.bool).tril(start)
    reference = F.scaled_dot_product_attention(q.view(n, heads, dim).transpose(0, 1), keys, values, attn_mask=mask)
    assert torch.allclose(out, reference.transpose(0, 1).reshape(n, heads * dim), rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def models():
    """(arch, weights) -> (the float model, its vnni backend)."""
    from specdec.backends.packed import PackedBackend

    found = {}

    def of(arch: str, weights: str):
        if (arch, weights) not in found:
            model = tiny_causal(arch)
            found[arch, weights] = model, PackedBackend.from_model(model, weights)
        return found[arch, weights]
    return of


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("weights", WEIGHTS)
def test_blocks_prefills_and_crops_are_steps_bit_for_bit_and_near_the_float_model(models, arch, weights):
    model, backend = models(arch, weights)
    ids = random_prompt(3, 24)
    state, logits = backend.prefill(Prompt(ids), ids, keep=24)
    with torch.no_grad():
        reference = model(ids[None]).logits[0]
    agree = (logits.argmax(-1) == reference.argmax(-1)).float().mean().item()
    assert agree >= (0.95 if weights == "int8" else 0.8), agree  # the tiny model's own drift, int4 coarser
    for n in range(1, 10):  # every verify size: a block's rows are the steps' logits
        state, _ = backend.prefill(Prompt(ids[:10]), ids[:10], keep=1)
        block = backend.forward(state, ids[10 : 10 + n])
        backend.crop(state, 10)
        steps = torch.cat([backend.forward(state, ids[i : i + 1]) for i in range(10, 10 + n)])
        assert torch.equal(block, steps) and torch.equal(block, logits[10 : 10 + n]), n
    backend.crop(state, 4)  # rollback across what the steps wrote
    assert torch.equal(backend.forward(state, ids[4:7]), logits[4:7])


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("weights", WEIGHTS)
def test_a_prefill_keeping_fewer_rows_gives_their_bits_and_a_whole_cache(models, arch, weights):
    """The last layer goes on with the kept rows only (its keys and values written for all): the kept logits are the
    whole prefill's, and the next step after it, whatever was kept, is the step after the whole prefill."""
    _, backend = models(arch, weights)
    ids = random_prompt(7, 20)
    whole_state, whole = backend.prefill(Prompt(ids[:19]), ids[:19], keep=19)
    after = backend.forward(whole_state, ids[19:20])
    for keep in (0, 1, 4, 18):
        state, logits = backend.prefill(Prompt(ids[:19]), ids[:19], keep=keep)
        assert (logits is None) if keep == 0 else torch.equal(logits, whole[19 - keep :]), keep
        assert torch.equal(backend.forward(state, ids[19:20]), after), keep


@pytest.mark.parametrize("weights", WEIGHTS)
def test_the_mlp_in_slabs_of_rows_gives_the_same_bits(models, weights, monkeypatch):
    """A long prompt's MLP runs a slab of rows at a time (its outputs stay under glibc's mmap threshold, gate_up in a
    workspace kept between calls): any slab size gives the one-pass logits, and the cache the next step reads."""
    from specdec.backends import packed as packed_module

    _, backend = models("qwen2", weights)
    ids = random_prompt(9, 30)
    state, whole = backend.prefill(Prompt(ids[:29]), ids[:29], keep=29)
    after = backend.forward(state, ids[29:30])
    monkeypatch.setattr(packed_module, "MLP_SLAB_BYTES", 1)  # 8 rows a slab: 29 rows in four
    state, slabbed = backend.prefill(Prompt(ids[:29]), ids[:29], keep=29)
    assert torch.equal(slabbed, whole) and torch.equal(backend.forward(state, ids[29:30]), after)
    assert backend._local.gate_up.shape[1] == backend.layers[0].gate_up.out_features


@pytest.mark.parametrize("weights", WEIGHTS)
def test_a_long_prompt_in_chunks_of_rows_gives_the_same_bits(models, weights, monkeypatch):
    """Past PREFILL_CHUNK rows a prompt (or block) runs in chunks, each after the cache the ones before wrote: the
    kept rows' logits, wherever they fall, and the next step are the one pass's."""
    from specdec.backends import packed as packed_module

    _, backend = models("llama", weights)
    ids = random_prompt(11, 30)
    whole_state, whole = backend.prefill(Prompt(ids[:29]), ids[:29], keep=29)
    after = backend.forward(whole_state, ids[29:30])
    monkeypatch.setattr(packed_module, "PREFILL_CHUNK", 7)  # 29 rows: 7, 7, 7, 7, 1
    for keep in (29, 10, 1, 0):
        state, logits = backend.prefill(Prompt(ids[:29]), ids[:29], keep=keep)
        assert (logits is None) if keep == 0 else torch.equal(logits, whole[29 - keep :]), keep
        assert torch.equal(backend.forward(state, ids[29:30]), after), keep
    state, _ = backend.prefill(Prompt(ids[:3]), ids[:3], keep=1)
    assert torch.equal(backend.forward(state, ids[3:29]), whole[3:29])  # a long block after a cache, all rows kept


def python_layers(backend, states, blocks, keeps):
    """The decoder's layers as a Python loop over the kernels, one call an op (the loop the C++ Decoder replaced):
    each block's kept rows' logits, each state's cache written and its length advanced."""
    ops, sizes = backend.ops, [b.numel() for b in blocks]
    caches = [backend._reserve(s, s.length + n) for s, n in zip(states, sizes)]
    x = backend._embedded(torch.cat(blocks))
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    rows = torch.cat([torch.arange(start + n - keep, start + n) for start, n, keep in zip(starts, sizes, keeps)])

    def linear(x, p, residual=None):
        if p.kind == "int4":
            return ops.linear_int4(x, p.weight, p.scale, p.bias, residual, p.out_features, p.in_features, p.group)
        return ops.linear_int8(x, p.weight, p.scale, p.bias, residual, p.out_features, p.in_features)

    for index, layer in enumerate(backend.layers):
        qkv = linear(ops.rms_norm(x, layer.input_norm, backend.eps), layer.qkv)
        attended = torch.cat([ops.attention(qkv[start : start + n], kv[index, 0], kv[index, 1], s.length, backend.cos,
                                            backend.sin, backend.heads, backend.kv_heads, backend.scaling)
                              for s, kv, start, n in zip(states, caches, starts, sizes)])
        if index == len(backend.layers) - 1:
            if not rows.numel():
                break
            attended, x = attended[rows].contiguous(), x[rows].contiguous()
        x = linear(attended, layer.o, residual=x)
        x = linear(ops.silu_mul(linear(ops.rms_norm(x, layer.post_norm, backend.eps), layer.gate_up)), layer.down,
                   residual=x)
    for s, n in zip(states, sizes):
        s.length += n
    logits = linear(ops.rms_norm(x, backend.norm, backend.eps), backend.head) if rows.numel() else None
    return [None if logits is None or not keep else part for keep, part in zip(keeps, logits.split(keeps) if
                                                                               logits is not None else keeps)]


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("weights", WEIGHTS)
def test_the_layers_in_one_cpp_call_are_the_python_loops_bits(models, arch, weights):
    """The C++ Decoder (the layers in one call) computes what a Python loop calling the same kernels one op at a time
    computes, bit for bit: logits and every cached key and value, for a prefill, steps, blocks of 2-9 rows, any kept
    rows (none included) and several sessions' blocks in one pass."""
    from specdec.backends.packed import PackedState

    _, backend = models(arch, weights)
    ids = random_prompt(13, 40)
    cases = [([(0, 0, 17)], [17]), ([(0, 0, 17)], [3]), ([(0, 0, 17)], [0])]  # (length, first id, size) a session
    cases += [([(17, 17, n)], [n]) for n in range(1, 10)]
    cases += [([(17, 17, 5), (6, 6, 1), (30, 30, 9)], [5, 1, 2]), ([(17, 17, 5), (6, 6, 3)], [0, 0])]
    for sessions, keeps in cases:
        ours, theirs = [], []
        for length, _, _ in sessions:  # each session's prefix, cached alike for both
            state = backend.prefill(Prompt(ids[:length]), ids[:length])[0] if length else PackedState(0)
            ours.append(state)
            theirs.append(copy.deepcopy(state))
        blocks = [ids[first : first + n] for _, first, n in sessions]
        got = backend.forward_batch(ours, blocks, keeps)
        want = python_layers(backend, theirs, blocks, keeps)
        for g, w in zip(got, want):
            assert (g is None and w is None) or torch.equal(g, w), (sessions, keeps)
        for a, b in zip(ours, theirs):
            assert a.length == b.length and (a.kv is None) == (b.kv is None)
            if a.kv is not None:
                assert torch.equal(a.kv[:, :, : a.length], b.kv[:, :, : b.length]), (sessions, keeps)


@pytest.mark.parametrize("weights", WEIGHTS)
def test_sessions_batched_in_one_forward_get_their_own_logits_bit_for_bit(models, weights):
    _, backend = models("qwen2", weights)
    ids = random_prompt(5, 30)
    _, logits = backend.prefill(Prompt(ids), ids, keep=30)
    states = [backend.prefill(Prompt(ids[:n]), ids[:n])[0] for n in (3, 12, 20, 1)]
    blocks = [ids[3:8], ids[12:13], ids[20:23], ids[1:10]]
    out = backend.forward_batch(states, blocks, [5, 1, 2, 9])
    assert torch.equal(out[0], logits[3:8]) and torch.equal(out[1], logits[12:13])
    assert torch.equal(out[2], logits[21:23]) and torch.equal(out[3], logits[1:10])
    assert [s.length for s in states] == [8, 13, 23, 10]


@pytest.mark.parametrize("kind", WEIGHTS)
@pytest.mark.parametrize("shape", [(100, 200), (37, 1000), (16, 64), (1, 33)])
def test_packing_in_slabs_gives_the_bytes_of_the_whole_matrix_at_once(monkeypatch, kind, shape):
    """pack packs a slab of rows at a time (its temporaries stay in cache): slabs of one 16-row block, of two, and one
    slab over everything give the same bytes and scales, with all-zero groups and rows past N padded."""
    from specdec.kernels import pack

    torch.manual_seed(1)
    weight = torch.randn(*shape).to(torch.bfloat16)
    weight[0, : min(shape[1], 40)] = 0  # an all-zero int4 group: scale 0, nibbles 8
    weight[-1] = 0  # an all-zero row
    packed = {}
    for slab in (pack.COLS, 2 * pack.COLS, 1 << 20):
        monkeypatch.setattr(pack, "SLAB", slab)
        packed[slab] = getattr(pack, kind)(weight)
    whole = packed.pop(1 << 20)
    for each in packed.values():
        assert torch.equal(each.weight, whole.weight) and torch.equal(each.scale, whole.scale)
        assert each.scale.dtype == whole.scale.dtype
    assert whole.weight.numel() == -(-shape[0] // 16) * 16 * -(-shape[1] // (32 if kind == "int4" else 4)) * (
        32 if kind == "int4" else 4) // (2 if kind == "int4" else 1)


@pytest.mark.parametrize("ids", [list(range(40)), [3], list(range(100)), [*range(33), 50, 99], [1, 17, 60]])
def test_rows_of_an_int8_linear_are_its_outputs_bit_for_bit(ops, ids):
    """pack.rows: a leading run of whole 16-row blocks copied, the other rows gathered into blocks of their own."""
    from specdec.kernels import pack

    packed, run = packed_linear(ops, "int8", 100, 72)
    x = torch.randn(5, 72)
    index = torch.tensor(ids)
    part = pack.rows(packed, index)
    out = ops.linear_int8(x, part.weight, part.scale, part.bias, None, part.out_features, part.in_features)
    assert part.out_features == len(ids) and torch.equal(out, run(x)[:, index])
    with pytest.raises(ValueError, match="rows are gathered from an int8 Linear, got int4"):
        pack.rows(packed_linear(ops, "int4", 100, 64)[0], index)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("weights", WEIGHTS)
def test_a_head_over_some_ids_gives_their_bits_and_minus_infinity_elsewhere(models, arch, weights):
    """with_head_rows: prefills, blocks, batches and trees of the view give the whole head's logits at its rows, bit for
    bit, and -inf at the others; its states are the backend's (a view's cache continues in the whole backend)."""
    from specdec.core.tree import TokenTree
    from specdec.errors import InputError

    _, backend = models(arch, weights)
    vocab = backend.vocab_size
    rows = torch.tensor([*range(18), 40, 77, vocab - 1])
    outside = torch.ones(vocab, dtype=torch.bool)
    outside[rows] = False
    view = backend.with_head_rows(rows[torch.randperm(len(rows))])  # any order: kept sorted
    assert backend.head_rows is None and torch.equal(view.head_rows, rows)
    ids = random_prompt(13, 20)
    _, whole = backend.prefill(Prompt(ids), ids, keep=20)
    state, part = view.prefill(Prompt(ids[:12]), ids[:12], keep=12)
    assert torch.equal(part[:, rows], whole[:12, rows]) and torch.isneginf(part[:, outside]).all()
    block = view.forward(state, ids[12:20])
    assert torch.equal(block[:, rows], whole[12:20, rows]) and torch.isneginf(block[:, outside]).all()
    backend.crop(state, 12)
    assert torch.equal(backend.forward(state, ids[12:20]), whole[12:20])
    states = [view.prefill(Prompt(ids[:n]), ids[:n])[0] for n in (3, 9)]
    batched = view.forward_batch(states, [ids[3:6], ids[9:10]], [3, 1])
    assert torch.equal(batched[0][:, rows], whole[3:6, rows]) and torch.equal(batched[1][:, rows], whole[9:10, rows])
    state, _ = view.prefill(Prompt(ids[:5]), ids[:5])
    tree = TokenTree(ids[6:8].clone(), (-1, 0))  # a chain of two nodes after the block ids[5:6]
    logits = view.forward_tree(state, ids[5:6], tree)
    assert torch.equal(logits[:, rows], whole[5:8, rows]) and torch.isneginf(logits[:, outside]).all()
    for bad in (torch.tensor([], dtype=torch.long), torch.tensor([vocab]), torch.tensor([-1, 3])):
        with pytest.raises(InputError, match=rf"head rows must be ids in 0\.\.{vocab - 1} of .*'s head, at least one"):
            backend.with_head_rows(bad)


@pytest.mark.parametrize("runtime", ["kernels-int8", "kernels-int4"])
def test_an_edge_drafting_from_fewer_ids_proposes_only_those_and_greedy_stays_the_clouds(pair, plain, runtime):
    """`head_vocab=N` on the model drafter (and the hybrid's): the edge's head computes the ids below N, the prompt's
    and its end-of-text ids; every draft is one of them, and greedy speculation is still the cloud's own decoding."""
    from specdec.core.drafters.interface import DraftContext
    from specdec.core.drafters.model import ModelDrafter, head_rows
    from specdec.core.processors import Constraints
    from specdec.core.session import AcceptedSequence

    spec = Engine(mode="spec", edge=pair["edge"], cloud=pair["cloud"], cloud_runtime=runtime, edge_runtime=runtime,
                  dtype="float32", decode=DecodeConfig(max_new_tokens=16),
                  spec=SpecConfig(k=3, entropy_threshold=0, policy="greedy", drafter="model", drafter_options="head_vocab=20"),
                  **QUIET)
    generations = [spec.generate(text) for text in PLAIN_TEXTS]
    edge = spec.model("edge").backend
    spec.close()
    assert [g.tokens for g in generations] == plain(runtime)
    prompt = Prompt(torch.tensor([30, 31, 45, 2, 5]))
    context = DraftContext(prompt, edge.vocab_size, Constraints(), 0.0, torch.Generator(), edge, options={"head_vocab": 20})
    allowed = set(head_rows(context, 20).tolist())
    assert allowed == set(range(20)) | {30, 31, 45} | {i for i in edge.eos_ids if i < edge.vocab_size}
    drafter = ModelDrafter(context)
    drafted = set(drafter.propose(AcceptedSequence(prompt.input_ids, 32), 8).tokens.tolist())
    assert drafted and drafted <= allowed
    assert {c.extra_kind for g in generations for c in g.cycles} & {"correction", "bonus"}


@pytest.mark.parametrize("runtime", ["kernels-int8", "kernels-int4"])
@pytest.mark.parametrize("drafter", ["model", "prompt-lookup"])
def test_greedy_spec_verified_in_vnni_is_its_own_plain_decoding(pair, plain, runtime, drafter):
    """Every path ran with the model drafter (corrections and bonuses); the edge also runs in vnni (the kernels serve
    the drafting role)."""
    spec = Engine(mode="spec", edge=pair["edge"], cloud=pair["cloud"], cloud_runtime=runtime, edge_runtime=runtime,
                  dtype="float32", decode=DecodeConfig(max_new_tokens=16),
                  spec=SpecConfig(k=3, entropy_threshold=0, policy="greedy", drafter=drafter), **QUIET)
    generations = [spec.generate(text) for text in PLAIN_TEXTS]
    assert spec.model("cloud").runtime == runtime
    spec.close()
    assert [g.tokens for g in generations] == plain(runtime)
    if drafter == "model":
        assert {"correction", "bonus"} <= {c.extra_kind for g in generations for c in g.cycles}


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("streams", [1, 3, 8])
def test_the_bandwidth_read_reads_every_line_once(ops, threads, streams):
    """stream_read's interleaved streams and the lines past them cover the buffer: one marked line anywhere (first,
    inside a stream, the tail past the streams, last) shows in the result, and two copies of it cancel (XOR)."""
    lines = 8 * 5 * threads + 3  # a share of 40 lines a thread (5 to 40 a stream) and 3 more
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for line in (0, 7, lines // 2, lines - 2, lines - 1):
            buffer = torch.zeros(lines * 8, dtype=torch.int64)
            buffer[line * 8:(line + 1) * 8] = torch.arange(1, 9)
            assert ops.stream_read(buffer, streams) == 36, line
            buffer[(line + 1) % lines * 8:((line + 1) % lines + 1) * 8] = torch.arange(1, 9)
            assert ops.stream_read(buffer, streams) in (0, 72), line  # cancelled in one thread's lanes, or summed in two
    finally:
        torch.set_num_threads(previous)


def test_the_bandwidth_read_refuses_no_streams(ops):
    with pytest.raises(RuntimeError, match="at least one stream"):
        ops.stream_read(torch.zeros(8, dtype=torch.int64), 0)


NO_PATH = ("the kernels runtimes need AVX2 (with FMA and F16C), AVX-512 VNNI or ARM NEON with dotprod, which this CPU "
           f"lacks: {exact_elsewhere()} (SPECBENCH_KERNELS=reference runs them exactly, slowly)")


def test_a_cpu_without_any_vector_path_is_one_line(monkeypatch):
    monkeypatch.delenv("SPECBENCH_KERNELS", raising=False)
    with pytest.raises(KernelError) as caught:
        chosen_path(frozenset({"sse4_2", "avx", "f16c"}), "x86_64")  # AVX without AVX2: a Sandy Bridge
    assert str(caught.value) == NO_PATH
    assert chosen_path(frozenset({"avx2", "fma", "f16c"}), "x86_64") == "avx2"
    assert chosen_path(frozenset({"avx2", "fma", "f16c", "avx_vnni"}), "x86_64") == "avx-vnni"
    assert chosen_path(frozenset({"fp", "asimd", "asimddp"}), "aarch64") == "neon"
    with pytest.raises(KernelError):  # ARMv8.0 NEON without dotprod
        chosen_path(frozenset({"fp", "asimd"}), "aarch64")


def test_a_forced_path_is_checked_against_the_cpu_in_one_line(monkeypatch):
    monkeypatch.setenv("SPECBENCH_KERNELS", "neon")
    with pytest.raises(KernelError, match=r"^SPECBENCH_KERNELS=neon needs NEON with dotprod, which this CPU lacks: "
                                          r"unset it or use one of avx2, reference$"):
        chosen_path(frozenset({"avx2", "fma", "f16c"}), "x86_64")
    monkeypatch.setenv("SPECBENCH_KERNELS", "avx3")
    with pytest.raises(KernelError, match=r"^unknown SPECBENCH_KERNELS='avx3': use one of avx512-vnni, avx-vnni, "
                                          r"avx2, neon, reference, or unset it$"):
        chosen_path(frozenset({"avx2", "fma", "f16c"}), "x86_64")
    monkeypatch.setenv("SPECBENCH_KERNELS", "reference")
    assert chosen_path(frozenset({"sse4_2"}), "x86_64") == "reference"


@pytest.mark.subprocess
def test_choosing_the_kernels_on_a_cpu_without_a_path_is_one_line_before_anything_loads(pair, prompts, tmp_path):
    code = ("import sys, specdec.kernels as k\n"
            "k._cpuinfo = lambda: ('an old CPU', frozenset({'sse4_2'}))  # as on a CPU without AVX2\n"
            "from bench.cli import main; sys.exit(main(sys.argv[1:]))")
    run = ["run", "--mode", "cloud", "--cloud", pair["cloud"], "--prompts", prompts, "--dtype", "float32",
           "--max-new-tokens", "3", "--limit", "1", "--cloud-runtime", "kernels-int4", "--out", str(tmp_path / "a")]
    result = subprocess.run([sys.executable, "-c", code, *run], capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [f"error: {NO_PATH}"]


@pytest.mark.subprocess
def test_no_compiler_to_build_the_kernels_is_one_line(tmp_path):
    """A machine whose kernels are not built yet and that has no C++ compiler: the fix named, nothing built."""
    code = "from specdec.kernels import kernels\nkernels()"
    env = {**__import__("os").environ, "TORCH_EXTENSIONS_DIR": str(tmp_path / "ext"), "CXX": "no-such-c++"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode != 0
    assert ("KernelError: the kernels runtimes build their kernels once with a C++ compiler, and 'no-such-c++' is not on "
            f"PATH: install one (apt-get install g++) or set CXX, or {exact_elsewhere()}") in result.stderr
    assert not list((tmp_path / "ext").rglob("*.so"))


def test_another_architecture_is_one_line():
    from specdec.backends.packed import PackedBackend

    with pytest.raises(ModelError, match=rf"^runtime kernels runs qwen2, llama decoders, not 'gemma3_text': "
                                         rf"{exact_elsewhere()}$"):
        PackedBackend.from_model(tiny_causal("gemma3"), "int8")


@pytest.mark.server
def test_greedy_spec_through_a_vnni_server_is_its_plain_decoding(pair, plain):
    from specdec.models.loading import load_model
    from specdec.remote.background import BackgroundServer

    cloud = load_model(pair["cloud"], "float32", runtime="kernels-int4", **QUIET)
    with BackgroundServer(cloud) as url:
        spec = Engine(mode="spec", edge=pair["edge"], cloud_url=url, dtype="float32",
                      decode=DecodeConfig(max_new_tokens=16), spec=SpecConfig(k=3, entropy_threshold=0, policy="greedy"),
                      **QUIET)
        tokens = [spec.generate(text).tokens for text in PLAIN_TEXTS]
        spec.close()
    assert tokens == plain("kernels-int4")
