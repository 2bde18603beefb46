"""The verifier protocol: msgpack messages on one WebSocket per edge client, schema-versioned.

One connection carries one session at a time; a session's KV cache lives until `close`, the end of
the connection, or the server's idle TTL, whichever comes first.

  edge -> cloud (`Request`)                             cloud -> edge (`Reply`)
  Hello  {schema, token}                                Ready   {schema, model, vocab_size, tokenizer_sha256, accepts_audio,
                                                                 runtime, device, follows, trees}
  Open   {prompt_ids, settings..., features}            (no reply: sent back to back with the first verify)
  Verify {base, new, draft, probs, follow, parents}     VerdictReply {accepted, token, tokens_in, compute_s, queue_s, batch,
                                                                        agreed, path}
  Generate {}                                           Generated {tokens, stopped_by, queue_s[], compute_s[], batch[]}
  StatsRequest {since}                                  StatsReply {batches: [{t_s, rows, tokens, max_block, positions,
                                                                 forward_s}], next, live: {connections, sessions, tasks} or nil}
  Close  {}                                             Refusal {code, message}, then the server closes the connection
                                                        (code: one of ERROR_CODES below)

On the wire each is a msgpack map: its fields and `type`, the class's tag (hello, open, verify,
generate, stats, close; ready, verdict, generated, stats, error). The classes below are the one
schema: server, edge client and the fleet's clients send them and `decode` them; msgspec checks
every field's type while it decodes, and `check` the rules a type cannot say (a range, a
registered name). A field an older peer leaves out has a default (`ready.runtime`, `ready.device`);
a field this side does not know is skipped.

`generate` = cloud-only serving: the server produces every remaining token itself, one batched
next-token step at a time; after verifies it continues from their accepted sequence (the last
verdict's token first). `batch` = rows in the forward that served the request (its
`compute_s` is that whole forward). `stats` needs no session: the batch log from entry `since` on, and
`live`: the server's open connections, sessions and asyncio tasks now (a soak's health signals; nil
for a remote client unless the server shares its stats).

`verify.new` = accepted tokens the server has not seen (corrections, bonuses and unescalated blocks
since its last verdict: after a verdict it starts with that verdict's token); `base` = the edge's
accepted length, so both sides check they agree. `verify.draft` may be empty: a plain step of the cloud
(a draft-free drafter that found nothing to propose), whose verdict is accepted 0 and the next token.
`ready.runtime` = what runs the model (its runtime's name; nil where the server cannot say); an
older server leaves it out, so a client reads a missing one as unknown. `ready.device` = where its torch
model runs (cpu, cuda:0; cpu for llama.cpp); an older server leaves it out (it ran on the CPU).
`verify.follow` = {accepted, token}: a verdict for the server to keep instead of its own, which it still
computes and reports in `verdict.agreed`. Only a server started with --follow-verdicts takes it (`ready.follows`
says so; another refuses with `no_follow`): it lets a replayed edge time a random-weight architecture of the
real size with the recorded acceptance (docs/gpu.md).
`verify.parents` = a token tree's (specdec/core/tree.py): `draft` holds its nodes, parents[i] node i's parent (-1:
the last accepted token), each before its child; the verdict's `path` = the nodes it kept, root to leaf (accepted of
them). Only a server whose `ready.trees` says it verifies trees takes one (another refuses with `no_trees`), under
a policy that accepts by the argmax, greedy, on a cached verifier; an older client sends none (chains), and a
newer client reads an older server's missing `trees` as chains only.
`probs` (sample policy only) = the draft distributions the tokens were drawn from (payloads.py): [n, V] float32, or
the top-N rows as (index, value) when the edge drafts from a top-N truncated distribution; nil for a
draft-free block (prompt lookup and the like), whose tokens the policy takes as point masses.
"""
from __future__ import annotations

import hashlib
import json
import math
import re
import typing
from functools import cache
from pathlib import Path
from typing import Annotated, Any, ClassVar, TypeVar

import msgspec

from specdec.core.config import CONSTRAINT_PROFILES
from specdec.core.policies import POLICIES
from specdec.core.verifier import VERIFIERS
from specdec.errors import ConfigError

# A peer of another schema is refused at `hello` (code `schema`), so `Hello` keeps its two fields'
# types in every schema: a client of any version gets that one line, not `bad_message`.
SCHEMA = 1
# Every `error.code` the server sends, and what it means. `error.message` is one line for a person;
# an `internal` one never carries an exception's text (the server's log has it).
ERROR_CODES = {
    "bad_message": "a message that breaks the protocol: undecodable, wrong type or field, out of range",
    "no_session": "verify or generate before open",
    "out_of_sync": "verify.base disagrees with the server's accepted length",
    "too_long": "the prompt plus max_new_tokens exceed the model's positions",
    "no_audio": "audio features sent to a text-only model",
    "schema": "hello.schema is not this server's",
    "auth": "a bad or missing token",
    "capacity": "too many connections, sessions, or sessions of this client",
    "idle": "a connection without a session idled too long",
    "expired": "a session idled past the server's TTL",
    "no_follow": "verify.follow sent to a server not started with --follow-verdicts",
    "no_trees": "a token tree sent to a server whose runtime or session verifies chains only",
    "verify_failed": "this session's verdict failed (its settings or policy); other sessions go on",
    "shutdown": "the server is stopping",
    "refused": "the session's own failure, not one of the above",
    "internal": "a bug in the server: logged there; this session ends, the server goes on",
}
MAX_DRAFT_TOKENS = 64  # per verify; k beyond this is refused by the server


class ProtocolError(Exception):
    """A message that breaks the protocol; the server answers `error` and closes the connection."""

    def __init__(self, message: str, code: str = "bad_message") -> None:
        super().__init__(message)
        self.code = code


class UnexpectedMessage(ProtocolError):
    """A well-formed message of a type not due here (`kind`: its tag)."""

    def __init__(self, kind: str, expected: tuple[str, ...]) -> None:
        super().__init__(f"expected {' or '.join(expected)}, got {kind!r}")
        self.kind = kind


def within(where: str, value: float, low: float | None, high: float | None) -> None:
    """`value` is finite and in [low, high] (None: unbounded), else a ProtocolError naming it."""
    if not math.isfinite(value) or low is not None and value < low or high is not None and value > high:
        raise ProtocolError(f"{where} = {value!r} is outside [{low}, {high}]")


def check_token_ids(name: str, ids: list[int], vocab: int, max_len: int | None = None) -> list[int]:
    """Token ids of a field, each in [0, vocab), at most `max_len` of them (the session's limits)."""
    if max_len is not None and len(ids) > max_len:
        raise ProtocolError(f"field {name!r} has {len(ids)} tokens, more than {max_len}")
    if not all(0 <= t < vocab for t in ids):
        raise ProtocolError(f"field {name!r} must hold token ids in [0, {vocab})")
    return ids


# -- the schema ----------------------------------------------------------------------------------
class Message(msgspec.Struct, tag_field="type", kw_only=True, frozen=True):
    """A message: a msgpack map whose `type` is its class's tag. (Every subclass says frozen=True again: msgspec
    inherits it, but a type checker reads each class's own keywords.)"""

    @classmethod
    def kind(cls) -> str:
        tag = cls.__struct_config__.tag
        assert isinstance(tag, str)  # every message's tag is its class's word (tag="hello", ...), never an int
        return tag

    @classmethod
    def field_name(cls, path: str) -> str:
        """How an error names a field (`path`: `name` or `name[i]`)."""
        return f"{cls.kind()}.{path}"

    def check(self) -> None:
        """The rules its types cannot say; `decode` runs it. Raises ProtocolError."""


class Request(Message, frozen=True):
    """Edge -> cloud. A refusal names a field as `field 'name'` (what a client of the server reads)."""

    @classmethod
    def field_name(cls, path: str) -> str:
        return f"field {path!r}"


class Reply(Message, frozen=True):
    """Cloud -> edge. A broken one names its field as `kind.name`."""


class Hello(Request, tag="hello", frozen=True):
    schema: int
    token: str | None = None


class Open(Request, tag="open", frozen=True):
    """A session: the prompt, the edge's decoding settings, its stop ids and vocabulary, the audio once."""

    # The edge's decoding settings among the fields: what a result record also carries (a fleet replays
    # a record's generation with them).
    SETTINGS: ClassVar[tuple[str, ...]] = ("max_new_tokens", "temperature", "seed", "policy", "accept_threshold",
                                           "verifier", "constraints")
    prompt_ids: list[int]
    max_new_tokens: int
    temperature: float
    seed: int
    policy: str
    accept_threshold: float
    verifier: str
    constraints: str
    eos_ids: list[int]
    vocab: int
    features: bytes | None = None  # the prompt's audio features (payloads.py); nil: text only

    def check(self) -> None:
        if not self.prompt_ids:
            raise ProtocolError("open: prompt_ids is empty")
        if self.policy not in POLICIES or self.verifier not in VERIFIERS:
            raise ProtocolError(f"open: policy must be one of {tuple(POLICIES)} and verifier one of {tuple(VERIFIERS)}")
        if self.constraints not in CONSTRAINT_PROFILES:
            raise ProtocolError(f"open: constraints must be one of {CONSTRAINT_PROFILES}")


class Followed(msgspec.Struct, kw_only=True, frozen=True):
    """A verdict the server is to keep (`verify.follow`): a replayed edge's recorded one."""

    accepted: int
    token: int | None = None  # nil: keep the server's own token (the recording took none: its budget ended)


class Verify(Request, tag="verify", frozen=True):
    base: int
    new: list[int]
    draft: Annotated[list[int], msgspec.Meta(max_length=MAX_DRAFT_TOKENS)]
    probs: bytes | None = None  # the draft distributions (payloads.pack_probs); nil: a draft-free block
    follow: Followed | None = None  # keep this verdict (a server started with --follow-verdicts only); nil: its own
    parents: list[int] | None = None  # a token tree's, one per draft token (-1: the root); nil: a chain

    def check(self) -> None:
        if self.parents is not None:
            if len(self.parents) != len(self.draft):
                raise ProtocolError(f"verify: a tree needs one parent per draft token: {len(self.draft)} tokens, "
                                    f"{len(self.parents)} parents")
            if self.follow is not None:
                raise ProtocolError("verify: follow keeps a chain's verdict; a tree's cannot be followed")
        if self.follow is not None:
            within("verify.follow.accepted", self.follow.accepted, 0, len(self.draft))
            if self.follow.token is not None:
                within("verify.follow.token", self.follow.token, 0, None)


class Generate(Request, tag="generate", frozen=True):
    pass


class StatsRequest(Request, tag="stats", frozen=True):
    since: int

    def check(self) -> None:
        if self.since < 0:
            raise ProtocolError(f"stats: since must be >= 0, got {self.since}")


class Close(Request, tag="close", frozen=True):
    pass


class Ready(Reply, tag="ready", frozen=True):
    schema: int
    model: str
    vocab_size: int
    tokenizer_sha256: str
    accepts_audio: bool
    runtime: str | None = None  # an older server leaves it out: unknown
    device: str = "cpu"  # an older server leaves it out: it ran on the CPU
    follows: bool = False  # it keeps a verify's `follow` verdict (serve --follow-verdicts); an older server does not
    kv_cache: str | None = None  # the torch runtime's: dynamic or static (serve --kv-cache auto resolved); else unknown
    trees: bool = False  # it verifies token trees (verify.parents); an older server leaves it out: chains only

    def check(self) -> None:
        within("ready.vocab_size", self.vocab_size, 1, None)


class VerdictReply(Reply, tag="verdict", frozen=True):
    accepted: int
    token: int
    tokens_in: int
    compute_s: float
    queue_s: float
    batch: int = 1
    agreed: bool | None = None  # a followed verify: was the server's own verdict the one it kept? nil: not followed
    path: list[int] | None = None  # a tree's kept nodes, root to leaf; nil: a chain's verdict

    def check(self) -> None:
        for name in ("accepted", "token", "tokens_in", "compute_s", "queue_s"):
            within(f"verdict.{name}", getattr(self, name), 0, None)


class Generated(Reply, tag="generated", frozen=True):
    tokens: list[int]
    stopped_by: str
    queue_s: list[float]
    compute_s: list[float]
    batch: list[int]


class StatsReply(Reply, tag="stats", frozen=True):
    batches: list[dict[str, Any]]
    next: int
    live: dict[str, int] | None = None


class Refusal(Reply, tag="error", frozen=True):
    code: str
    message: str


REQUESTS: tuple[type[Request], ...] = (Hello, Open, Verify, Generate, StatsRequest, Close)
REPLIES: tuple[type[Reply], ...] = (Ready, VerdictReply, Generated, StatsReply, Refusal)
M = TypeVar("M", bound=Message)


def encode(message: Message) -> bytes:
    return _ENCODER.encode(message)


def decode(data: bytes | str, *expect: type[M]) -> M:
    """One message of the types `expect`, its fields type-checked while it decodes, then `check`ed.
    Anything else is a ProtocolError: one line naming what is wrong (UnexpectedMessage: a type not due)."""
    if isinstance(data, str):
        raise ProtocolError("text frame received: the protocol sends binary msgpack frames")
    kind = _undecodable_or(lambda: _ENVELOPE.decode(data).type, "a message must be a map with a string `type`")
    cls = next((c for c in expect if c.kind() == kind), None)
    if cls is None:
        raise UnexpectedMessage(kind, tuple(c.kind() for c in expect))
    message = _undecodable_or(lambda: _decoder(cls).decode(data), cls)
    message.check()
    return message


class _Envelope(msgspec.Struct):
    type: str


_ENCODER = msgspec.msgpack.Encoder()
_ENVELOPE = msgspec.msgpack.Decoder(_Envelope)


@cache
def _decoder(cls: type[M]) -> msgspec.msgpack.Decoder:
    return msgspec.msgpack.Decoder(cls)


def _undecodable_or(decoding, invalid: type[Message] | str):
    """decoding(); its errors as one ProtocolError line (`invalid`: the class whose schema was broken,
    or the line to give)."""
    try:
        return decoding()
    except msgspec.ValidationError as e:
        raise ProtocolError(invalid if isinstance(invalid, str) else _explain(invalid, str(e))) from None
    except msgspec.DecodeError as e:
        raise ProtocolError(f"undecodable message ({e})") from None
    except UnicodeDecodeError:
        raise ProtocolError("undecodable message (a string that is not UTF-8)") from None
    except RecursionError:
        raise ProtocolError("undecodable message (nested too deeply)") from None


# msgspec's errors read "Expected `int`, got `str` - at `$.vocab_size`" or "Object missing required
# field `accepted`"; said here in Python's words: "ready.vocab_size must be int, got str".
_AT = re.compile(r"^(?P<problem>.*) - at `\$\.(?P<path>[^`]*)`$")
_EXPECTED = re.compile(r"^Expected `(?P<expected>[^`]*)`(?P<limit>.*?)(?:, got `(?P<got>[^`]*)`)?$")
_MISSING = re.compile(r"^Object missing required field `(?P<name>[^`]*)`")
_PYTHON_NAMES = {"null": "NoneType", "None": "NoneType", "array": "list", "object": "dict"}


def _explain(cls: type[Message], error: str) -> str:
    """msgspec's error as one line naming the field by its whole path (`field 'follow.accepted'`, `verdict.batch`);
    what it cannot place, said as msgspec says it: never an exception of its own (a broken nested object once got
    `internal` here, its missing field looked up in the outer message's type)."""
    try:
        return _placed(cls, error)
    except (KeyError, TypeError, ValueError, AttributeError, NameError):
        return f"{cls.kind()}: {' '.join(error.split())}"


def _placed(cls: type[Message], error: str) -> str:
    at = _AT.match(error)
    if missing := _MISSING.match(error):
        path = at["path"] if at else ""  # where the object missing the field sits: "" is the message itself
        owner = _struct_at(cls, path)
        if owner is None:
            raise KeyError(path)
        annotation = typing.get_type_hints(owner)[missing["name"]]
        expected = (typing.get_origin(annotation) or annotation).__name__
        field = f"{path}.{missing['name']}" if path else missing["name"]
        return f"{cls.field_name(field)} must be {expected}, got NoneType (missing)"
    if " - at `key` in " in error:
        return f"{cls.kind()}: a map's keys must be strings"
    said = _EXPECTED.match(at["problem"]) if at else None
    if not at or not said:
        return f"{cls.kind()}: {' '.join(error.split())}"
    expected = " or ".join("None" if t in ("null", "None") else _PYTHON_NAMES.get(t, t) for t in said["expected"].split(" | "))
    got = f", got {_PYTHON_NAMES.get(said['got'], said['got'])}" if said["got"] else ""
    return f"{cls.field_name(at['path'])} must be {expected}{said['limit']}{got}"


def _struct_at(cls: type, path: str) -> type | None:
    """The Struct type at `path` inside `cls` (`follow`, `rows[2].follow`; "" is `cls`), through optional, list and
    annotated types; None where the path leads to no Struct."""
    current: type | None = cls
    for part in (re.sub(r"\[\d+\]", "", path).split(".") if path else []):
        hints = typing.get_type_hints(current) if current is not None else {}
        current = _struct_in(hints[part]) if part in hints else None
    return current


def _struct_in(annotation: Any) -> type | None:
    """The msgspec Struct an annotation holds: X, X | None, list[X], Annotated[X, ...]."""
    if isinstance(annotation, type) and issubclass(annotation, msgspec.Struct):
        return annotation
    return next((found for arg in typing.get_args(annotation) if (found := _struct_in(arg)) is not None), None)


def tokenizer_sha256(tokenizer: Any) -> str:
    """Fingerprint of a vocabulary: edge and cloud must share one token for token."""
    return hashlib.sha256(json.dumps(tokenizer.get_vocab(), sort_keys=True).encode()).hexdigest()


def parse_address(text: str, what: str = "address") -> tuple[str, int]:
    """'HOST:PORT' (or 'ws://HOST:PORT', 'wss://HOST:PORT') -> (host, port). IPv6 hosts in brackets: [::1]:8000."""
    address = text.strip().removeprefix("wss://").removeprefix("ws://").rstrip("/")
    host, sep, port = address.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"{what} {text!r} is not HOST:PORT: write e.g. 127.0.0.1:8765")
    return host, int(port)


def read_token(path: str | Path) -> str:
    """The shared secret in a token file (surrounding whitespace dropped)."""
    try:
        token = Path(path).read_text().strip()
    except OSError as e:
        raise ConfigError(f"cannot read token file {path}: {e.strerror}; give a readable file holding the shared "
                          "secret") from None
    if not token:
        raise ConfigError(f"token file {path} is empty: put a shared secret in it")
    return token


def token_file_warning(path: str | Path) -> str | None:
    """A line to print when other users of this machine can read the secret (mode o+r)."""
    if Path(path).stat().st_mode & 0o004:
        return f"warning: token file {path} is readable by every user of this machine: chmod 600 {path}"
    return None
