"""What the GPU check's stages share (bench/measure/gpu_check.py, gpu_trees.py): the architectures of bench/gpu/*.json
built with random bf16 weights, the timer, and the settings of a run and of its --dry-run on the CPU."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from specdec.backends.devices import clock, is_cuda
from specdec.models.architecture import PREFIX as ARCH
from specdec.models.architecture import build_architecture

CONFIGS = Path(__file__).parent.parent / "gpu"
CONTEXT = 512  # cached tokens per row, as issue 44's first measurements
WARM_UPS = 3
# --dry-run: the same code on the CPU, tiny configs, two shapes per axis.
DRY: dict[str, Any] = {
    "rows": (1, 2), "tokens": (1, 3), "context": 16, "repeats": 2, "warm_ups": 1,
    "config": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
               "intermediate_size": 128, "vocab_size": 96}}


def build(name: str, device: str, dry: bool):
    """The architecture of bench/gpu/NAME.json with random bf16 weights, made on `device` (no host copy)."""
    return build_architecture(f"{ARCH}{CONFIGS / name}.json", torch.bfloat16, device, DRY["config"] if dry else None)


def timed(run, device: str, repeats: int) -> list[float]:
    """Milliseconds of `run()`, each alone: CUDA events on a GPU, the clock after a sync elsewhere."""
    times = []
    for _ in range(repeats):
        if is_cuda(device):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            begin = clock(device)
            run()
            times.append((clock(device) - begin) * 1e3)
    return times
