"""onnxruntime-genai's own generation as a peer: its Generator on the builder's unedited int4 graph
(specdec.models.convert_onnx variant `genai-int4`, cached beside the model with its sha256 like every
conversion), greedy, plain or with its n-gram speculative decoding.

onnxruntime-genai 0.18 (this project's `onnx` pin, so it runs in this environment) drafts from the
context when `GeneratorParams.set_speculative_options(ngram_size=N, max_draft_tokens=K)` is set: the
last N-1 tokens are looked up in the sequence, up to K following tokens proposed, verified in one
forward, the agreeing prefix kept (its strings: "NGramLookup requires ngram_size >= 2", "max_draft_tokens
(K) must be in [1, 16]"). It refuses repetition penalties and no_repeat_ngram_size with speculation; greedy
needs neither.

The graph is the builder's own, not the one specbench's own ONNX int4 runtime runs: that one has an input
`num_logits_to_keep` (a prefill computes the logits of its last rows only) which the Generator cannot feed.
Both are the same int4 weights (block 32, symmetric, accuracy_level 4), so the Generator's plain decoding
and specbench's ONNX int4 runtime differ only in the engine around the graph.

The timer runs from the prompt's first forward (append_tokens) to the last token; the first token's time
is taken after the first generate_next_token.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

from specdec.errors import ConfigError

VARIANT = "genai-int4"
NGRAM_SIZE, MAX_DRAFT = 3, 4  # its n-gram settings here: a 2-token lookup, 4 drafted, as specbench's prompt lookup at k 4


def ort_genai_name(ngram: bool) -> str:
    return f"onnxruntime-genai n-gram (size {NGRAM_SIZE}, {MAX_DRAFT} drafted)" if ngram else "onnxruntime-genai plain"


class OrtGenai:
    """One onnxruntime-genai Model (the conversion's folder), `threads` intra-op threads, generating greedily."""

    def __init__(self, folder: Path, threads: int, ngram: bool = False, model=None):
        try:
            import onnxruntime_genai as og
        except ImportError:
            raise ConfigError("onnxruntime-genai is not installed: pip install -e '.[onnx]'") from None
        self.og = og
        if model is None:
            config = og.Config(str(folder))
            config.overlay(json.dumps({"model": {"decoder": {"session_options": {
                "intra_op_num_threads": threads, "inter_op_num_threads": 1}}}}))
            model = og.Model(config)
        self.model = model  # plain and n-gram share one (speculation is a GeneratorParams setting)
        self.ngram = ngram

    def generate(self, ids: list[int], max_new_tokens: int, eos_ids: frozenset[int]) -> tuple[list[int], float | None]:
        """(new token ids, seconds from the prompt's first forward to the first new token)."""
        og = self.og
        params = og.GeneratorParams(self.model)
        params.set_search_options(do_sample=False, max_length=len(ids) + max_new_tokens, min_length=0,
                                  repetition_penalty=1.0, temperature=1.0, top_k=1, top_p=1.0)
        if self.ngram:
            params.set_speculative_options(ngram_size=NGRAM_SIZE, max_draft_tokens=MAX_DRAFT)
        start = time.perf_counter()
        generator = og.Generator(self.model, params)
        generator.append_tokens(ids)
        first = None
        while not generator.is_done():
            generator.generate_next_token()
            if first is None:
                first = time.perf_counter() - start
        new = [int(t) for t in generator.get_sequence(0)[len(ids):]]
        for i, token in enumerate(new):  # its EOS ends the text as specbench's does (kept, as specbench keeps it)
            if token in eos_ids:
                return new[: i + 1], first
        return new[:max_new_tokens], first
