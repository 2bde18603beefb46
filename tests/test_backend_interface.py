"""The backend interface is declared once (specdec/backends/base.py's Backend): every runtime subclasses it, callers
read its declared capabilities without probing, and forward's keep-default, crop's guard and a growable KV buffer
exist once."""
import ast
import importlib
import inspect
import pkgutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

import specdec.backends
from specdec.backends.base import Backend, kept_rows
from specdec.backends.buffers import grown, grown_capacity

ROOT = Path(__file__).parent.parent
# Declared capabilities a caller reads (Backend's docstring), beside name, vocab_size and accepts_audio.
DECLARED = ("device", "batchable", "max_positions", "eos_ids", "processors", "streamed_bytes", "memory_bytes",
            "extra_buffers", "model")


def backend_classes() -> list[type]:
    """Every class in specdec.backends that has a prefill: what the decoding loop runs."""
    found = []
    for info in pkgutil.iter_modules(specdec.backends.__path__):
        try:
            module = importlib.import_module(f"specdec.backends.{info.name}")
        except ImportError:  # an optional runtime's package is missing here: its class is checked where it is
            continue
        found += [c for _, c in inspect.getmembers(module, inspect.isclass)
                  if c.__module__ == module.__name__ and hasattr(c, "prefill")]
    return found


def test_every_runtime_subclasses_the_declared_interface():
    classes = backend_classes()
    assert {"HFCausalBackend", "StaticCausalBackend", "SlotCausalBackend", "PackedBackend", "WhisperBackend"} <= {
        c.__name__ for c in classes}
    assert [c.__name__ for c in classes if not issubclass(c, Backend)] == []
    for name in DECLARED:
        assert hasattr(Backend, name), f"Backend declares no {name}"


def probes(tree: ast.AST) -> list[int]:
    """Lines of getattr(X, ...)/hasattr(X, ...) where X names a backend (`backend`, `x.backend`)."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr"):
            target = ast.unparse(node.args[0]) if node.args else ""
            if target == "backend" or target.endswith(".backend"):
                lines.append(node.lineno)
    return lines


def test_no_caller_probes_a_backend():
    """Outside specdec/backends, a backend's capabilities are read as declared, never probed."""
    found = []
    for path in sorted([*ROOT.glob("specdec/**/*.py"), *ROOT.glob("bench/**/*.py")]):
        if "backends" in path.relative_to(ROOT).parts:
            continue
        found += [f"{path.relative_to(ROOT)}:{line}" for line in probes(ast.parse(path.read_text(encoding="utf-8")))]
    assert found == []


@dataclass
class Counted:
    length: int


class Minimal(Backend):
    """A new runtime as small as it can be: prefill and _run; forward and crop come from the interface."""

    name, vocab_size = "minimal", 7

    def __init__(self) -> None:
        self.dropped: list[tuple[int, int]] = []

    def prefill(self, prompt, token_ids, keep=0, use_cache=True):
        state = Counted(0)
        return state, self._run(state, token_ids, keep)

    def _run(self, state, token_ids, keep):
        state.length += token_ids.numel()
        return torch.zeros(keep, self.vocab_size) if keep else None

    def _drop_past(self, state, length):
        self.dropped.append((state.length, length))


def test_a_new_runtime_gets_the_keep_default_the_crop_guard_and_the_declared_defaults():
    backend = Minimal()
    state, _ = backend.prefill(None, torch.arange(3))
    assert backend.forward(state, torch.arange(4)).shape == (4, 7)  # keep None: every row
    assert backend.forward(state, torch.arange(4), keep=1).shape == (1, 7)
    backend.crop(state, 5)
    assert state.length == 5 and backend.dropped == [(11, 5)]  # _drop_past sees the old length, then it is set
    for length in (-1, 6):
        with pytest.raises(ValueError, match=f"cannot crop a state of length 5 to {length}"):
            backend.crop(state, length)
    assert state.length == 5 and len(backend.dropped) == 1  # a refused crop changes nothing
    assert (backend.device, backend.batchable, backend.max_positions, backend.eos_ids, backend.processors,
            backend.streamed_bytes, backend.memory_bytes, backend.extra_buffers, backend.model) == (
        None, False, None, frozenset(), (), None, None, None, None)
    with pytest.raises(NotImplementedError, match="batchable is False"):
        backend.forward_batch([state], [torch.arange(2)], [1])
    assert kept_rows(torch.arange(3), None) == 3 and kept_rows(torch.arange(3), 0) == 0


@pytest.mark.parametrize("held, needed, first, limit, expected", [
    (0, 5, 64, None, 64),  # the first buffer: `first` positions
    (0, 100, 64, None, 100),  # or what is needed
    (64, 65, 64, None, 128),  # then doubling: one copy of the held rows per doubling
    (64, 300, 64, None, 300),
    (64, 65, 64, 100, 100),  # never past the limit
    (64, 120, 64, 100, 120),  # but never below what is needed (the caller refused what no limit allows)
])
def test_a_growable_buffer_doubles_within_its_limit(held, needed, first, limit, expected):
    assert grown_capacity(held, needed, first, limit) == expected


@pytest.mark.parametrize("make", [lambda shape: np.arange(np.prod(shape), dtype=np.float32).reshape(shape),
                                  lambda shape: torch.arange(int(np.prod(shape)), dtype=torch.float32).reshape(shape)],
                         ids=["numpy", "torch"])
@pytest.mark.parametrize("axis", [0, 2])
def test_a_grown_buffer_keeps_its_held_positions(make, axis):
    old = make((4, 3, 4))
    new = grown(old, 9, axis, 3)
    assert type(new) is type(old) and new.dtype == old.dtype and new.shape[axis] == 9
    index = (slice(None),) * axis + (slice(0, 3),)
    assert (new[index] == old[index]).all()
