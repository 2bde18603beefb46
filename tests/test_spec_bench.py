"""Spec-Bench's questions as a prompt source: one prompt set per task column, MT-bench's second turn
asked after the model's own first answer, a damaged file refused in one line. The files are written
here in Spec-Bench's format (question_id, category, turns)."""
from __future__ import annotations

import json

import pytest

from bench.core.prompts import (
    canonical_prompts,
    expand_prompt_sets,
    load_prompts,
    parse_spec_bench,
    prompt_set_name,
)
from specdec.core.config import DecodeConfig
from specdec.engine import Engine
from specdec.errors import InputError

QUESTIONS = [
    {"question_id": 1, "category": "writing", "turns": ["write one two", "now say it again"]},
    {"question_id": 2, "category": "coding", "turns": ["write a function", "explain the code"]},
    {"question_id": 3, "category": "summarization", "turns": ["hello world , is the string a number ?"]},
    {"question_id": 4, "category": "rag", "turns": ["yes no one"]},
    {"question_id": 5, "category": "summarization", "turns": ["sort a list of number"]},
]


@pytest.fixture
def questions(tmp_path):
    path = tmp_path / "question.jsonl"
    path.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    return path


def test_each_task_column_is_a_prompt_set_and_mt_bench_gathers_its_subcategories(questions):
    sets = expand_prompt_sets(canonical_prompts(f"spec-bench:{questions}"))
    assert [prompt_set_name(s) for s in sets] == ["mt_bench", "summarization", "rag"]  # Spec-Bench's order, present ones
    mt = load_prompts(sets[0])
    assert [r.id for r in mt] == ["writing-1", "coding-2"] and mt[0].turns == ("write one two", "now say it again")
    assert [r.id for r in load_prompts(sets[1])] == ["summarization-3", "summarization-5"]
    assert all(r.category == "summarization" and r.prompt == r.turns[0] for r in load_prompts(sets[1]))


def test_categories_can_be_chosen_and_are_checked(questions):
    spec = canonical_prompts(f"spec-bench:{questions}:summarization,rag")
    assert spec == f"spec-bench:{questions}:summarization+rag"
    assert [prompt_set_name(s) for s in expand_prompt_sets(spec)] == ["summarization", "rag"]
    assert parse_spec_bench(spec) == (str(questions), ("summarization", "rag"))
    with pytest.raises(InputError, match="unknown Spec-Bench category 'poetry'.*use mt_bench, translation"):
        canonical_prompts(f"spec-bench:{questions}:poetry")


def test_a_missing_or_damaged_question_file_is_one_line(tmp_path, questions):
    with pytest.raises(InputError, match="Spec-Bench question file .* not found"):
        load_prompts(f"spec-bench:{tmp_path / 'none.jsonl'}")
    damaged = tmp_path / "damaged.jsonl"
    damaged.write_text(json.dumps(QUESTIONS[0]) + "\n{not json\n")
    with pytest.raises(InputError, match=r"damaged.jsonl line 2 is not valid JSON"):
        load_prompts(f"spec-bench:{damaged}")
    no_turns = tmp_path / "no_turns.jsonl"
    no_turns.write_text(json.dumps({"question_id": 9, "category": "qa", "turns": []}) + "\n")
    with pytest.raises(InputError, match="needs 'turns': a list of non-empty strings"):
        load_prompts(f"spec-bench:{no_turns}")


def test_the_second_turn_is_asked_after_the_models_own_first_answer(pair):
    decode = DecodeConfig(max_new_tokens=6)
    engine = Engine(mode="cloud", cloud=pair["cloud"], dtype="float32", decode=decode, log=lambda m: None)
    both = engine.generate("write one two", follow_ups=("now say it again",))
    first = engine.generate("write one two")
    loaded = engine.model("cloud")
    conversation = loaded.encode("now say it again", history=(("write one two", first.text),))
    second = engine.generate("now say it again")  # asked alone: another prompt, another answer
    assert both.turns == 2 and both.tokens[: first.new_tokens] == first.tokens
    assert both.prompt_tokens == first.prompt_tokens + conversation.input_ids.numel()
    assert conversation.input_ids.numel() > second.prompt_tokens  # the first answer is in its context
    assert both.counters.cycles == first.counters.cycles + both.new_tokens - first.new_tokens
