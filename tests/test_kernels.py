"""The same logits on every processor: each instruction-set path of specdec/kernels that this machine can run
reproduces the scalar reference bit for bit, kernel by kernel (Linears int8 and int4 with K and N off the packing's
multiples, int4 rows whose K mod 32 is 1..15, rows of 1 to 9, norms, the gated activation at exp's clamps,
attention with grouped heads) and model by model (tiny Llama and Qwen2, int8 and int4: prefills, blocks 1-9, crops,
batched sessions). On an AVX-512 VNNI machine that is avx512-vnni, avx-vnni (its EVEX encoding) and avx2; on an
AVX2-only one avx2. The ARM path runs against the reference under qemu-user (the torch-free driver, driver.py)."""
from __future__ import annotations

import os
import platform

import pytest
import torch

from specdec.kernels import KernelError, driver, runnable_paths
from tests.tiny import tiny_causal

VECTOR_PATHS = [p for p in runnable_paths() if p != "reference"]
pytestmark = pytest.mark.skipif(not VECTOR_PATHS, reason="this CPU has no vector path of the kernels")
WEIGHTS = ["int8", "int4"]


@pytest.fixture(scope="module")
def reference():
    from specdec.kernels import kernels

    return kernels("reference")


@pytest.fixture(scope="module", params=VECTOR_PATHS)
def path_ops(request):
    from specdec.kernels import kernels

    return kernels(request.param)


def test_every_path_this_cpu_has_is_exercised():
    """The paths held to the reference here follow from the CPU's flags (an AVX-512 VNNI CPU runs all three x86
    paths), and the chosen one is the first of them; .ci/run prints this list."""
    from specdec.kernels import chosen_path
    from specdec.machine import _cpuinfo

    flags = _cpuinfo()[1]
    if platform.machine() == "x86_64" and {"avx2", "fma", "f16c"} <= flags:
        assert "avx2" in VECTOR_PATHS
        if {"avx512vl", "avx512_vnni", "avx512bw"} <= flags:
            assert VECTOR_PATHS == ["avx512-vnni", "avx-vnni", "avx2"]
    if os.environ.get("SPECBENCH_KERNELS") is None:
        assert chosen_path() == VECTOR_PATHS[0]


def linear(ops, packed, x, residual=None):
    if packed.kind == "int8":
        return ops.linear_int8(x, packed.weight, packed.scale, packed.bias, residual, packed.out_features,
                               packed.in_features)
    return ops.linear_int4(x, packed.weight, packed.scale, packed.bias, residual, packed.out_features,
                           packed.in_features, packed.group)


@pytest.mark.parametrize("kind", WEIGHTS)
@pytest.mark.parametrize("shape", [(37, 200), (48, 64), (300, 96), (16, 33), (20, 47), (24, 1), (33, 1000), (40, 2500)])
def test_linears_equal_the_reference_bit_for_bit(reference, path_ops, kind, shape):
    from specdec.kernels import pack

    n, k = shape
    torch.manual_seed(n * k)
    weight, bias = torch.randn(n, k), torch.randn(n)
    packed = pack.int4(weight, bias) if kind == "int4" else pack.int8(weight, bias)
    for rows in (1, 2, 5, 9, 11):
        x = torch.randn(rows, k)
        x[0] *= 50  # an outlying row
        if rows > 2:
            x[2] = 0  # an all-zero row
        residual = torch.randn(rows, n)
        assert torch.equal(linear(path_ops, packed, x, residual), linear(reference, packed, x, residual)), rows
        assert torch.equal(linear(path_ops, packed, x), linear(reference, packed, x)), rows


def test_norm_activation_and_attention_equal_the_reference_bit_for_bit(reference, path_ops):
    torch.manual_seed(0)
    for rows, width in ((1, 8), (3, 37), (5, 200), (2, 1536)):
        x, weight = torch.randn(rows, width) * 3, torch.randn(width)
        assert torch.equal(path_ops.rms_norm(x, weight, 1e-6), reference.rms_norm(x, weight, 1e-6))
        gate_up = torch.randn(rows, 2 * width) * 8
        gate_up[0, :4] = torch.tensor([-95.0, 120.0, -87.5, 104.0])[: min(4, width)]  # exp's clamps
        assert torch.equal(path_ops.silu_mul(gate_up), reference.silu_mul(gate_up))
    # rows past one task's tile (kernels.h's ATTENTION_ROWS) and keys past one block of 16; the 1.5B's 12/2 heads
    for heads, kv_heads, dim in ((4, 2, 16), (2, 1, 64), (2, 2, 128), (12, 2, 128)):
        cos, sin = torch.randn(64, dim), torch.randn(64, dim)
        for start, rows in ((0, 1), (0, 7), (13, 1), (20, 9), (0, 17), (30, 20)):
            qkv = torch.randn(rows, (heads + 2 * kv_heads) * dim)
            outs = []
            for ops in (path_ops, reference):
                cache_k, cache_v = torch.randn(64, kv_heads, dim), torch.randn(64, kv_heads, dim)
                torch.manual_seed(start)  # the same earlier keys for both
                cache_k[:start], cache_v[:start] = torch.randn(start, kv_heads, dim), torch.randn(start, kv_heads, dim)
                outs.append(ops.attention(qkv, cache_k, cache_v, start, cos, sin, heads, kv_heads, dim ** -0.5))
            assert torch.equal(outs[0], outs[1]), (heads, kv_heads, dim, start, rows)


def test_the_bandwidth_read_reads_the_same_on_every_path(reference, path_ops):
    buffer = torch.arange(8 * 53, dtype=torch.int64) * 2654435761
    for streams in (1, 3, 8):
        assert path_ops.stream_read(buffer, streams) == reference.stream_read(buffer, streams)


@pytest.fixture(scope="module")
def models():
    torch.manual_seed(0)
    return {arch: tiny_causal(arch) for arch in ("llama", "qwen2")}


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("weights", WEIGHTS)
def test_a_models_logits_are_the_same_bits_on_every_path(models, arch, weights):
    """Prefill, blocks of 1 to 9 rows, a crop and a block again, and two sessions batched in one forward: the
    reference and every vector path give identical logits."""
    from specdec.backends.packed import PackedBackend
    from specdec.backends.prompt import Prompt

    backends = {p: PackedBackend.from_model(models[arch], weights, path=p) for p in ["reference", *VECTOR_PATHS]}
    vocab = backends["reference"].vocab_size
    generator = torch.Generator().manual_seed(1)
    prompt_ids = torch.randint(0, vocab, (11,), generator=generator)
    blocks = [torch.randint(0, vocab, (n,), generator=generator) for n in range(1, 10)]
    other = torch.randint(0, vocab, (6,), generator=generator)
    seen = {}
    for name, backend in backends.items():
        state, logits = backend.prefill(Prompt(prompt_ids), prompt_ids, keep=prompt_ids.numel())
        out = [logits]
        for block in blocks:
            out.append(backend.forward(state, block, keep=block.numel()))
        backend.crop(state, prompt_ids.numel() + 3)
        out.append(backend.forward(state, blocks[4], keep=5))
        second, _ = backend.prefill(Prompt(other), other, keep=0)
        out.extend(backend.forward_batch([state, second], [blocks[2], blocks[3]], [3, 4]))
        seen[name] = out
    for name in VECTOR_PATHS:
        for i, (mine, theirs) in enumerate(zip(seen[name], seen["reference"])):
            assert torch.equal(mine, theirs), (name, i)


def test_each_x86_path_passes_the_torch_free_driver():
    """The driver (csrc/driver.cpp) compares each path with the reference without torch: the harness the ARM path
    runs under emulation, run natively here for every path this CPU has."""
    for path in VECTOR_PATHS:
        result = driver.run(path, timeout_s=300)
        assert result.returncode == 0, result.stdout[-2000:]
        assert result.stdout.strip().endswith(", 0 failed"), result.stdout[-500:]


def test_the_driver_fails_on_sources_that_do_not_build_and_skips_a_missing_tool(monkeypatch, capsys):
    def broken(path, **_):
        raise driver.BuildFailed("compiling the kernel driver failed (kernels.h:1: error: x): c++ ...")

    def absent(path, **_):
        raise KernelError("testing the neon path here needs qemu-aarch64: apt-get install g++-aarch64-linux-gnu qemu-user")

    monkeypatch.setattr(driver, "run", broken)
    assert driver.main(["avx2"]) == 1 and capsys.readouterr().out.startswith("avx2: failed: compiling")
    monkeypatch.setattr(driver, "run", absent)
    assert driver.main(["neon"]) == 0 and capsys.readouterr().out.startswith("neon: skipped: testing the neon path")


def test_the_neon_path_equals_the_reference_under_emulation():
    """NEON with dotprod, built with Debian's cross compiler and run under qemu-aarch64: every kernel bit for bit.
    CI installs both (.ci/run) and sets SPECBENCH_REQUIRE_CROSS=1, so a missing toolchain fails there."""
    try:
        result = driver.run("neon", timeout_s=300)
    except driver.BuildFailed:
        raise  # the sources, not the machine: never a skip
    except KernelError as e:
        if os.environ.get("SPECBENCH_REQUIRE_CROSS"):
            raise
        pytest.skip(str(e))
    assert result.returncode == 0, result.stdout[-2000:]
    passed = result.stdout.strip().splitlines()[-1]
    assert passed.startswith("neon: ") and passed.endswith(", 0 failed"), passed
    print(passed)


@pytest.mark.subprocess
def test_a_build_killed_mid_way_does_not_hang_the_next_process():
    """torch's builder leaves its `lock` file when a build dies (SIGTERM, SIGKILL, the OOM killer) and waits on it
    forever; a process that finds one under the kernels' flock removes it and loads. The dead build here is its
    lock file alone (a process that created it and died): the next process returns, and the file is gone."""
    import subprocess
    import sys

    from specdec.kernels import build_dir, chosen_path, kernels

    kernels()  # built (or loaded) here first, so the child only checks and loads
    baton = build_dir(chosen_path()) / "lock"
    subprocess.run([sys.executable, "-c", f"import os; os.open({str(baton)!r}, os.O_CREAT | os.O_EXCL); os._exit(9)"],
                   check=False)
    assert baton.exists()
    child = subprocess.run([sys.executable, "-c", "from specdec.kernels import kernels; print(kernels().path)"],
                           capture_output=True, text=True, timeout=600)
    assert child.returncode == 0, child.stderr[-2000:]
    assert child.stdout.strip() == chosen_path() and not baton.exists()
