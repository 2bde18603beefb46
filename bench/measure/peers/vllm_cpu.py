"""vLLM's CPU engine as a peer: its plain greedy decoding, its n-gram prompt lookup and its draft-model speculation.

Runs with the Python of its own environment (vLLM pins torch 2.13.0+cpu and transformers < 5.20, which this project's
environment does not take), so it imports nothing of specbench's:

    specbench peers install vllm                       # $SPECBENCH_HOME/peers/vllm, 3.4 GB
    # as a worker of the peers suite (bench/measure/peers/peer_worker.py), which starts it itself:
    SPECBENCH_PEER_EXTERNAL=vllm pytest bench/test_bench_peer_runtimes.py --benchmark-only -m realmodel -s
    # or alone, on Spec-Bench questions:
    VLLM_CPU_OMP_THREADS_BIND=0-1 VLLM_CPU_KVCACHE_SPACE=2 $SPECBENCH_HOME/peers/vllm/bin/python \
        bench/measure/peers/vllm_cpu.py --model ~/.cache/specbench/models/qwen2.5-coder-1.5b \
        --questions ../shared/spec-bench/question-dev.jsonl --categories summarization,translation --limit 10 \
        --out runs/peer-vllm.jsonl

Engines (`--engines`, each a separate `LLM` in this process, loaded first, not timed): `vllm` plain;
`vllm-ngram`, `speculative_config={"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_max": 4,
"prompt_lookup_min": 1}`; `vllm-draft`, `{"method": "draft_model", "model": DRAFT, "num_speculative_tokens": K}`
(the registry's 0.5B folder). bf16 (its CPU path), batch 1, greedy, prefix caching off: a prompt seen by one engine
would otherwise skip its prefill in the next. Prompts go in as token ids, so every peer sees the same ones.
`VLLM_CPU_OMP_THREADS_BIND=0-1` gives its OpenMP threads both cores (its default keeps one for the scheduler).
Standalone, one JSON line per generation, written as it is made: id, category, engine, new tokens, seconds (the
whole request), seconds to the first token where vLLM reports it, and the token ids.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ENGINES = ("vllm", "vllm-ngram", "vllm-draft")
INSTALL = "specbench peers install vllm"


def questions(path: str, categories: list[str], limit: int) -> list[dict]:
    rows = [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
    picked = []
    for category in categories:
        picked += [r for r in rows if r["category"] == category][:limit]
    return picked


def speculative_config(engine: str, k: int, draft: str | None) -> dict | None:
    """vLLM's speculative_config for one of ENGINES (None: plain decoding)."""
    if engine == "vllm":
        return None
    if engine == "vllm-ngram":
        return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 4, "prompt_lookup_min": 1}
    if engine == "vllm-draft":
        if not draft:
            raise ValueError("vllm-draft needs --draft, the draft model's folder")
        return {"method": "draft_model", "model": draft, "num_speculative_tokens": k}
    raise ValueError(f"unknown engine {engine!r}: use some of {', '.join(ENGINES)}")


def load_engines(model: str, names: list[str], k: int, draft: str | None, dtype: str) -> dict:
    from vllm import LLM  # the peer's environment only

    common = dict(model=model, dtype=dtype, enable_prefix_caching=False, max_model_len=4096, seed=0)
    engines = {}
    for name in names:
        spec = speculative_config(name, k, draft)
        engines[name] = LLM(**common, **({"speculative_config": spec} if spec else {}))
    return engines


def generate(engine, ids: list[int], max_tokens: int) -> tuple[list[int], float | None, dict]:
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    result = engine.generate([{"prompt_token_ids": ids}], params, use_tqdm=False)[0]
    metrics = getattr(result, "metrics", None)
    first = getattr(metrics, "first_token_time", None) if metrics is not None else None
    arrival = getattr(metrics, "arrival_time", None) if metrics is not None else None
    return list(result.outputs[0].token_ids), (first - arrival if first and arrival else None), {}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a model folder (the registry's float folder)")
    parser.add_argument("--draft", help="the draft model's folder (vllm-draft)")
    parser.add_argument("--engines", default="vllm,vllm-ngram", help=f"some of {', '.join(ENGINES)}")
    parser.add_argument("--worker", action="store_true", help="serve the peers suite on stdin/stdout (peer_worker.py)")
    parser.add_argument("--questions", help="Spec-Bench's question.jsonl (or its dev half), standalone")
    parser.add_argument("--categories", default="summarization,translation")
    parser.add_argument("--limit", type=int, default=10, help="questions per category")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--k", type=int, default=4, help="tokens proposed per step")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--out", help="JSONL of the standalone run")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.engines.split(",") if n.strip()]
    try:
        for name in names:
            speculative_config(name, args.k, args.draft)
        import vllm
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except ImportError:
        print(f"error: vllm is not installed in this Python: run `{INSTALL}` and this file with "
              "$SPECBENCH_HOME/peers/vllm/bin/python", file=sys.stderr)
        return 2
    protocol = None
    if args.worker:
        import peer_worker  # this file's sibling: run as a script, its folder is on sys.path

        protocol = peer_worker.take_stdout()  # before vLLM loads: it logs to stdout
    engines = load_engines(args.model, names, args.k, args.draft, args.dtype)
    if protocol is not None:
        return peer_worker.serve({name: (lambda ids, n, e=engine: generate(e, ids, n)) for name, engine in engines.items()},
                                 {"vllm": vllm.__version__}, stdout=protocol)
    if not (args.questions and args.out):
        print("error: give --questions and --out (standalone), or --worker", file=sys.stderr)
        return 2
    tokenizer = next(iter(engines.values())).get_tokenizer()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("a", encoding="utf-8") as sink:
        for question in questions(args.questions, args.categories.split(","), args.limit):
            ids = tokenizer.apply_chat_template([{"role": "user", "content": question["turns"][0]}], tokenize=True,
                                                add_generation_prompt=True)
            for name, engine in engines.items():
                start = time.perf_counter()
                tokens, ttft, _ = generate(engine, list(ids), args.max_tokens)
                seconds = time.perf_counter() - start
                sink.write(json.dumps({"id": question["question_id"], "category": question["category"], "engine": name,
                                       "new_tokens": len(tokens), "seconds": seconds, "ttft_s": ttft,
                                       "tokens": tokens}) + "\n")
                sink.flush()
                print(f"{question['category']} {question['question_id']} {name}: {len(tokens)} tokens in {seconds:.2f} s",
                      flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
