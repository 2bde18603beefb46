"""Backend that runs a GGUF file in llama.cpp (llama-cpp-python's low-level API, `specbench[llamacpp]`).

The three-method protocol maps onto one llama.cpp context:

    state            a sequence id in the context (its KV cells), taken from a pool of `n_seq_max`
                     and given back when the state is dropped; `length` = positions it holds
    prefill/forward  ONE `llama_decode` of a batch holding the block at explicit positions
                     length .. length+n-1 on the state's sequence, logits requested for the last
                     `keep` rows only (never all rows: n_ctx x vocab floats); a block longer than
                     the context's batch goes in several decodes, logits from the last rows only
    crop             `llama_memory_seq_rm(memory, seq, length, -1)`: the cells at positions >=
                     length are freed, exactly (a transformer's cache; recurrent models are refused)

The KV cells are one buffer of `n_ctx` shared by all sequences (`kv_unified`), so `n_ctx` bounds a
sequence's prompt + output (`max_positions`) and the sum over the sequences alive at once.
Threads follow `torch.get_num_threads()` (the edge caps set it) at every decode.

Behind `specbench serve`: the backend has no `forward_batch`, so the batcher runs each session's
verify as its own decode, one sequence at a time on the server's one compute thread; sessions keep
their own sequences (up to `n_seq_max`) in the shared cells. Batching blocks of several sessions
into one llama_decode is possible in llama.cpp (several seq ids in one batch) but not built here.

Extra buffer types (llama.cpp's weight repacking: its CPU repack kernels, AMX tiles where the CPU has
AMX) crash one build on AMX machines (llamacpp_probe.py): `extra_buffers` "auto" loads with them only
after a one-time probe in a child process says they run here; "on" is llama.cpp's default, "off" its
`--no-repack`. `backend.extra_buffers` and `backend.extra_buffers_reason` say which path this load took.

Numerics: llama.cpp's kernels differ from torch's (and its K/V cache is float16 by default), so
logits equal a torch forward of the same weights only within a tolerance (tests/test_llamacpp.py),
and a block of n rows may round differently from n single steps.
"""
from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from specdec.backends.base import Backend
from specdec.backends.llamacpp_probe import announce, build_id, decide
from specdec.backends.prompt import Prompt, refuse_features
from specdec.errors import ConfigError, InputError, ModelError
from specdec.runtime_registry import Package, default_runtime

# what pip installs for it: pins llama-cpp-python (built from source: ~5 min)
LLAMA_CPP = Package("llama_cpp", "llama-cpp-python", "pip install 'specbench[llamacpp]'")

KV_TYPES = {"f16": 1, "f32": 0}  # ggml_type ids: GGML_TYPE_F16, GGML_TYPE_F32
N_BATCH = 512  # tokens per llama_decode (the context's batch): a longer prefill takes several
_backend_ready = False


def _llama():
    """The llama_cpp module, imported on first use: it loads its shared library on import."""
    global _backend_ready
    try:
        import llama_cpp
    except ImportError as e:
        raise ConfigError(f"runtime {default_runtime('.gguf')} needs {LLAMA_CPP.distribution}, which cannot be "
                          f"imported ({e}): "
                          f"{LLAMA_CPP.extra}") from None
    if not _backend_ready:
        # llama.cpp logs through llama-cpp-python's logger; unless someone configured it, it stays
        # quiet: its failures reach the user as our one-line errors.
        log = logging.getLogger("llama-cpp-python")
        if log.level == logging.NOTSET:
            log.setLevel(logging.CRITICAL + 1)
        llama_cpp.llama_backend_init()
        _backend_ready = True
    return llama_cpp


@dataclass
class LlamaState:
    seq: int  # sequence id in the context
    length: int  # token positions held (0 .. length-1)
    _release: weakref.finalize | None = field(default=None, repr=False)


class LlamaCppBackend(Backend):
    """A GGUF file loaded into one llama.cpp context; build with `LlamaCppBackend(path)`."""

    memory_bytes: int | None = None  # set at load: the bytes it holds

    accepts_audio = False

    def __init__(self, path: str | Path, name: str = "", n_ctx: int = 4096, n_seq_max: int = 64,
                 kv_type: str = "f16", extra_buffers: str = "auto",
                 probe_cache: Path | None = None, probe_argv: list[str] | None = None) -> None:
        """`extra_buffers`: auto, on or off (llamacpp_probe.EXTRA_BUFFERS); `probe_cache`: the JSON file that
        keeps auto's probe verdicts (None: probe at every load); `probe_argv`: the probe child's command
        (default: llamacpp_probe.main in a fresh Python)."""
        llama = self._lib = _llama()
        path = Path(path)
        self.name = name or path.name
        if not path.is_file():
            raise ModelError(f"GGUF file {str(path)!r} does not exist: check the path")
        if kv_type not in KV_TYPES:
            raise ModelError(f"unknown kv_type {kv_type!r}: use one of {', '.join(KV_TYPES)}")
        with open(path, "rb") as f:  # llama.cpp's own message would go to its (silenced) log
            if f.read(4) != b"GGUF":
                raise ModelError(f"{path} is not a GGUF file (no GGUF magic): fetch the model again or point at a .gguf file")
        verdict = decide(extra_buffers, path, build_id(llama), probe_cache, probe_argv)
        self.extra_buffers, self.extra_buffers_reason = verdict.works, verdict.reason
        params = llama.llama_model_default_params()
        params.use_extra_bufts = verdict.works
        self._model = llama.llama_model_load_from_file(str(path).encode(), params)
        if not self._model:
            raise ModelError(f"llama.cpp cannot load {path}: the file is truncated or damaged (or its architecture is "
                             "unknown to llama-cpp-python 0.3.36): fetch the model again")
        announce(verdict)
        self._vocab = llama.llama_model_get_vocab(self._model)
        self.vocab_size = llama.llama_vocab_n_tokens(self._vocab)
        trained = llama.llama_model_n_ctx_train(self._model)
        self.max_positions: int = min(n_ctx, trained) if trained > 0 else n_ctx
        self.threads = torch.get_num_threads()
        cparams = llama.llama_context_default_params()
        cparams.n_ctx, cparams.n_batch, cparams.n_ubatch = self.max_positions, N_BATCH, N_BATCH
        cparams.n_seq_max, cparams.kv_unified = n_seq_max, True
        cparams.n_threads = cparams.n_threads_batch = self.threads
        cparams.type_k = cparams.type_v = KV_TYPES[kv_type]
        cparams.no_perf = True
        self._ctx = llama.llama_init_from_model(self._model, cparams)
        if not self._ctx:
            llama.llama_model_free(self._model)
            raise ModelError(f"llama.cpp cannot make a context of {self.max_positions} positions for {path}")
        self._memory = llama.llama_get_memory(self._ctx)
        self._batch = llama.llama_batch_init(N_BATCH, 0, 1)
        self.n_seq_max = n_seq_max
        self._free_seqs = list(range(n_seq_max - 1, -1, -1))  # pop() takes 0 first
        self._dropped: list[int] = []  # sequences of dropped states, their cells not yet freed
        self.eos_ids = frozenset(t for t in (llama.llama_vocab_eos(self._vocab), llama.llama_vocab_eot(self._vocab)) if t >= 0)
        kv_bytes = 2 if kv_type == "f16" else 4
        head_dim = llama.llama_model_n_embd(self._model) // max(1, llama.llama_model_n_head(self._model))
        # Weights as mapped, plus the K and V cells allocated for n_ctx positions.
        self.memory_bytes = int(llama.llama_model_size(self._model)) + (
            2 * llama.llama_model_n_layer(self._model) * llama.llama_model_n_head_kv(self._model) * head_dim
            * self.max_positions * kv_bytes)
        self._finalizer = weakref.finalize(self, _free, llama, self._batch, self._ctx, self._model)

    # --- protocol -----------------------------------------------------------------------
    def prefill(self, prompt: Prompt, token_ids: torch.Tensor, keep: int = 0, use_cache: bool = True):
        refuse_features(prompt, self.name, "llama.cpp")
        state = self._new_state()
        logits = self._run(state, token_ids, keep) if token_ids.numel() else None
        if not use_cache:
            assert state._release is not None  # _new_state attaches it to every state
            state._release()  # the sequence back to the pool now, not when the state is dropped
            state.length = 0
            self._reclaim()
        return state, logits


    def _drop_past(self, state: LlamaState, length: int) -> None:
        if not self._lib.llama_memory_seq_rm(self._memory, state.seq, length, -1):
            raise ModelError(f"llama.cpp cannot roll model {self.name!r} back to {length} positions (a recurrent model?)")

    # --- internals ----------------------------------------------------------------------
    def _reclaim(self) -> None:
        """Free the cells of dropped states' sequences. Runs where forwards run: a state may be dropped
        on another thread (a server session closed on its event loop) while this context decodes."""
        while self._dropped:
            seq = self._dropped.pop()
            self._lib.llama_memory_seq_rm(self._memory, seq, -1, -1)
            self._free_seqs.append(seq)

    def _new_state(self) -> LlamaState:
        self._reclaim()
        if not self._free_seqs:
            raise ModelError(f"model {self.name!r}: all {self.n_seq_max} llama.cpp sequences are in use "
                             "(one per open session): close sessions or lower --max-sessions")
        seq = self._free_seqs.pop()
        self._lib.llama_memory_seq_rm(self._memory, seq, -1, -1)  # a fresh sequence holds nothing
        state = LlamaState(seq, 0)
        state._release = weakref.finalize(state, _give_back, weakref.ref(self), seq)
        return state

    def _run(self, state: LlamaState, token_ids: torch.Tensor, keep: int) -> torch.Tensor | None:
        """Feed token_ids [n] at positions state.length .. +n-1; logits [keep, V] of the last rows."""
        self._reclaim()
        n = token_ids.numel()
        if state.length + n > self.max_positions:
            raise InputError(f"model {self.name!r} holds {self.max_positions} positions in its llama.cpp context; "
                             f"this block would reach {state.length + n}: lower --max-new-tokens or shorten the prompt")
        if torch.get_num_threads() != self.threads:  # the caps changed since load
            self.threads = torch.get_num_threads()
            self._lib.llama_set_n_threads(self._ctx, self.threads, self.threads)
        ids = token_ids.to(torch.int32).numpy()
        batch, rows = self._batch, []
        for start in range(0, n, N_BATCH):  # one decode per context batch: one in all but long prefills
            count = min(N_BATCH, n - start)
            np.ctypeslib.as_array(batch.token, shape=(count,))[:] = ids[start:start + count]
            np.ctypeslib.as_array(batch.pos, shape=(count,))[:] = np.arange(state.length, state.length + count)
            np.ctypeslib.as_array(batch.n_seq_id, shape=(count,))[:] = 1
            wanted = np.arange(start, start + count) >= n - keep  # logits for the last `keep` rows only
            np.ctypeslib.as_array(batch.logits, shape=(count,))[:] = wanted
            for row in range(count):
                batch.seq_id[row][0] = state.seq
            batch.n_tokens = count
            code = self._lib.llama_decode(self._ctx, batch)
            if code != 0:
                self.crop(state, state.length)  # drop whatever part of the block was stored
                raise ModelError(f"llama.cpp could not decode {count} tokens for model {self.name!r} (llama_decode "
                                 f"returned {code}: {'no room in its KV cells' if code == 1 else 'an error'})")
            state.length += count
            for wanted_row in np.flatnonzero(wanted):
                pointer = self._lib.llama_get_logits_ith(self._ctx, int(wanted_row))
                rows.append(torch.from_numpy(np.ctypeslib.as_array(pointer, shape=(self.vocab_size,)).copy()))
        return torch.stack(rows) if rows else None  # [keep, V] float32


def _give_back(backend_ref: weakref.ref, seq: int) -> None:
    """A dropped state's sequence, queued for `_reclaim` (list.append is atomic: any thread may drop a state)."""
    backend = backend_ref()
    if backend is not None:
        backend._dropped.append(seq)


def _free(llama, batch, ctx, model) -> None:
    llama.llama_batch_free(batch)
    llama.llama_free(ctx)
    llama.llama_model_free(model)
