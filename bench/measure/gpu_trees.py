"""The GPU check's tree stage (bench/measure/gpu_check.py's --trees-s; docs/gpu.md "Token trees on the GPU"): verify
cycles of a step, chains and token trees through the backends themselves on the architectures of bench/gpu/*.json
with random bf16 weights, written to tree_costs.csv row by row, and how close a tree's rows and a chain's rows are to
the steps after their paths (cost_summary.json's tree_agreement)."""
from __future__ import annotations

import csv
import time
from pathlib import Path

import torch

from bench.derive.gpu_costs import spread
from bench.measure.gpu_timing import CONTEXT, DRY, WARM_UPS, build, timed
from specdec.backends.devices import is_cuda
from specdec.backends.hf_causal import HFCausalBackend
from specdec.backends.prompt import Prompt
from specdec.backends.static_cache import StaticCausalBackend
from specdec.core.tree import TokenTree

# Verify cycles through the backends (specdec/backends/hf_causal.py, static_cache.py): a step, chains of k and token
# trees of `width` disjoint branches `depth` deep (width x depth nodes, one unseen token before them), each cycle's
# cost as the engine pays it (the mask built on the host, forward_tree, commit_path of an empty path, the crop back).
# Up to 31 nodes a tree's rows replay as one captured graph (static_cache.GRAPH_TREE_ROWS); 8 x 6 runs eagerly.
TREE_SHAPES = [("step", 1, 0), ("chain", 1, 4), ("chain", 1, 8), ("chain", 1, 15), ("tree", 2, 4), ("tree", 4, 2),
               ("tree", 8, 1), ("tree", 3, 5), ("tree", 5, 3), ("tree", 15, 1), ("tree", 4, 4), ("tree", 8, 3),
               ("tree", 6, 5), ("tree", 8, 6)]
AGREEMENT_TREE = (4, 4)  # width, depth of the tree whose rows are held against their steps
TREE_CACHES = ("graphs", "dynamic")  # the captured static cache (CUDA only), transformers' DynamicCache eagerly
TREE_COLUMNS = ["gpu", "model", "cache", "shape", "width", "depth", "nodes", "context", "repeats", "median_ms", "p10_ms",
                "p90_ms", "steps", "times_ms"]


def tree_cycle(backend, state, kind: str, width: int, depth: int, context: int, vocab: int):
    """A callable running one verify cycle of `kind` on `state` (CONTEXT positions) and cropping back to them."""
    last = torch.tensor([vocab - 1])
    if kind == "step":
        return lambda: (backend.forward(state, last, keep=1), backend.crop(state, context))
    if kind == "chain":
        block = torch.cat([last, torch.arange(depth) % (vocab - 1)])
        return lambda: (backend.forward(state, block, keep=depth + 1), backend.crop(state, context))
    branches = [[(b * depth + d) % (vocab - 1) for d in range(depth)] for b in range(width)]  # disjoint first tokens
    tree = TokenTree.from_branches(branches, budget=width * depth)

    def run():
        backend.forward_tree(state, last, tree)
        backend.commit_path(state, tree, [])
        backend.crop(state, context)

    return run


def tree_costs(models: list[str], out: Path, device: str, gpu: str | None, dry: bool, deadline: float,
               repeats: int) -> tuple[list[dict], list[dict]]:
    """Append tree_costs.csv rows (TREE_SHAPES per model and cache) until the deadline; -> the rows measured, and per
    model and cache how close a tree's and a chain's rows are to their steps (`agreement`)."""
    context, warm_ups = (DRY["context"], DRY["warm_ups"]) if dry else (CONTEXT, WARM_UPS)
    caches = TREE_CACHES if is_cuda(device) else ("static", "dynamic")  # --dry-run: the static cache eagerly
    measured: list[dict] = []
    agreed: list[dict] = []
    with (out / "tree_costs.csv").open("w", newline="", encoding="utf-8") as sink:
        writer = csv.DictWriter(sink, TREE_COLUMNS)
        writer.writeheader()
        for name in models:
            if time.monotonic() > deadline:
                break
            model = build(name, device, dry)
            vocab = model.config.vocab_size
            ids = torch.randint(0, vocab, (context,), generator=torch.Generator().manual_seed(0))
            for cache in caches:
                backend = HFCausalBackend(model) if cache == "dynamic" else StaticCausalBackend(model, steps=cache)
                with torch.inference_mode():
                    state, _ = backend.prefill(Prompt(ids), ids)
                    step_ms = None
                    for kind, width, depth in TREE_SHAPES:
                        if time.monotonic() > deadline:
                            break
                        run = tree_cycle(backend, state, kind, width, depth, context, vocab)
                        timed(run, device, warm_ups)
                        times = timed(run, device, repeats)
                        median, low, high = spread(times)
                        step_ms = median if kind == "step" else step_ms
                        row = {"gpu": gpu, "model": name, "cache": cache, "shape": kind, "width": width, "depth": depth,
                               "nodes": width * depth, "context": context, "repeats": repeats,
                               "median_ms": round(median, 4), "p10_ms": round(low, 4), "p90_ms": round(high, 4),
                               "steps": round(median / step_ms, 3) if step_ms else None,
                               "times_ms": " ".join(f"{t:.4f}" for t in times)}
                        measured.append(row)
                        writer.writerow(row)
                        sink.flush()
                    if time.monotonic() < deadline:
                        agreed.append({"gpu": gpu, "model": name, "cache": cache,
                                       **agreement(backend, ids, vocab, *AGREEMENT_TREE)})
                del backend, state
            del model
            if is_cuda(device):
                torch.cuda.empty_cache()
    return measured, agreed


def step_after(backend, ids: torch.Tensor, path: list[int]) -> torch.Tensor:
    """The logits of the one-token step after `ids` then `path`, each token a step (a fresh state)."""
    state, logits = backend.prefill(Prompt(ids[:-1]), ids[:-1])
    for token in [int(ids[-1]), *path]:
        logits = backend.forward(state, torch.tensor([token]), keep=1)
    return logits[-1]


def agreement(backend, ids: torch.Tensor, vocab: int, width: int, depth: int) -> dict:
    """How far a tree's rows and a chain's rows are from the steps after their paths, in this cache and dtype (bf16
    here: the torch backends keep a block's rows equal to steps within rounding only): the largest difference over
    the largest logit, and how many rows keep the step's argmax."""
    last = torch.tensor([vocab - 1])
    full = torch.cat([ids, last])
    branches = [[(b * depth + d) % (vocab - 1) for d in range(depth)] for b in range(width)]
    tree = TokenTree.from_branches(branches, budget=width * depth)
    found = {}
    for kind in ("tree", "chain"):
        state, _ = backend.prefill(Prompt(ids), ids)
        if kind == "tree":
            rows = backend.forward_tree(state, last, tree)[1:]
            paths = [tree.tokens[tree.path(node)].tolist() for node in range(tree.size)]
        else:
            rows = backend.forward(state, torch.cat([last, torch.tensor(branches[0])]))[1:]
            paths = [branches[0][: i + 1] for i in range(depth)]
        steps = torch.stack([step_after(backend, full, path) for path in paths])
        difference = float(((rows - steps).abs().amax(-1) / steps.abs().amax(-1)).max())
        same = int((rows.argmax(-1) == steps.argmax(-1)).sum())
        found[kind] = {"rows": len(paths), "max_relative_difference": round(difference, 6), "same_argmax": same}
    return found
