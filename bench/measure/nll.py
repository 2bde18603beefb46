"""Cloud NLL of outputs (`specbench score`): how likely a scoring model, by default the sweep's
cloud, finds each output given its prompt, in nats per token (lower = more like what the cloud
would write; a quality signal that needs no reference).

Scored after the runs, never inside them: scoring needs the cloud model, which an edge-only point
must never load, and a memory cap must not see it. Each score is appended to `DIR/nll.jsonl` as
soon as it exists; a rerun scores only what is missing. The output text is re-tokenized by the
scorer (so any scorer works, whatever model wrote the text) and scored after the same chat
prompt the run used; the stop token is not scored. Audio prompts are skipped (text scorers only).
"""
from __future__ import annotations

import math
from pathlib import Path

import torch
from tqdm import tqdm

from bench.core.prompts import load_prompts
from bench.core.records import ResultsFile, read_records
from bench.derive.scores import SCORE_FIELDS, SCORES, score_key
from specdec.backends.prompt import Prompt
from specdec.errors import ConfigError, InputError
from specdec.models.loading import LoadedModel, load_model


@torch.inference_mode()
def output_nll(model: LoadedModel, prompt: Prompt, tokens: list[int]) -> float:
    """Mean -log p(token_i | prompt, tokens[:i]) over `tokens`, nats; NaN for an empty output.
    One forward over prompt + output; logits of the last n+1 positions, the first n predict it."""
    n = len(tokens)
    if n == 0:
        return math.nan
    target = torch.tensor(tokens, dtype=torch.long)
    ids = torch.cat([prompt.input_ids, target])
    _, logits = model.backend.prefill(prompt, ids, keep=n + 1, use_cache=False)
    assert logits is not None  # keep >= 1: prefill returns [keep, V]
    log_probs = torch.log_softmax(logits[:-1].float(), dim=-1)
    return float(-log_probs[torch.arange(n), target].mean())


def default_scorer(rows: list[dict]) -> str:
    clouds = sorted({r["cloud"] for r in rows if r.get("cloud")})
    if len(clouds) != 1:
        found = ", ".join(clouds) if clouds else "none"
        raise ConfigError(f"cannot tell which cloud model scores these results (found: {found}): pass --model MODEL")
    return clouds[0]


def score(out: Path, model: str | None = None, dtype: str = "float32", progress: bool = True,
          log=print) -> dict[str, int]:
    """Score every `ok` text record of `out/results.jsonl` not yet scored by this scorer and dtype."""
    results_path = out / "results.jsonl"
    if not results_path.exists():
        raise InputError(f"{results_path} not found: score a folder written by `specbench run` or `sweep`")
    rows = [r for r in read_records(results_path) if r.get("status", "ok") == "ok"]
    scorer = model or default_scorer(rows)
    scores = ResultsFile(out / SCORES, SCORE_FIELDS)
    previous = scores.read()
    others = {(r.get("scorer"), r.get("scorer_dtype")) for r in previous} - {(scorer, dtype)}
    if others:
        raise ConfigError(f"{out / SCORES} holds scores by {sorted(others)[0]}: delete it to rescore with {scorer} {dtype}")
    done = {r["key"] for r in previous}
    sets: dict[str, dict] = {}
    todo, skipped = [], 0
    for row in rows:
        if score_key(row) in done:
            continue
        if row["prompts"] not in sets:
            sets[row["prompts"]] = {r.id: r for r in load_prompts(row["prompts"])}
        record = sets[row["prompts"]].get(row["id"])
        if record is None or record.audio:
            skipped += 1  # audio prompts (or a prompt no longer in its set) are not scored
            continue
        todo.append((row, record))
    if not todo:
        return {"scored": 0, "already": len(done), "skipped": skipped}
    loaded = load_model(scorer, dtype, log=log)
    for row, record in tqdm(todo, desc="score", unit="output", disable=not progress):
        prompt = loaded.encode(record.prompt, record.system, chat_template=row.get("chat_template", True))
        tokens = loaded.tokenizer.encode(row["text"], add_special_tokens=False)
        scores.append({"key": score_key(row), "id": row["id"], "scorer": scorer, "scorer_dtype": dtype,
                       "tokens": len(tokens), "cloud_nll": output_nll(loaded, prompt, tokens)})
    return {"scored": len(todo), "already": len(done), "skipped": skipped}
