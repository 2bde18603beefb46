"""The protocol's schema (specdec/remote/protocol.py): the typed messages keep the wire of schema 1
map for map, an older peer's messages still decode, and whatever breaks the schema is one
ProtocolError line naming the field, the same for every peer (server, edge client, fleet client).
Without a model: these run in the quick loop."""
from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec.remote.protocol import (
    REPLIES,
    REQUESTS,
    SCHEMA,
    Close,
    Followed,
    Generate,
    Generated,
    Hello,
    Open,
    ProtocolError,
    Ready,
    Refusal,
    StatsReply,
    StatsRequest,
    UnexpectedMessage,
    VerdictReply,
    Verify,
    decode,
    encode,
)
from tests.protocol_strategies import SCHEMA_FIELDS, well_typed
from tests.wire import decode as raw_decode
from tests.wire import encode as raw_encode

OPEN = dict(prompt_ids=[3, 17], max_new_tokens=8, temperature=0.0, seed=0, policy="greedy", accept_threshold=0.1,
            verifier="cached", constraints="none", eos_ids=[], vocab=64, features=None)

# What schema 1 put on the wire before the types (each message's keys, as the hand-written dicts had them).
SCHEMA_1_KEYS = [
    (Hello(schema=SCHEMA, token=None), {"type", "schema", "token"}),
    (Open(**OPEN), {"type", *OPEN}),
    (Verify(base=2, new=[], draft=[5], probs=None), {"type", "base", "new", "draft", "probs"}),
    (Generate(), {"type"}),
    (StatsRequest(since=0), {"type", "since"}),
    (Close(), {"type"}),
    (Ready(schema=SCHEMA, model="m", vocab_size=64, tokenizer_sha256="x", accepts_audio=False, runtime="torch", device="cpu"),
     {"type", "schema", "model", "vocab_size", "tokenizer_sha256", "accepts_audio", "runtime", "device"}),
    (VerdictReply(accepted=1, token=5, tokens_in=3, compute_s=0.5, queue_s=0.0, batch=2),
     {"type", "accepted", "token", "tokens_in", "compute_s", "queue_s", "batch"}),
    (Generated(tokens=[1], stopped_by="max_new_tokens", queue_s=[0.0], compute_s=[0.1], batch=[1]),
     {"type", "tokens", "stopped_by", "queue_s", "compute_s", "batch"}),
    (StatsReply(batches=[], next=0, live=None), {"type", "batches", "next", "live"}),
    (Refusal(code="capacity", message="full"), {"type", "code", "message"}),
]


# Optional fields added within schema 1 since (an older peer skips them; without them a message decodes with
# their defaults): a verdict to keep, the server's word that it keeps one, the KV cache it keeps, and token trees
# (a verify's parents, the server's word that it verifies them, the verdict's kept path) (specdec/remote/protocol.py).
ADDED = {"verify": {"follow", "parents"}, "ready": {"follows", "kv_cache", "trees"}, "verdict": {"agreed", "path"}}


@pytest.mark.parametrize("message,keys", SCHEMA_1_KEYS, ids=lambda m: type(m).__name__ if not isinstance(m, set) else "")
def test_every_message_keeps_schema_1s_map_and_decodes_back(message, keys):
    wire = raw_decode(encode(message))
    assert set(wire) == keys | ADDED.get(type(message).kind(), set()) and wire["type"] == type(message).kind()
    fields = {name: value for name, value in wire.items() if name != "type"}
    assert decode(raw_encode(wire["type"], **fields), type(message)) == message  # the map as an untyped peer writes it


def test_every_type_of_the_schema_is_covered_above():
    assert {type(m) for m, _ in SCHEMA_1_KEYS} == set(REQUESTS) | set(REPLIES)


def test_an_older_servers_ready_without_runtime_and_device_decodes_with_their_defaults():
    ready = decode(raw_encode("ready", schema=SCHEMA, model="m", vocab_size=64, tokenizer_sha256="x", accepts_audio=False),
                   Ready)
    assert (ready.runtime, ready.device) == (None, "cpu")  # unknown; an older server ran on the CPU


def test_messages_of_a_peer_without_the_added_fields_decode_with_their_defaults():
    verify = decode(raw_encode("verify", base=2, new=[], draft=[5], probs=None), Verify)
    assert verify.follow is None and verify.parents is None  # an older client's verify: a chain
    ready = decode(raw_encode("ready", schema=SCHEMA, model="m", vocab_size=64, tokenizer_sha256="x", accepts_audio=False),
                   Ready)
    assert ready.follows is False and ready.trees is False  # an older server: chains only
    reply = decode(raw_encode("verdict", accepted=1, token=5, tokens_in=3, compute_s=0.5, queue_s=0.0), VerdictReply)
    assert reply.agreed is None and reply.path is None


def test_a_tree_travels_and_one_without_a_parent_per_token_or_with_a_follow_is_refused():
    verify = Verify(base=2, new=[], draft=[5, 6, 7], parents=[-1, 0, -1])
    assert decode(encode(verify), Verify) == verify and raw_decode(encode(verify))["parents"] == [-1, 0, -1]
    with pytest.raises(ProtocolError, match=r"^verify: a tree needs one parent per draft token: 2 tokens, 1 parents$"):
        decode(raw_encode("verify", base=2, new=[], draft=[5, 6], parents=[-1]), Verify)
    with pytest.raises(ProtocolError, match=r"^verify: follow keeps a chain's verdict; a tree's cannot be followed$"):
        decode(raw_encode("verify", base=2, new=[], draft=[5], parents=[-1], follow={"accepted": 0}), Verify)


def test_a_followed_verdict_travels_and_one_the_draft_cannot_hold_is_refused():
    verify = Verify(base=2, new=[], draft=[5, 6], follow=Followed(accepted=2, token=9))
    assert decode(encode(verify), Verify) == verify
    assert raw_decode(encode(verify))["follow"] == {"accepted": 2, "token": 9}
    with pytest.raises(ProtocolError, match=r"^verify.follow.accepted = 3 is outside \[0, 2\]$"):
        decode(raw_encode("verify", base=2, new=[], draft=[5, 6], follow={"accepted": 3, "token": 1}), Verify)
    with pytest.raises(ProtocolError, match=r"^verify.follow.token = -1 is outside"):
        decode(raw_encode("verify", base=2, new=[], draft=[5], follow={"accepted": 0, "token": -1}), Verify)


def test_a_field_this_side_does_not_know_is_skipped():
    assert decode(raw_encode("stats", since=3, newer_field={"a": [1, 2]}), StatsRequest) == StatsRequest(since=3)


@pytest.mark.parametrize("data,expect,reason", [
    (raw_encode("open", **{**OPEN, "max_new_tokens": "eight"}), Open, "field 'max_new_tokens' must be int, got str"),
    (raw_encode("open", **{**OPEN, "prompt_ids": [1, None]}), Open, "field 'prompt_ids[1]' must be int, got NoneType"),
    (raw_encode("open", **{k: v for k, v in OPEN.items() if k != "vocab"}), Open,
     "field 'vocab' must be int, got NoneType (missing)"),
    (raw_encode("open", **{**OPEN, "features": "audio"}), Open, "field 'features' must be bytes or None, got str"),
    (raw_encode("open", **{**OPEN, "policy": "nonsense"}), Open, "open: policy must be one of"),
    (raw_encode("open", **{**OPEN, "prompt_ids": []}), Open, "open: prompt_ids is empty"),
    (raw_encode("verify", base=1, new=[], draft=list(range(65))), Verify, "field 'draft' must be list of length <= 64"),
    (raw_encode("verify", base=True, new=[], draft=[]), Verify, "field 'base' must be int, got bool"),
    # a nested object's fields by their whole path (a missing one was looked up in the outer type: `internal`)
    (raw_encode("verify", base=1, new=[], draft=[2], follow={"token": 1}), Verify,
     "field 'follow.accepted' must be int, got NoneType (missing)"),
    (raw_encode("verify", base=1, new=[], draft=[2], follow={"accepted": "one"}), Verify,
     "field 'follow.accepted' must be int, got str"),
    (raw_encode("verify", base=1, new=[], draft=[2], follow=[1]), Verify, "field 'follow' must be dict or None, got list"),
    (raw_encode("stats", since=-1), StatsRequest, "stats: since must be >= 0, got -1"),
    (raw_encode("ready", schema=1, model="m", vocab_size=0, tokenizer_sha256="", accepts_audio=False), Ready,
     "ready.vocab_size = 0 is outside [1, None]"),
    (raw_encode("verdict", accepted=1, token=5, tokens_in=3, compute_s=float("inf"), queue_s=0.0), VerdictReply,
     "verdict.compute_s = inf is outside [0, None]"),
    (raw_encode("stats", batches=[], next=0, live=[1]), StatsReply, "stats.live must be dict or None, got list"),
    (b"\x81\x01\x02", StatsRequest, "a message must be a map with a string `type`"),  # {1: 2}
    (raw_encode("stats", since=0)[:-1], StatsRequest, "undecodable message (Input data was truncated)"),
    (raw_encode("hello", schema=1, token="@@").replace(b"\xa2@@", b"\xa2\xed\xa0"), Hello,
     "undecodable message (a string that is not UTF-8)"),
    # an unknown field nested deeper than the decoder recurses: one line, not a RecursionError
    (b"\x83\xa4type\xa5stats\xa5since\x00\xa4junk" + b"\x91" * 100_000 + b"\xc0", StatsRequest,
     "undecodable message (nested too deeply)"),
    ("text", StatsRequest, "text frame received"),
])
def test_what_breaks_the_schema_is_one_line_naming_the_field(data, expect, reason):
    with pytest.raises(ProtocolError) as refused:
        decode(data, expect)
    assert reason in str(refused.value) and "\n" not in str(refused.value) and refused.value.code == "bad_message"


def test_a_message_not_due_is_unexpected_and_names_its_type():
    with pytest.raises(UnexpectedMessage, match="expected open or verify, got 'dance'") as refused:
        decode(raw_encode("dance"), Open, Verify)
    assert refused.value.kind == "dance"
    with pytest.raises(UnexpectedMessage, match="expected verdict or error, got 'ready'"):  # checked before its fields
        decode(raw_encode("ready"), VerdictReply, Refusal)


@settings(max_examples=30, database=None, deadline=None)
@given(st.sampled_from(list(SCHEMA_FIELDS)).flatmap(lambda kind: well_typed(kind).map(lambda m: (kind, m))))
def test_the_fuzz_generates_exactly_the_schemas_fields(generated):
    """The strategies' well-typed messages carry each request type's fields, no more, no fewer: a field
    added to the schema fails here until the fuzz generates it."""
    kind, message = generated
    assert sorted(message) == sorted(SCHEMA_FIELDS[kind])
    cls = next(c for c in REQUESTS if c.kind() == kind)
    try:
        decode(raw_encode(kind, **message), cls)
    except ProtocolError as e:  # a value the schema's checks refuse (an empty prompt, a negative since), never a type
        assert "must be int" not in str(e) and "must be list" not in str(e), e


def test_a_struct_built_here_is_not_checked_until_it_decodes():
    """Construction is free (msgspec checks types while decoding): a sender cannot fail locally where
    the server would have refused it in one line."""
    too_long = Verify(base=0, new=[], draft=list(range(100)))
    with pytest.raises(ProtocolError, match="length <= 64"):
        decode(encode(too_long), Verify)
    assert msgspec.structs.asdict(too_long)["draft"] == list(range(100))
