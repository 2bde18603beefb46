"""Benchmarks of the split deployment (figures go to `extra_info`; nothing here asserts a time).

    pytest bench/test_bench_split.py --benchmark-only -s                    # tiny pair + real pair
    pytest bench/test_bench_split.py --benchmark-only -m "not realmodel"   # tiny pair only

- protocol overhead per verify call on loopback, no shaping (server time excluded);
- measured vs modelled link time per generation on the `4g` and `wifi` presets;
- split (server pinned to core 1, edge to core 0) vs in-process (both cores) tokens/s on `code`,
  interleaved prompt by prompt so drift hits both alike;
- whether the two cores are independent: a cloud forward on core 1 alone and beside the edge.
"""
from __future__ import annotations

import multiprocessing
import statistics
import time

import pytest
import torch
from transformers import DynamicCache

from bench.core.network import NO_LINK, profile
from bench.core.prompts import load_prompts
from bench.derive.split_timing import call_overheads_s, modelled_link_s
from bench.measure.caps import pin_cores
from bench.measure.launch import ServerProcess
from bench.measure.link import BackgroundLink
from bench.measure.workload import CLOUD_ALIAS, EDGE_ALIAS
from specdec.backends.hf_util import cache_kwarg
from specdec.core.config import DecodeConfig, DeployConfig, SpecConfig
from specdec.engine import Engine
from specdec.models.loading import load, load_model
from specdec.models.registry import is_fetched
from specdec.remote.background import BackgroundServer
from specdec.settings import DType, Mode

GREEDY = SpecConfig(k=4, entropy_threshold=0.0, policy="greedy")


def quantiles(values: list[float]) -> dict:
    q = statistics.quantiles(values, n=10)
    return {"p50": statistics.median(values), "p10": q[0], "p90": q[-1], "n": len(values)}


def split_engine(edge: str, url: str, dtype: DType, max_new_tokens: int, loader=load, overlap: bool = True) -> Engine:
    return Engine(mode=Mode.SPEC, edge=edge, cloud_url=url, dtype=dtype, spec=GREEDY,
                  decode=DecodeConfig(max_new_tokens=max_new_tokens), deploy=DeployConfig(overlap=overlap),
                  loader=loader, log=lambda m: None)


def test_protocol_overhead_tiny(benchmark, tiny_pair):
    """Loopback, no shaping, tiny pair: what one verify costs beyond the server's own time."""
    models = tiny_pair.models
    with BackgroundServer(models["cloud"]) as url:
        engine = split_engine(models["edge"].location, url, DType.FLOAT32, 32, overlap=False)
        engine.load()
        generations = benchmark.pedantic(lambda: [engine.generate(t) for t in tiny_pair.workload.prompts],
                                         rounds=5, warmup_rounds=1, iterations=1)
        engine.close()
    overhead = quantiles([s * 1e3 for s in call_overheads_s(generations)])
    benchmark.extra_info.update({"protocol_overhead_ms": overhead})
    print(f"\nprotocol overhead per call (tiny, loopback): p50 {overhead['p50']:.3f} ms "
          f"(p10 {overhead['p10']:.3f}, p90 {overhead['p90']:.3f}, n={overhead['n']})")


@pytest.fixture(scope="module")
def real_cloud_url():
    if not (is_fetched(EDGE_ALIAS) and is_fetched(CLOUD_ALIAS)):
        pytest.skip(f"real pair not fetched: run `specbench models fetch {EDGE_ALIAS} {CLOUD_ALIAS}`")
    with ServerProcess(CLOUD_ALIAS, "bfloat16", "1") as url:
        yield url


@pytest.mark.realmodel
@pytest.mark.parametrize("preset", [NO_LINK, "4g", "wifi"])
def test_real_link(benchmark, real_cloud_url, preset):
    """none: protocol overhead on loopback; 4g / wifi: measured link time vs the model's."""
    pin_cores([0])
    texts = [r.prompt for r in load_prompts("code")[:3]]
    host, port = real_cloud_url.rsplit(":", 1)
    network = profile(preset)
    with BackgroundLink(network, (host, int(port))) as url:
        # Sequential: the link is measured alone, not beside drafting ahead on the edge's one core.
        engine = split_engine(EDGE_ALIAS, url if preset != NO_LINK else real_cloud_url, DType.BFLOAT16, 32, overlap=False)
        engine.load()
        generations = benchmark.pedantic(lambda: [engine.generate(t) for t in texts], rounds=1, iterations=1)
        engine.close()
    pin_cores([0, 1])
    overhead = quantiles([s * 1e3 for s in call_overheads_s(generations)])
    ratios = [g.link_s / modelled_link_s(g, network) for g in generations] if preset != NO_LINK else []
    info = {"preset": preset, "call_overhead_ms": overhead, "link_s": [g.link_s for g in generations],
            "modelled_link_s": [modelled_link_s(g, network) for g in generations], "measured_over_modelled": ratios}
    benchmark.extra_info.update(info)
    print(f"\n{preset}: per-call overhead p50 {overhead['p50']:.2f} ms (p90 {overhead['p90']:.2f}); "
          + (f"measured/modelled link time {min(ratios):.3f}-{max(ratios):.3f}" if ratios else ""))


@pytest.mark.realmodel
def test_real_split_vs_inproc(benchmark, real_cloud_url):
    """`code` prompts, 32 tokens, alternating per prompt: in-process on cores 0-1 (2 threads) and
    split with the edge on core 0 and the server on core 1."""
    texts = [r.prompt for r in load_prompts("code")[:6]]
    loader = cached_loader()  # one copy of the edge weights for both engines
    inproc = Engine(mode=Mode.SPEC, edge=EDGE_ALIAS, cloud=CLOUD_ALIAS, dtype="bfloat16", spec=GREEDY,
                    decode=DecodeConfig(max_new_tokens=32), loader=loader, log=lambda m: None)
    split = split_engine(EDGE_ALIAS, real_cloud_url, DType.BFLOAT16, 32, loader)
    placements = {"inproc": ([0, 1], inproc), "split": ([0], split)}
    for _, engine in placements.values():
        engine.load()
    rates: dict[str, list[float]] = {name: [] for name in placements}
    tokens: dict[str, list] = {name: [] for name in placements}

    def one_pass():
        for text in texts:
            for name, (cores, engine) in placements.items():
                pin_cores(cores)
                generation = engine.generate(text)
                rates[name].append(generation.new_tokens / generation.decode_s)
                tokens[name].append(generation.tokens)

    benchmark.pedantic(one_pass, rounds=1, iterations=1)
    pin_cores([0, 1])
    split.close()
    ratio = [s / i for s, i in zip(rates["split"], rates["inproc"])]
    info = {name: quantiles(values) for name, values in rates.items()}
    info["split_over_inproc"] = quantiles(ratio)
    info["same_tokens"] = tokens["split"] == tokens["inproc"]
    benchmark.extra_info.update(info)
    print(f"\nsplit {info['split']['p50']:.2f} tok/s vs in-process {info['inproc']['p50']:.2f} tok/s: "
          f"ratio p50 {info['split_over_inproc']['p50']:.2f} (p10 {info['split_over_inproc']['p10']:.2f}, "
          f"p90 {info['split_over_inproc']['p90']:.2f}); same tokens: {info['same_tokens']}")


def cached_loader():
    loaded = {}

    def loader(name, settings, log=print):
        if (name, settings) not in loaded:
            loaded[(name, settings)] = load(name, settings, log)
        return loaded[(name, settings)]

    return loader


def _decode_on_core_0(stop) -> None:
    """In a child process: the edge model decoding one token at a time on core 0 until `stop`."""
    pin_cores([0])
    model = load_model(EDGE_ALIAS, "bfloat16", log=lambda *_: None).backend.model
    kw, cache = cache_kwarg(model.forward), DynamicCache(config=model.config)  # filled in place
    with torch.inference_mode():
        model(torch.randint(0, 1000, (1, 64)), **{kw: cache}, use_cache=True)
        while not stop.is_set():
            model(torch.randint(0, 1000, (1, 1)), **{kw: cache}, use_cache=True)
            cache.crop(-1)


@pytest.mark.realmodel
def test_real_core_contention(benchmark):
    """Are the two cores independent? A cloud verify-sized forward (5 tokens on a 64-token cache)
    on core 1, alone and while the edge decodes on core 0 in another process."""
    if not (is_fetched(EDGE_ALIAS) and is_fetched(CLOUD_ALIAS)):
        pytest.skip(f"real pair not fetched: run `specbench models fetch {EDGE_ALIAS} {CLOUD_ALIAS}`")
    pin_cores([1])
    model = load_model(CLOUD_ALIAS, "bfloat16", log=lambda *_: None).backend.model

    def forwards(n: int = 12) -> list[float]:
        times = []
        kw, cache = cache_kwarg(model.forward), DynamicCache(config=model.config)  # filled in place
        with torch.inference_mode():
            model(torch.randint(0, 1000, (1, 64)), **{kw: cache}, use_cache=True)
            for _ in range(n):
                start = time.perf_counter()
                model(torch.randint(0, 1000, (1, 5)), **{kw: cache}, use_cache=True)
                cache.crop(-5)
                times.append(time.perf_counter() - start)
        return times

    forwards(3)  # warm-up
    alone, busy = [], []
    context = multiprocessing.get_context("spawn")
    for _ in range(2):  # alternate, so drift hits both
        alone += forwards()
        stop = context.Event()
        edge = context.Process(target=_decode_on_core_0, args=(stop,))
        edge.start()
        time.sleep(10)  # the edge loads and starts decoding
        busy += benchmark.pedantic(forwards, rounds=1, iterations=1) if not busy else forwards()
        stop.set()
        edge.join(30)
    pin_cores([0, 1])
    ratio = statistics.median(busy) / statistics.median(alone)
    benchmark.extra_info.update({"alone_ms": quantiles([t * 1e3 for t in alone]),
                                 "beside_edge_ms": quantiles([t * 1e3 for t in busy]), "slowdown": ratio})
    print(f"\ncloud forward on core 1: alone {statistics.median(alone) * 1e3:.0f} ms, with the edge decoding on "
          f"core 0 {statistics.median(busy) * 1e3:.0f} ms: x{ratio:.2f}")
