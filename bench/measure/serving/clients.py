"""The fleet's asyncio clients of a verifier server (protocol: specdec/remote/protocol.py):

- `replay`: a replayed edge. Re-sends the blocks an earlier split run verified, each after the edge
  time it took then (the gap between a verdict's arrival and the next block leaving), and checks
  every verdict against the recorded one. With a deterministic policy a mismatch is the server's
  doing: in fp32 a bug; in bf16 a batched forward may also round a near-tie the other way. The
  replay then re-opens the session at the recorded prefix and goes on, and counts the mismatch.
  Following (`--follow-verdicts`), each verify asks the server to keep the recorded verdict: a
  random-weight architecture of the real size then serves the recorded acceptance, its own verdicts
  (noise) counted as mismatches, and the session never re-opens (no prefill per verify).
- `cloud_only`: cloud-only serving of the same prompt: the server generates as many tokens as the
  recorded generation has (its stop point), every token a batched server step.
- `server_log`: the server's batch log (rows, tokens and seconds of every forward).
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import msgspec
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake

from bench.core.point import Deployment
from specdec.core.verdict import CloudLost
from specdec.errors import InputError
from specdec.remote.protocol import (
    REPLIES,
    REQUESTS,
    SCHEMA,
    Followed,
    Open,
    ProtocolError,
    Refusal,
    UnexpectedMessage,
    decode,
    encode,
)
from specdec.settings import Mode

SENT = {cls.kind(): cls for cls in REQUESTS}  # a request's type by its tag
RECEIVED = {cls.kind(): cls for cls in REPLIES}


@dataclass(frozen=True)
class Step:
    """One recorded verify: sent `gap_s` after the previous verdict (after the start, for the first)."""

    gap_s: float
    base: int  # the edge's accepted length when it sent the block
    draft: list[int]
    accepted: int  # the recorded verdict
    token: int | None  # None: the budget ended with this block, the edge took no bonus


@dataclass
class Script:
    """A recorded split generation, as a replay needs it."""

    id: str
    prompt_ids: list[int]
    tokens: list[int]  # the generation's new tokens
    settings: dict  # the `open` fields of the edge's decoding settings (protocol.Open.SETTINGS)
    steps: list[Step] = field(default_factory=list)
    tail_s: float = 0.0  # edge time after the last verdict, to the end of the generation

    @property
    def new_tokens(self) -> int:
        return len(self.tokens)


def script_of(record: dict) -> Script:
    """The replay script of a split record; an InputError names what is missing."""
    where = f"record {record.get('id')!r}"
    if record.get("deployment") != Deployment.SPLIT or record.get("mode") != Mode.SPEC or record.get("status") != "ok":
        raise InputError(f"{where} is not a finished split spec generation: record one with `specbench run --mode spec "
                         "--cloud-url ...`")
    if not record.get("prompt_ids") or "trace" not in record:
        raise InputError(f"{where} has no prompt_ids or trace: it was recorded by an older specbench; record it again")
    prompt, tokens = record["prompt_ids"], record["tokens"]
    script = Script(record["id"], prompt, tokens, {name: record[name] for name in Open.SETTINGS})
    done, last_reply = 0, 0.0  # tokens accepted before the current cycle; clock of the last verdict
    for cycle in record["trace"]:
        if cycle["escalated"]:
            script.steps.append(Step(max(cycle["t_sent_s"] - last_reply, 0.0), len(prompt) + done, cycle["draft_tokens"],
                                     cycle["accepted"], cycle["extra_token"]))
            last_reply = cycle["t_reply_s"]
        done += cycle["accepted"] + (cycle["extra_token"] is not None)
        extra = [cycle["extra_token"]] if cycle["extra_token"] is not None else []
        rebuilt = cycle["draft_tokens"][: cycle["accepted"]] + extra
        if tokens[done - len(rebuilt): done] != rebuilt:
            raise InputError(f"{where}: its trace does not rebuild its tokens; the record is damaged")
    if done != len(tokens) or not script.steps:
        raise InputError(f"{where}: its trace does not rebuild its tokens (or never reached the cloud)")
    decode_s = record["new_tokens"] / record["tokens_per_s"] if record.get("tokens_per_s") else last_reply
    script.tail_s = max(decode_s - last_reply, 0.0)
    return script


class Connection:
    """One WebSocket to the server, handshaken."""

    def __init__(self, url: str, token: str | None, timeout_s: float) -> None:
        self.url, self.token, self.timeout_s = url, token, timeout_s

    async def __aenter__(self) -> Connection:
        try:
            self.ws = await asyncio.wait_for(connect(f"ws://{self.url}/", compression=None, max_size=None), self.timeout_s)
        except (TimeoutError, OSError, InvalidHandshake) as e:
            raise CloudLost(f"cannot reach the verifier server at {self.url}: {e}") from None
        await self.send("hello", schema=SCHEMA, token=self.token)
        self.ready = await self.receive("ready")  # model, vocab_size, tokenizer fingerprint
        return self

    async def __aexit__(self, *exc) -> None:
        await self.ws.close()

    async def send(self, kind: str, **fields) -> None:
        """Send the request of type `kind` (its fields as the protocol's schema names them)."""
        try:
            await self.ws.send(encode(SENT[kind](**fields)))
        except ConnectionClosed as e:
            raise CloudLost(f"the verifier server at {self.url} closed the connection: {e}") from None

    async def receive(self, kind: str) -> dict:
        """The reply of type `kind`, checked by the protocol's schema, as a map of its fields."""
        try:
            reply = decode(await asyncio.wait_for(self.ws.recv(), self.timeout_s), RECEIVED[kind], Refusal)
        except TimeoutError:
            raise CloudLost(f"no reply from the verifier server at {self.url} within {self.timeout_s:g} s") from None
        except ConnectionClosed as e:
            raise CloudLost(f"the verifier server at {self.url} closed the connection: {e}") from None
        except UnexpectedMessage as e:
            raise CloudLost(f"the verifier server at {self.url} sent {e.kind!r} where {kind!r} was due") from None
        except ProtocolError as e:
            raise CloudLost(f"the verifier server at {self.url} broke the protocol: {e}") from None
        if isinstance(reply, Refusal):
            raise CloudLost(f"the verifier server at {self.url} refused: {reply.message}")
        return msgspec.structs.asdict(reply)


def open_fields(script: Script, prefix: int, vocab: int) -> dict:
    """`open` fields for a session holding the prompt and the first `prefix` generated tokens."""
    settings = {**script.settings, "max_new_tokens": script.settings["max_new_tokens"] - prefix}
    return dict(prompt_ids=script.prompt_ids + script.tokens[:prefix], features=None, eos_ids=[], vocab=vocab, **settings)


async def replay(url: str, script: Script, vocab: int, token: str | None = None, timeout_s: float = 60.0,
                 follow: bool = False) -> dict:
    """Replay one generation; returns its measured fields (latency, per-verify waits, mismatches). `follow`: each
    verify asks the server to keep the recorded verdict (`verify.follow`), so a mismatch (the server's own verdict
    differed, `verdict.agreed`) is counted and the replay goes on in the same session."""
    waits, queues, computes, batches = [], [], [], []
    mismatches, positions, accepted_total = 0, 0, 0
    start = time.perf_counter()
    async with Connection(url, token, timeout_s) as server:
        prompt_len, server_length, reopen = len(script.prompt_ids), None, False
        for step in script.steps:
            await asyncio.sleep(step.gap_s)  # the edge drafting (as long as it took when recorded)
            if server_length is None or reopen:  # first block or a mismatch: a session holding the recorded prefix
                if server_length is not None:
                    await server.send("close")
                await server.send("open", **open_fields(script, step.base - prompt_len, vocab))
                server_length, reopen = step.base, False
            new = script.tokens[server_length - prompt_len: step.base - prompt_len]
            sent = time.perf_counter()
            kept = Followed(accepted=step.accepted, token=step.token) if follow else None
            await server.send("verify", base=step.base, new=new, draft=step.draft, probs=None, follow=kept)
            verdict = await server.receive("verdict")
            waits.append(time.perf_counter() - sent)
            queues.append(verdict["queue_s"])
            computes.append(verdict["compute_s"])
            batches.append(verdict["batch"])
            positions += len(step.draft) + 1
            accepted_total += verdict["accepted"]
            if follow:
                mismatches += verdict["agreed"] is False
            elif verdict["accepted"] != step.accepted or step.token is not None and verdict["token"] != step.token:
                mismatches += 1
                reopen = True
            server_length = step.base + verdict["accepted"]
        await server.send("close")
    await asyncio.sleep(script.tail_s)
    return {"latency_s": time.perf_counter() - start, "new_tokens": script.new_tokens,
            "prompt_tokens": len(script.prompt_ids), "verifies": len(waits),
            "positions": positions, "accepted_draft_tokens": accepted_total,
            "draft_tokens": sum(len(s.draft) for s in script.steps), "replay_mismatches": mismatches, "followed": follow,
            "verify_wait_s": waits, "server_queue_s": queues, "server_compute_s": computes, "batch": batches}


async def cloud_only(url: str, script: Script, vocab: int, token: str | None = None, timeout_s: float = 600.0) -> dict:
    """The server generates the recorded generation's length of tokens for its prompt."""
    start = time.perf_counter()
    async with Connection(url, token, timeout_s) as server:
        opening = open_fields(script, 0, vocab)
        opening["max_new_tokens"] = script.new_tokens
        await server.send("open", **opening)
        await server.send("generate")
        reply = await server.receive("generated")
        await server.send("close")
    steps = [q + c for q, c in zip(reply["queue_s"], reply["compute_s"])]
    return {"latency_s": time.perf_counter() - start, "new_tokens": len(reply["tokens"]),
            "prompt_tokens": len(script.prompt_ids), "verifies": len(steps),
            "positions": len(steps), "tokens_match": reply["tokens"] == script.tokens,
            "verify_wait_s": steps, "server_queue_s": reply["queue_s"], "server_compute_s": reply["compute_s"],
            "batch": reply["batch"]}


async def server_log(url: str, since: int, token: str | None = None, timeout_s: float = 30.0) -> tuple[list[dict], int]:
    """The server's forwards from entry `since` on, and the index to ask from next time."""
    async with Connection(url, token, timeout_s) as server:
        await server.send("stats", since=since)
        reply = await server.receive("stats")
    return reply["batches"], reply["next"]


async def server_info(url: str, token: str | None = None, timeout_s: float = 30.0) -> dict:
    """The server's `ready`: model, vocab_size, tokenizer fingerprint."""
    async with Connection(url, token, timeout_s) as server:
        return server.ready
