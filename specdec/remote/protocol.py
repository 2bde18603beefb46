"""The verifier protocol: msgpack messages on one WebSocket per edge client, schema-versioned.

One connection carries one session at a time; a session's KV cache lives until `close`, the end of
the connection, or the server's idle TTL, whichever comes first.

  edge -> cloud                                         cloud -> edge
  hello  {schema, token}                                ready   {schema, model, vocab_size, tokenizer_sha256, accepts_audio,
                                                                 runtime, device}
  open   {prompt_ids, features, settings...}            (no reply: sent back to back with the first verify)
  verify {base, new, draft, probs}                      verdict {accepted, token, tokens_in, compute_s, queue_s, batch}
  generate {}                                           generated {tokens, stopped_by, queue_s[], compute_s[], batch[]}
  stats  {since}                                        stats   {batches: [{t_s, rows, tokens, max_block, positions, forward_s}], next,
                                                                 live: {connections, sessions, tasks} or nil}
  close  {}                                             error   {code, message}, then the server closes the connection
                                                        (code: one of ERROR_CODES below)

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
`ready.runtime` = what runs the model (torch, torch-int8, llamacpp; nil where the server cannot say); an
older server leaves it out, so a client reads a missing one as unknown. `ready.device` = where its torch
model runs (cpu, cuda:0; cpu for llama.cpp); an older server leaves it out (it ran on the CPU).
`probs` (sample policy only) = the draft distributions the tokens were drawn from: [n, V] float32, or
the top-N rows as (index, value) when the edge drafts from a top-N truncated distribution; nil for a
draft-free block (prompt lookup and the like), whose tokens the policy takes as point masses.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import msgpack
import torch
from safetensors.torch import load as load_tensors
from safetensors.torch import save as save_tensors

from specdec.errors import ConfigError

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
    "verify_failed": "this session's verdict failed (its settings or policy); other sessions go on",
    "shutdown": "the server is stopping",
    "refused": "the session's own failure, not one of the above",
    "internal": "a bug in the server: logged there; this session ends, the server goes on",
}
MAX_DRAFT_TOKENS = 64  # per verify; k beyond this is refused by the server

# Settings an `open` carries, with their types: the server validates each before using it.
OPEN_FIELDS = {
    "prompt_ids": list, "max_new_tokens": int, "temperature": float, "seed": int, "policy": str,
    "accept_threshold": float, "verifier": str, "constraints": str, "eos_ids": list, "vocab": int,
}


class ProtocolError(Exception):
    """A message that breaks the protocol; the server answers `error` and closes the connection."""

    def __init__(self, message: str, code: str = "bad_message") -> None:
        super().__init__(message)
        self.code = code


def encode(kind: str, **fields: Any) -> bytes:
    return msgpack.packb({"type": kind, **fields}, use_bin_type=True)


def decode(data: bytes | str, expect: tuple[str, ...] | None = None) -> dict:
    if isinstance(data, str):
        raise ProtocolError("text frame received: the protocol sends binary msgpack frames")
    try:
        message = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except (ValueError, msgpack.UnpackException, TypeError) as e:
        raise ProtocolError(f"undecodable message ({type(e).__name__})") from None
    if not isinstance(message, dict) or not isinstance(message.get("type"), str):
        raise ProtocolError("a message must be a map with a string `type`")
    if expect and message["type"] not in expect:
        raise ProtocolError(f"expected {' or '.join(expect)}, got {message['type']!r}")
    return message


def field(message: dict, name: str, kind: type | tuple[type, ...]) -> Any:
    """message[name], type-checked (an int is accepted where a float is expected)."""
    value = message.get(name)
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if float in kinds and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kinds) or isinstance(value, bool) and bool not in kinds:
        raise ProtocolError(f"field {name!r} must be {' or '.join(k.__name__ for k in kinds)}, got {type(value).__name__}")
    return value


def token_ids(message: dict, name: str, vocab: int, max_len: int | None = None) -> list[int]:
    ids = field(message, name, list)
    if max_len is not None and len(ids) > max_len:
        raise ProtocolError(f"field {name!r} has {len(ids)} tokens, more than {max_len}")
    if not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab for t in ids):
        raise ProtocolError(f"field {name!r} must hold token ids in [0, {vocab})")
    return ids


def pack_tensors(tensors: dict[str, torch.Tensor]) -> bytes:
    return save_tensors({name: t.contiguous() for name, t in tensors.items()})


def unpack_tensors(data: Any, what: str) -> dict[str, torch.Tensor]:
    if not isinstance(data, bytes):
        raise ProtocolError(f"{what} must be bytes (safetensors)")
    try:
        return load_tensors(data)
    except Exception as e:  # safetensors raises its own error types on malformed input
        raise ProtocolError(f"{what}: malformed tensors ({type(e).__name__})") from None


def pack_probs(draft_probs: torch.Tensor, topn: int | None) -> bytes:
    """[n, V] draft distributions. With top-N drafting each row has at most N non-zeros: send those."""
    if topn:
        values, index = draft_probs.topk(topn, dim=-1)
        return pack_tensors({"index": index.to(torch.int32), "value": values.float()})
    return pack_tensors({"probs": draft_probs.float()})


def unpack_probs(data: Any, n: int, vocab: int) -> torch.Tensor:
    tensors = unpack_tensors(data, "probs")
    if "probs" in tensors:
        probs = tensors["probs"]
        if probs.dtype != torch.float32 or probs.shape != (n, vocab):
            raise ProtocolError(f"probs must be float32 [{n}, {vocab}], got {probs.dtype} {list(probs.shape)}")
        return checked_distributions(probs)
    index, value = tensors.get("index"), tensors.get("value")
    if index is None or value is None or index.shape != value.shape or index.ndim != 2 or index.shape[0] != n:
        raise ProtocolError(f"top-N probs must be `index` and `value` of one shape [{n}, N]")
    if index.dtype != torch.int32 or value.dtype != torch.float32 or bool((index < 0).any() | (index >= vocab).any()):
        raise ProtocolError(f"top-N probs: int32 indices in [0, {vocab}) and float32 values expected")
    return checked_distributions(torch.zeros(n, vocab).scatter_(-1, index.long(), value))


def checked_distributions(probs: torch.Tensor) -> torch.Tensor:
    """[n, V] rows that are distributions: finite, >= 0, each summing to a positive total (the
    policy divides by them and draws from them)."""
    if not bool(torch.isfinite(probs).all()) or bool((probs < 0).any()) or bool((probs.sum(-1) <= 0).any()):
        raise ProtocolError("probs must be finite, non-negative rows with a positive sum")
    return probs


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
        raise ConfigError(f"cannot read token file {path}: {e.strerror}; give a readable file holding the shared secret") from None
    if not token:
        raise ConfigError(f"token file {path} is empty: put a shared secret in it")
    return token


def token_file_warning(path: str | Path) -> str | None:
    """A line to print when other users of this machine can read the secret (mode o+r)."""
    if Path(path).stat().st_mode & 0o004:
        return f"warning: token file {path} is readable by every user of this machine: chmod 600 {path}"
    return None
