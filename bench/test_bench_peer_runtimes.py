"""The runtimes' peers on the real pair's GGUF files (bench/measure/peers/runtimes.py), interleaved:

    SPECBENCH_LLAMA_SPECULATIVE=DIR/build/bin/llama-speculative-simple \\
        pytest bench/test_bench_peer_runtimes.py --benchmark-only -m realmodel -s

llama-cpp-python's plain greedy generation (flash attention on as in specbench's backend, and off as
`Llama` defaults), specbench's plain decoding in llama.cpp and torch's dynamic int8, llama.cpp's speculative
example (left out, with one line saying why, when SPECBENCH_LLAMA_SPECULATIVE is unset: build it with
`python -m bench.measure.peers.llama_speculative build --out DIR`), llama-cpp-python's prompt lookup,
specbench's spec across runtimes (the model drafter and prompt lookup).
Prompts from SPECBENCH_PEER_SETS (default `code,zh-describe,en-chat`; e.g.
`spec-bench:../shared/spec-bench/question-dev.jsonl:summarization`), specbench's plain decoding and verifiers in
SPECBENCH_PEER_RUNTIMES (default: llama.cpp and torch's dynamic int8): SPECBENCH_PEER_PROMPTS per set (default 3),
SPECBENCH_PEER_TOKENS new tokens (default 48), SPECBENCH_PEER_THREADS (default 2), the example's speculation types in
SPECBENCH_PEER_LLAMA_SPEC (default `draft-simple`; its draft-free `ngram-simple`, `ngram-mod` too, at their defaults,
or `ngram-simple-short`, `ngram-mod-short`), llama-cpp-python's ways in SPECBENCH_PEER_LLAMA_PYTHON (default
`plain,flash-off,lookup`), specbench's drafters in SPECBENCH_PEER_SPEC (default `model,prompt-lookup`; `auto`,
`suffix`, `ngram` too, and `hybrid`: the 0.5B in the cloud's runtime, one peer per `;`-separated entry of
SPECBENCH_PEER_HYBRID, its drafter options, default `suffix=1,head_vocab=32768`, its blocks stopped at a draft under
0.7) at each k of SPECBENCH_PEER_K (default 4; e.g. `4,8`), and the field's engines in
SPECBENCH_PEER_EXTERNAL (default none; some of
`onnxruntime-genai,openvino-genai,vllm`: the last two in venvs of their own, `specbench peers install NAME`, driven as
workers in the same rotation). Raw per-prompt timings go to SPECBENCH_PEER_JSONL (default runs/peer_runtimes.jsonl) as
taken; a rerun overwrites it; the workers' logs go beside it. Every peer is warmed first, untimed, on a prompt
that is not timed (`warm_up_prompt`). The table goes to stdout and `extra_info`; nothing
asserts a time.
"""
from __future__ import annotations

import os

import pytest

from bench.core.prompts import load_prompts
from bench.measure.peers.llama_speculative import find_binary
from bench.measure.peers.peer_worker import WorkerError
from bench.measure.peers.runtimes import (
    PeerSettings,
    build_peers,
    idle_cpu,
    per_set_table,
    run_interleaved,
    set_label,
    table,
    warm_up_prompt,
)
from bench.measure.workload import CLOUD_ALIAS, EDGE_ALIAS
from specdec.errors import ConfigError, SpecdecError
from specdec.models.registry import gguf_path, is_fetched


@pytest.mark.realmodel
def test_real_peer_runtimes(benchmark):
    try:  # the settings first: a typo in them is one line, before any model is looked for
        settings = PeerSettings.from_env(os.environ)
    except ConfigError as e:
        pytest.exit(f"error: {e}", returncode=2)
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (pip install 'specbench[llamacpp]')")
    if not (is_fetched(EDGE_ALIAS) and is_fetched(CLOUD_ALIAS)):
        pytest.skip(f"real pair not fetched: run `specbench models fetch {EDGE_ALIAS} {CLOUD_ALIAS}`")
    ggufs = {alias: gguf_path(alias) for alias in (EDGE_ALIAS, CLOUD_ALIAS)}
    if missing := [str(p) for p in ggufs.values() if not p.is_file()]:
        pytest.skip(f"GGUF files not kept ({', '.join(missing)}): run `specbench models fetch {EDGE_ALIAS} {CLOUD_ALIAS}`")
    per_set, tokens, threads, sink = settings.prompts_per_set, settings.max_new_tokens, settings.threads, settings.sink
    try:
        loaded = [(name, load_prompts(name)) for name in settings.sets]
        by_set = [(name, records[:per_set]) for name, records in loaded]
        prompts = [(r.prompt, r.system) for _, records in by_set for r in records]
        warm, warm_from = warm_up_prompt(loaded, per_set)
    except SpecdecError as e:
        pytest.exit(f"error: SPECBENCH_PEER_SETS: {e}", returncode=2)
    try:
        binary = find_binary()
    except ConfigError as e:
        binary = None
        print(f"\nllama.cpp speculative left out: {e}")
    workers: list = []
    try:
        peers = build_peers(EDGE_ALIAS, CLOUD_ALIAS, [*prompts, (warm.prompt, warm.system)], settings, binary,
                            log=lambda m: None, workers=workers)
        print(f"\nidle peers' processes, paused between their turns: {idle_cpu(workers)}")
        print(f"every peer warmed, untimed, on {warm_from}")
        timed = benchmark.pedantic(run_interleaved, args=(peers, len(prompts), sink, threads),
                                   kwargs={"warm_up": len(prompts)}, rounds=1, iterations=1)
    except (SpecdecError, WorkerError) as e:  # a peer not installed, a worker that died: one line, what ran is kept
        pytest.exit(f"error: {e} (generations so far: {sink})", returncode=2)
    finally:
        for worker in workers:
            worker.close()
    text = table(timed, peers, tokens)
    if len(by_set) > 1:  # each set (a Spec-Bench category) on its own: where each peer pays and where it loses
        groups, start = [], 0
        for name, records in by_set:  # the prompts run set after set, in order
            groups.append((set_label(name), list(range(start, start + len(records)))))
            start += len(records)
        text += ("\n\nper prompt set: x its fastest plain, end to end / after the first token [95%]\n"
                 + per_set_table(timed, peers, groups))
    benchmark.extra_info.update({"prompts": len(prompts), "max_new_tokens": tokens, "threads": threads,
                                 "raw": str(sink), "table": text})
    print(f"\n{len(prompts)} prompts ({'; '.join(settings.sets)}) x {tokens} tokens, {threads} threads, greedy, interleaved; "
          f"raw timings in {sink}; speed-ups pooled over the prompts, 95 % paired bootstrap intervals:\n{text}")
