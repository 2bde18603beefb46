"""Prompt files and audio manifests, validated on load, and the shipped sets.

One record format for both: `id`, then `prompt` (text) or `prompt_type` (a fixed task prompt, see
PROMPT_TYPES), and optionally `system`, `audio` (a path relative to the file), `language`,
`reference`. Fields other than these (a MER2024 manifest's `emotion`, say) are ignored. A file is
a JSON array of such objects when its name ends in `.json`, else JSONL (one object per line).

Design: the file's *structure* is checked here (bad JSON, missing id, duplicate id, unknown
prompt type) and fails the whole run at once, since ids are how results are matched. The audio
*content* is checked when the sample is read (`bench.core.audio.read_audio`): a missing, corrupt,
empty or over-long file fails that sample alone, which the run or sweep records as `failed`.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from bench.core.audio import MAX_SECONDS
from bench.core.folder import canonical_path
from specdec.core.config import check_types
from specdec.errors import ConfigError, InputError
from specdec.settings import choices, parse_fields

SETS_DIR = Path(__file__).parent.parent / "prompts"
SAMPLES_MANIFEST = Path(__file__).parent.parent / "samples" / "manifest.jsonl"  # shipped espeak-ng clips
SHIPPED_AUDIO = {"audio-samples": SAMPLES_MANIFEST}

# The MER2024-style task's two prompts (`prompt_type detailed|concise` in the original system).
PROMPT_TYPES = {
    "detailed": "请用一句中文描述说话人的音色、语速、语调和情绪。",
    "concise": "请用一句简短的中文概括说话人的声音特点和情绪。",
}


class Turns(StrEnum):
    """Which of a conversation's turns a run asks (PromptInputs.turns; a record's `turns`)."""

    ALL = "all"  # each later turn after the model's own answer, timed together (as Spec-Bench does)
    FIRST = "first"  # the first turn only


TURNS = choices(Turns)
OPTIONAL_TEXT = ("system", "reference", "language", "prompt_type", "audio")

# Spec-Bench (Xia et al. 2024, hemingkx/Spec-Bench `data/spec_bench/question.jsonl`): its six task
# columns, MT-bench's eight subcategories counted as one, in the order of its leaderboard.
SPEC_BENCH = "spec-bench:"
SPEC_BENCH_CATEGORIES = {
    "mt_bench": ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"),
    "translation": ("translation",), "summarization": ("summarization",), "qa": ("qa",),
    "math_reasoning": ("math_reasoning",), "rag": ("rag",),
}
SPEC_BENCH_HELP = (f"spec-bench:PATH (every category) or spec-bench:PATH:CATEGORY[+CATEGORY...] with categories "
                   f"{', '.join(SPEC_BENCH_CATEGORIES)}")


@dataclass(frozen=True)
class PromptInputs:
    """Which prompts a run reads (the harness's settings beside the engine's, specdec/core/config.py)."""

    prompts: str = field(metadata={"help": "JSONL file, JSON manifest, a shipped set (zh-describe, zh-chat, en-chat, code, "
                                           "edit-code, edit-text, audio-samples), or Spec-Bench's questions: "
                                           + SPEC_BENCH_HELP})
    limit: int | None = field(default=None, metadata={"help": "only the first N prompts (of each set)"})
    max_audio_s: float = field(default=MAX_SECONDS, metadata={
        "help": "refuse longer audio clips, in seconds (capped by the model's own window)",
        "flags": ("--max-audio-seconds",)})
    turns: Turns = field(default=Turns.ALL, metadata={
        "help": "a conversation's later turns (Spec-Bench's MT-bench has two): all asks each after the model's own "
                "answer and times them together, as Spec-Bench does; first asks the first turn only",
        "choices": TURNS})

    def __post_init__(self) -> None:
        parse_fields(self)  # typed from here on (one line for an unknown word)
        check_types(self)
        if self.limit is not None and self.limit < 1:
            raise ConfigError(f"limit must be >= 1 (the first N prompts), got {self.limit}: leave it unset for all of them")
        if not self.max_audio_s > 0:
            raise ConfigError(f"max_audio_s must be > 0 seconds, got {self.max_audio_s}")


@dataclass(frozen=True)
class PromptRecord:
    id: str
    prompt: str
    system: str | None = None
    audio: Path | None = None  # resolved against the file's folder; existence is checked on read
    reference: str | None = None  # what a perfect output says: WER/CER are computed against it
    language: str | None = None  # lower-case as given ("zh", "en", "chinese"); picks CER or WER
    prompt_type: str | None = None  # a key of PROMPT_TYPES, kept as a label when `prompt` is given
    turns: tuple[str, ...] = ()  # a conversation's user turns (Spec-Bench's MT-bench has two); () for one prompt
    category: str | None = None  # Spec-Bench's task column (mt_bench, translation, summarization, ...)


def prompt_sets() -> list[str]:
    return sorted([p.stem for p in SETS_DIR.glob("*.jsonl")] + list(SHIPPED_AUDIO))


def canonical_prompts(spec: str) -> str:
    """A shipped set by its name, a prompts file by its resolved path (so `p.jsonl` and `./p.jsonl`
    name one set in the records and the results folder's identity); Spec-Bench's questions as
    `spec-bench:RESOLVED_PATH[:CATEGORY+...]`."""
    if spec.startswith(SPEC_BENCH):
        path, categories = parse_spec_bench(spec)
        return f"{SPEC_BENCH}{canonical_path(path)}" + (f":{'+'.join(categories)}" if categories else "")
    return spec if spec in SHIPPED_AUDIO or spec in prompt_sets() else canonical_path(spec)


def parse_spec_bench(spec: str) -> tuple[str, tuple[str, ...]]:
    """`spec-bench:PATH[:CAT+CAT]` -> (PATH, categories; () for all). Categories are checked by name."""
    rest = spec.removeprefix(SPEC_BENCH)
    path, sep, names = rest.rpartition(":") if rest.count(":") else (rest, "", "")
    if not sep or "/" in names or names.endswith(".jsonl"):  # no category part (a path may hold no ':')
        path, names = rest, ""
    categories = tuple(n.strip() for n in names.replace(",", "+").split("+") if n.strip())
    if not path:
        raise InputError(f"{spec!r} names no file: use {SPEC_BENCH_HELP}")
    unknown = [c for c in categories if c not in SPEC_BENCH_CATEGORIES]
    if unknown:
        raise InputError(f"unknown Spec-Bench category {unknown[0]!r} in {spec!r}: use {', '.join(SPEC_BENCH_CATEGORIES)}")
    return path, categories


def expand_prompt_sets(spec: str) -> tuple[str, ...]:
    """The prompt sets one `--prompts` value stands for: Spec-Bench's questions give one set per
    category (`spec-bench:PATH:summarization`), so every summary and figure shows each category apart;
    anything else is one set."""
    if not spec.startswith(SPEC_BENCH):
        return (spec,)
    path, categories = parse_spec_bench(spec)
    present = {_spec_bench_column(q["category"]) for _, q in _spec_bench_questions(Path(path).expanduser(), spec)}
    return tuple(f"{SPEC_BENCH}{path}:{c}" for c in (categories or SPEC_BENCH_CATEGORIES) if c in present)


def rejoin_categories(specs: tuple[str, ...]) -> tuple[str, ...]:
    """A comma-separated axis splits `spec-bench:PATH:summarization,rag` in two: a bare category name
    after a Spec-Bench set joins it again."""
    joined: list[str] = []
    for spec in specs:
        if spec in SPEC_BENCH_CATEGORIES and joined and joined[-1].startswith(SPEC_BENCH) and parse_spec_bench(joined[-1])[1]:
            joined[-1] += f"+{spec}"
        else:
            joined.append(spec)
    return tuple(joined)


def prompt_set_name(spec: str) -> str:
    """A prompt set as readers know it: a shipped name, a file's stem, or a Spec-Bench category
    (`summarization`; several joined by '+')."""
    text = str(spec)
    if text.startswith(SPEC_BENCH):
        _, categories = parse_spec_bench(text)
        return "+".join(categories) or "spec-bench"
    if text.endswith(".jsonl") or "/" in text:
        return text.rsplit("/", 1)[-1].removesuffix(".jsonl")
    return text


def resolve_prompts(spec: str) -> Path:
    """A shipped set name (`zh-describe`, `audio-samples`) or a path to a JSONL / JSON manifest."""
    if spec in SHIPPED_AUDIO:
        return SHIPPED_AUDIO[spec]
    if spec in prompt_sets():
        return SETS_DIR / f"{spec}.jsonl"
    path = Path(spec).expanduser()
    if not path.is_file():
        raise InputError(
            f"prompts file {spec!r} not found: give a JSONL file, a JSON manifest or a shipped set ({', '.join(prompt_sets())})"
        )
    return path


def load_prompts(spec: str) -> list[PromptRecord]:
    """The records of a prompts file or manifest, in file order; ids unique."""
    if spec.startswith(SPEC_BENCH):
        return load_spec_bench(spec)
    path = resolve_prompts(spec)
    records: list[PromptRecord] = []
    seen: set[str] = set()
    for where, obj in _objects(path):
        record = _record(obj, where, path.parent)
        if record.id in seen:
            raise InputError(f"{where} repeats id {record.id!r}: ids must be unique")
        seen.add(record.id)
        records.append(record)
    if not records:
        raise InputError(f"prompts file {path} has no prompts: add records with 'id' and 'prompt' (or 'prompt_type')")
    return records


def _objects(path: Path):
    """(where, parsed item) for every item of a `.json` array or every non-blank JSONL line."""
    text = path.read_text(encoding="utf-8")
    if path.suffix.lower() == ".json":
        try:
            items = json.loads(text)
        except json.JSONDecodeError as e:
            raise InputError(f"{path.name} is not valid JSON ({e.msg}, line {e.lineno}): "
                             "fix it, or write JSONL as *.jsonl") from None
        if not isinstance(items, list):
            raise InputError(f"{path.name} must be a JSON array of objects, got {type(items).__name__}: wrap the records in [ ]")
        for number, item in enumerate(items, start=1):
            yield f"{path.name} item {number}", item
        return
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path.name} line {number}"
        try:
            yield where, json.loads(line)
        except json.JSONDecodeError as e:
            raise InputError(f"{where} is not valid JSON ({e.msg}): write one JSON object per line") from None


def _record(obj, where: str, folder: Path) -> PromptRecord:
    if not isinstance(obj, dict):
        raise InputError(f"{where} must be a JSON object with 'id' and 'prompt' (or 'prompt_type')")
    if not isinstance(obj.get("id"), str) or not obj["id"].strip():
        raise InputError(f"{where} needs a string 'id': add it")
    where = f"{where} (id {obj['id']!r})"
    for key in ("prompt", *OPTIONAL_TEXT):
        if obj.get(key) is not None and not isinstance(obj[key], str):
            raise InputError(f"{where}: {key!r} must be a string, got {type(obj[key]).__name__}")
    prompt_type = obj.get("prompt_type")
    if prompt_type is not None and prompt_type not in PROMPT_TYPES:
        raise InputError(f"{where} has prompt_type {prompt_type!r}: use one of {', '.join(PROMPT_TYPES)}, or give a 'prompt'")
    prompt = obj.get("prompt")
    if prompt is None:
        if prompt_type is None:
            raise InputError(f"{where} needs a string 'prompt' (or a 'prompt_type': {', '.join(PROMPT_TYPES)}): add it")
        prompt = PROMPT_TYPES[prompt_type]
    if not prompt.strip():
        raise InputError(f"{where} has an empty prompt: give it some text")
    audio = (folder / obj["audio"]).resolve() if obj.get("audio") else None
    language = obj["language"].strip().lower() if obj.get("language") else None
    return PromptRecord(obj["id"], prompt, obj.get("system"), audio, obj.get("reference"), language, prompt_type)


def _spec_bench_column(category: str) -> str | None:
    return next((column for column, names in SPEC_BENCH_CATEGORIES.items() if category in names), None)


def _spec_bench_questions(path: Path, spec: str):
    """(where, question) for every line of a Spec-Bench question file, its format checked."""
    if not path.is_file():
        raise InputError(f"Spec-Bench question file {str(path)!r} not found ({spec!r}): give the path to a "
                         "question.jsonl of Spec-Bench's format (question_id, category, turns)")
    for where, obj in _objects(path):
        if not isinstance(obj, dict) or not isinstance(obj.get("category"), str) or "question_id" not in obj:
            raise InputError(f"{where} is not a Spec-Bench question: each line needs question_id, category and turns")
        turns = obj.get("turns")
        if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t.strip() for t in turns):
            raise InputError(f"{where} (question {obj['question_id']!r}) needs 'turns': a list of non-empty strings")
        yield where, obj


def load_spec_bench(spec: str) -> list[PromptRecord]:
    """Spec-Bench's questions of the categories `spec` names, in file order, as prompts: the id is
    `CATEGORY-QUESTION_ID`, the prompt the first turn, `turns` every turn (MT-bench asks a second one
    after the model's own first answer)."""
    path, categories = parse_spec_bench(spec)
    records, seen = [], set()
    for where, q in _spec_bench_questions(Path(path).expanduser(), spec):
        column = _spec_bench_column(q["category"])
        if column is None or (categories and column not in categories):
            continue
        record = PromptRecord(f"{q['category']}-{q['question_id']}", q["turns"][0], turns=tuple(q["turns"]),
                              category=column)
        if record.id in seen:
            raise InputError(f"{where} repeats question {q['question_id']!r} of {q['category']!r}: ids must be unique")
        seen.add(record.id)
        records.append(record)
    if not records:
        raise InputError(f"{path} has no Spec-Bench questions of {', '.join(categories) or 'any known category'}: "
                         f"categories are {', '.join(SPEC_BENCH_CATEGORIES)}")
    return records
