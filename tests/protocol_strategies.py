"""Hypothesis strategies for the verifier protocol (`specdec.remote.protocol`), derived from its
schema (the message types and their fields are read from the protocol's classes): every message
type, well-typed and not (wrong types, huge and negative numbers, NaN, deep nesting, truncated and
oversized msgpack, unknown fields), in generated orders (verify before open, two opens, close twice).
Used by tests/test_fuzz_protocol.py, for the server and for the client."""
from __future__ import annotations

import math
import typing

import msgpack
import msgspec
import torch
from hypothesis import strategies as st

from specdec.core.config import CONSTRAINT_PROFILES
from specdec.core.policies import POLICIES
from specdec.core.verifier import VERIFIERS
from specdec.remote.payloads import pack_probs, pack_tensors
from specdec.remote.protocol import REQUESTS, SCHEMA, Ready, VerdictReply

VOCAB = 64  # the tiny pair's
INT64 = (-(1 << 63), (1 << 64) - 1)  # what msgpack can carry

# Any msgpack value: what a field holds when the sender ignores its type.
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(*INT64), st.sampled_from([0, -1, 1 << 31, 1 << 62, (1 << 64) - 1, -(1 << 63)]),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=20), st.binary(max_size=40),
)
junk = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                    max_leaves=12)

tokens = st.lists(st.integers(0, VOCAB - 1), max_size=6)


# A verdict to keep (verify.follow): in range or not; a server not started with --follow-verdicts refuses any.
followed = st.fixed_dictionaries({"accepted": st.integers(-1, 6), "token": st.none() | st.integers(-1, VOCAB)})


@st.composite
def probs_bytes(draw, n: int) -> bytes | None:
    """Draft distributions for n tokens: none (a draft-free block), dense, top-N, or malformed."""
    kind = draw(st.sampled_from(["none"] * 3 + ["dense"] * 3 + ["topn", "wrong shape", "nan", "not tensors"]))
    if kind == "none":
        return None
    rows = max(n, 1)
    if kind in ("dense", "topn"):
        probs = torch.softmax(torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(draw(st.integers(0, 99)))), -1)
        return pack_probs(probs, 4 if kind == "topn" else None)
    if kind == "wrong shape":
        return pack_tensors({"probs": torch.full((rows + 1, VOCAB), 1.0 / VOCAB)})
    if kind == "nan":
        return pack_tensors({"probs": torch.full((rows, VOCAB), math.nan)})
    return draw(st.binary(max_size=64))


def mostly(good: st.SearchStrategy, odd: st.SearchStrategy) -> st.SearchStrategy:
    """`good` nine times in ten, else `odd` (a value of the right type that may be refused)."""
    return st.integers(0, 9).flatmap(lambda i: good if i < 9 else odd)  # Hypothesis leans to 0: keep it good


def well_typed(kind: str) -> st.SearchStrategy[dict]:
    """A message of `kind` whose fields have the schema's types (values may still be refused)."""
    if kind == "hello":
        return st.fixed_dictionaries({"schema": mostly(st.just(SCHEMA), st.integers(-2, 3)), "token": st.none()})
    if kind == "open":
        return st.fixed_dictionaries({
            "prompt_ids": mostly(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=8), tokens),
            "features": st.none(), "max_new_tokens": mostly(st.integers(1, 10), st.integers(-3, 1 << 40)),
            "seed": mostly(st.integers(0, 1 << 20), st.integers(*INT64)),
            "accept_threshold": mostly(st.floats(0, 1), st.floats()),
            "verifier": st.sampled_from(sorted(VERIFIERS)), "constraints": st.sampled_from(list(CONSTRAINT_PROFILES)),
            "eos_ids": tokens, "vocab": mostly(st.just(VOCAB), st.integers(-1, VOCAB + 1)),
        }).flatmap(lambda m: mostly(st.sampled_from([("greedy", 0.0), ("sample", 1.0), ("sample", 0.7)]),
                                    st.tuples(st.sampled_from(sorted(POLICIES)), st.sampled_from([0.0, 1e-40, 0.7])))
                   .map(lambda pt: {**m, "policy": pt[0], "temperature": pt[1]}))
    if kind == "verify":
        return st.fixed_dictionaries({"base": mostly(st.integers(0, 24), st.integers(*INT64)), "new": tokens,
                                      "draft": st.lists(st.integers(0, VOCAB - 1), max_size=5),
                                      "follow": mostly(st.none(), followed),
                                      "parents": mostly(st.none(), st.lists(st.integers(-2, 5), max_size=6))}).flatmap(
            lambda m: probs_bytes(len(m["draft"])).map(lambda probs: {**m, "probs": probs}))
    if kind == "stats":
        return st.fixed_dictionaries({"since": mostly(st.integers(0, 8), st.integers(*INT64))})
    return st.just({})  # generate, close


# What an edge sends: each request type's tag and fields, in the schema's order.
SCHEMA_FIELDS = {cls.kind(): list(cls.__struct_fields__) for cls in REQUESTS}


def _structs_in(annotation) -> list[type]:
    """The msgspec Structs an annotation holds (X, X | None, list[X], Annotated[X, ...])."""
    if isinstance(annotation, type) and issubclass(annotation, msgspec.Struct):
        return [annotation]
    return [found for arg in typing.get_args(annotation) for found in _structs_in(arg)]


# Each request's nested objects, read from the schema as its top-level fields are: field -> the nested Struct's
# fields (verify.follow -> accepted, token). A field added to any nested object is mutated without a change here.
NESTED_FIELDS = {cls.kind(): {name: list(structs[0].__struct_fields__) for name, hint in typing.get_type_hints(cls).items()
                              if (structs := _structs_in(hint))} for cls in REQUESTS}
KINDS = list(SCHEMA_FIELDS)
# first: likeliest
WEIGHTED = ["verify", "verify", "verify", "verify", "generate", "generate", "open", "stats", "close", "open", "hello"]


@st.composite
def message(draw) -> dict:
    """One message as a dict: well-typed, or with some fields replaced by junk, dropped, or added."""
    # Weighted towards verify (the model's path); one in twenty an unknown type.
    kind = draw(st.text(max_size=8)) if draw(st.integers(0, 19)) == 19 else draw(st.sampled_from(WEIGHTED))
    fields = dict(draw(well_typed(kind))) if kind in KINDS else {}
    if draw(st.integers(0, 5)) == 5:  # one in six: mutated
        for name in SCHEMA_FIELDS.get(kind, []):
            change = draw(st.sampled_from(["keep", "keep", "junk", "drop"]))
            if change == "junk":
                fields[name] = draw(junk)
            elif change == "drop":
                fields.pop(name, None)
        fields.update(draw(st.dictionaries(st.text(min_size=1, max_size=8), junk, max_size=2)))  # unknown fields
    for name, inner in NESTED_FIELDS.get(kind, {}).items():  # one in four: a nested object's own fields mutated
        if isinstance(fields.get(name), dict) and draw(st.integers(0, 3)) == 3:
            nested = dict(fields[name])
            for sub in inner:
                change = draw(st.sampled_from(["keep", "junk", "drop"]))
                if change == "junk":
                    nested[sub] = draw(junk)
                elif change == "drop":
                    nested.pop(sub, None)
            fields[name] = nested
    return {"type": kind, **fields}


def deep(depth: int) -> bytes:
    """`depth` nested one-element arrays: deeper than msgpack's unpacker will go."""
    return b"\x91" * depth + b"\xc0"


@st.composite
def frame(draw) -> dict | bytes | str:
    """What goes on the wire: a message (mostly; the client packs it), or bytes that are not one."""
    fields = draw(message())
    packed = msgpack.packb(fields, use_bin_type=True)
    how = draw(st.sampled_from(["whole"] * 40 + ["truncated", "random", "deep", "text", "not a map", "oversized"]))
    if how == "truncated":
        return packed[: draw(st.integers(0, max(len(packed) - 1, 0)))]
    if how == "random":
        return draw(st.binary(max_size=64))
    if how == "deep":
        return deep(draw(st.integers(500, 5000)))
    if how == "text":
        return draw(st.text(max_size=20))
    if how == "not a map":
        return msgpack.packb(draw(junk), use_bin_type=True)
    if how == "oversized":
        return b"\x00" * ((1 << 20) + draw(st.integers(1, 1024)))  # past a 1 MiB --max-message-mb
    return fields


@st.composite
def conversation(draw) -> tuple[list[dict | bytes | str], bool]:
    """One connection's frames: mostly a valid hello first, then messages in any order; and whether
    the client keeps each verify's `base` and `new` in step with the session it tracks (three
    time in four: a well-framed verify reaches the model, where the mixed-session bug was)."""
    frames: list[dict | bytes | str] = []
    if draw(st.integers(0, 9)) < 9:
        frames.append({"type": "hello", "schema": SCHEMA, "token": None})
    if draw(st.integers(0, 3)) < 3:  # a session start (well-typed), so later messages reach a live session
        frames.append({"type": "open", **draw(well_typed("open"))})
    frames += draw(st.lists(frame(), min_size=1, max_size=8))
    return frames, draw(st.integers(0, 3)) < 3


# -- what a fuzzing server sends an edge client -------------------------------------------------------
READY = {"type": "ready", **msgspec.structs.asdict(Ready(schema=SCHEMA, model="fake", vocab_size=VOCAB, tokenizer_sha256="",
                                                         accepts_audio=False, runtime="torch"))}
VERDICT = {"type": "verdict", **msgspec.structs.asdict(VerdictReply(accepted=1, token=5, tokens_in=9, compute_s=0.01,
                                                                    queue_s=0.0, batch=1))}


@st.composite
def reply(draw, base: dict) -> bytes:
    """`base` (a ready or a verdict) with fields changed, dropped or added, another type, or not msgpack."""
    how = draw(st.sampled_from(["fields"] * 6 + ["numbers", "type", "error", "random", "truncated", "deep"]))
    fields = dict(base)
    if how in ("fields", "numbers"):
        for name in [k for k in base if k != "type"]:
            change = draw(st.sampled_from(["keep", "keep", "keep", "junk", "drop", "number"]))
            if change == "junk":
                fields[name] = draw(junk)
            elif change == "drop":
                fields.pop(name)
            elif change == "number" or how == "numbers":
                fields[name] = draw(st.integers(*INT64) | st.floats() | st.sampled_from([-1, 0, 3, 64, 1 << 40]))
        fields.update(draw(st.dictionaries(st.text(min_size=1, max_size=8), junk, max_size=2)))
    elif how == "type":
        fields["type"] = draw(st.sampled_from(["ready", "verdict", "generated", "stats", "hello"]) | junk)
    elif how == "error":
        fields = {"type": "error", "code": draw(junk), "message": draw(junk)}
    packed = msgpack.packb(fields, use_bin_type=True)
    if how == "random":
        return draw(st.binary(max_size=64))
    if how == "truncated":
        return packed[: draw(st.integers(0, len(packed) - 1))]
    if how == "deep":
        return deep(draw(st.integers(500, 3000)))
    return packed
