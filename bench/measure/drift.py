"""How far a runtime's logits and greedy text move from the model in torch float32 on the same weights.

    python -m bench.measure.drift --model qwen2.5-coder-1.5b --runtimes A,B --prompts code \
        --limit 3 --tokens 32 --out runs/drift.json

Per prompt, torch float32 decodes `--tokens` greedy tokens (the reference continuation). Each runtime then
(1) reads prompt + reference in one prefill, teacher-forced, and its logits at the rows that predict the
reference's tokens are compared with float32's: the largest |difference| over the largest |logit| of float32,
and how often the argmax agrees; (2) decodes its own greedy continuation, whose common prefix with the
reference is counted (a runtime's text is its own; this says how soon it parts from float32's, usually at a
near-tie). Writes one JSON file with every number; prints one line per runtime.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch

from bench.core.prompts import load_prompts
from specdec.backends.prompt import Prompt
from specdec.models.loading import load_model
from specdec.runtime_registry import default_runtime, runtimes


def greedy(backend, ids: torch.Tensor, tokens: int) -> list[int]:
    state, logits = backend.prefill(Prompt(ids), ids, keep=1)
    out = []
    for _ in range(tokens):
        out.append(int(logits[-1].argmax()))
        logits = backend.forward(state, torch.tensor(out[-1:]), keep=1)
    return out


def teacher_forced(backend, ids: torch.Tensor, continuation: list[int]) -> torch.Tensor:
    """Logits [len(continuation), V] of the rows predicting each continuation token after the prompt."""
    full = torch.cat([ids, torch.tensor(continuation[:-1], dtype=torch.long)])
    _, logits = backend.prefill(Prompt(full), full, keep=len(continuation))
    return logits.float()


@torch.inference_mode()
def measure(args: argparse.Namespace) -> dict:
    torch.set_num_threads(args.threads)
    quiet: dict[str, Any] = dict(log=lambda message: None)
    reference = load_model(args.model, "float32", runtime=default_runtime(), **quiet)
    prompts = [reference.tokenizer.apply_chat_template([{"role": "user", "content": p.prompt}], add_generation_prompt=True,
                                                       return_tensors="pt", return_dict=True)["input_ids"][0]
               for p in load_prompts(args.prompts)[: args.limit]]
    continuations = [greedy(reference.backend, ids, args.tokens) for ids in prompts]
    expected = [teacher_forced(reference.backend, ids, c) for ids, c in zip(prompts, continuations)]
    del reference
    found = {"model": args.model, "prompts": args.prompts, "limit": args.limit, "tokens": args.tokens, "runtimes": {}}
    for runtime in args.runtimes.split(","):
        lm = load_model(args.model, "float32", runtime=runtime, **quiet)
        rows = [teacher_forced(lm.backend, ids, c) for ids, c in zip(prompts, continuations)]
        own = [greedy(lm.backend, ids, args.tokens) for ids in prompts]
        largest = max(float(e.abs().max()) for e in expected)
        common = [next((i for i, (a, b) in enumerate(zip(o, c)) if a != b), len(c)) for o, c in zip(own, continuations)]
        found["runtimes"][runtime] = {
            "max_abs_diff_over_max_logit": max(float((r - e).abs().max()) for r, e in zip(rows, expected)) / largest,
            "argmax_agree": sum(int((r.argmax(-1) == e.argmax(-1)).sum()) for r, e in zip(rows, expected)),
            "rows": sum(len(c) for c in continuations), "common_prefix_tokens": common}
        entry = found["runtimes"][runtime]
        print(f"{runtime}: max |Δlogit| {entry['max_abs_diff_over_max_logit']:.3f} of the largest, argmax "
              f"{entry['argmax_agree']}/{entry['rows']}, greedy text the same for {common} of {args.tokens} tokens")
        del lm
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--runtimes", default=",".join(r.name for r in runtimes() if r.needs_kernels),
                        help="comma-separated runtimes (default: the kernels')")
    parser.add_argument("--prompts", default="code")
    parser.add_argument("--limit", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default="runs/drift.json")
    args = parser.parse_args(argv)
    found = measure(args)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(found, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
