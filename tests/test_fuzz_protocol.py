"""Generated protocol messages (tests/protocol_strategies.py) against `serve` on the tiny pair while
an honest client generates beside them, and generated `ready`s and verdicts against the edge client.

Properties: the server logs no traceback, answers every message with its reply or a one-line `error`
whose code `ERROR_CODES` lists (never `internal`, never an exception's text), and the honest client's
tokens equal its run alone; the client fails with its documented one-line error (CloudUnreachable,
CloudLost), never another exception or a hang. The quick run (fixed seed, a few hundred messages) is
in the default suite; `pytest -m fuzz tests/test_fuzz_protocol.py -s` runs the long one
(FUZZ_MESSAGES, FUZZ_REPLIES, FUZZ_SEED; it prints its counts and seed). Results: docs/fuzzing.md."""
from __future__ import annotations

import asyncio
import logging
import os
import random
import re
import threading

import msgpack
import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st
from websockets.asyncio.server import serve
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from specdec.backends.prompt import Prompt
from specdec.core.config import DecodeConfig
from specdec.core.decode import speculative_decode
from specdec.core.verdict import CloudLost
from specdec.models.loading import load_model
from specdec.remote.background import BackgroundServer
from specdec.remote.client import CloudUnreachable, RemoteCloud
from specdec.remote.protocol import ERROR_CODES
from specdec.remote.server_config import ServeConfig
from tests.protocol_strategies import READY, VERDICT, conversation, reply
from tests.test_remote_attacks import GREEDY
from tests.test_remote_faults import IDS
from tests.wire import decode

pytestmark = pytest.mark.server  # see CONTRIBUTING.md: the quick loop leaves these out

QUICK_SEED = 34
REPLIES = {"hello": "ready", "verify": "verdict", "generate": "generated", "stats": "stats"}
EXCEPTION_TEXT = re.compile(r"Traceback|\b[A-Z]\w*(Error|Exception):")  # "AssertionError: cache length ..."
CONFIG = ServeConfig(max_message_mb=1, max_sessions=64, idle_timeout_s=30)


@pytest.fixture(scope="module")
def models(pair):
    return {role: load_model(path, "float32") for role, path in pair.items()}


class Tally:
    def __init__(self) -> None:
        self.sent = self.replies = self.errors = self.connections = 0
        self.codes: dict[str, int] = {}
        self.kinds: dict[str, int] = {}  # replies by type
        self.reasons: dict[str, int] = {}  # error messages, digits dropped


def check_error(error: dict) -> None:
    code, text = error.get("code"), error.get("message")
    assert code in ERROR_CODES and code != "internal", error
    assert isinstance(text, str) and "\n" not in text and not EXCEPTION_TEXT.search(text), error


def converse(url: str, frames: list, track: bool, tally: Tally) -> None:
    """Send one connection's frames, reading each reply as it is due; then a `stats` probe, which a
    live connection answers. A refusal (`error`, then the server closes) ends the conversation."""
    ws = connect(f"ws://{url}/", compression=None, max_size=None, close_timeout=1)
    tally.connections += 1
    length = pending = None  # the session's accepted length and the last verdict's token, as tracked
    oversized = False
    try:
        for i, frame in enumerate([*frames, {"type": "stats", "since": 1 << 62}]):
            if isinstance(frame, dict) and frame.get("type") == "verify" and track and length is not None:
                new = [] if pending is None else [pending]
                frame = {**frame, "new": new, "base": length + len(new)}
            if isinstance(frame, dict) and frame.get("type") == "open" and isinstance(frame.get("prompt_ids"), list):
                length, pending = len(frame["prompt_ids"]), None
            data = msgpack.packb(frame, use_bin_type=True) if isinstance(frame, dict) else frame
            oversized |= isinstance(data, bytes) and len(data) > CONFIG.max_message_mb * (1 << 20)
            try:
                ws.send(data)
            except ConnectionClosed:
                break
            tally.sent += 1
            kind = frame.get("type") if isinstance(frame, dict) else None
            due = "ready" if i == 0 and kind == "hello" else REPLIES.get(kind) if i else "error"
            if i and kind == "hello":
                due = None  # a second hello is refused: its error is read with the next reply due
            if due is None:
                continue
            answer = decode(ws.recv(timeout=120))
            tally.replies += 1
            tally.kinds[answer["type"]] = tally.kinds.get(answer["type"], 0) + 1
            if answer["type"] == "error":
                tally.errors += 1
                tally.codes[answer.get("code")] = tally.codes.get(answer.get("code"), 0) + 1
                check_error(answer)
                reason = re.sub(r"-?\d[\d.e+-]*", "N", answer["message"])[:70]
                tally.reasons[reason] = tally.reasons.get(reason, 0) + 1
                with pytest.raises(ConnectionClosed):  # then the server closes: nothing else comes
                    ws.recv(timeout=30)
                return
            assert answer["type"] == due, (frame, answer)
            if answer["type"] == "verdict":
                length, pending = frame["base"] + answer["accepted"], answer["token"]
            elif answer["type"] == "generated" and length is not None:
                length, pending = None, None  # its mirror is the prompt + tokens: no verify can follow in step
        else:
            return
        answer = decode(ws.recv(timeout=30))  # a send failed: the server closed after an error, which is here
        tally.replies, tally.errors = tally.replies + 1, tally.errors + 1
        check_error(answer)
    except ConnectionClosed as e:  # closed without an error: only a frame past --max-message-mb does that
        assert oversized and e.rcvd is not None and e.rcvd.code == 1009, (frames, e)
    finally:
        ws.close()


class Honest(threading.Thread):
    """Generates the same prompt over and over on the server; every run's tokens must equal `expected`."""

    def __init__(self, models, url: str, expected: list[int]) -> None:
        super().__init__(daemon=True)
        self.models, self.url, self.expected = models, url, expected
        self.stop, self.runs, self.changed, self.failed = threading.Event(), 0, [], []

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                tokens = honest_tokens(self.models, self.url)
            except Exception as e:  # recorded, asserted on by the test
                self.failed.append(repr(e))
                return
            self.runs += 1
            if tokens != self.expected:
                self.changed.append(tokens)


def honest_tokens(models, url: str) -> list[int]:
    remote = RemoteCloud(url, timeout_s=120)
    remote.connect()
    try:
        return speculative_decode(models["edge"].backend, remote, Prompt(IDS), GREEDY, DecodeConfig(max_new_tokens=12)).tokens
    finally:
        remote.close()


def fuzz_server(models, caplog, messages: int, first_seed: int) -> Tally:
    tally = Tally()
    caplog.set_level(logging.WARNING)
    with BackgroundServer(models["cloud"], CONFIG) as url:
        honest = Honest(models, url, honest_tokens(models, url))
        honest.start()
        chunk = 0
        while tally.sent < messages:
            @settings(max_examples=100, database=None, deadline=None, suppress_health_check=list(HealthCheck))
            @seed(first_seed + chunk)
            @given(conversation())
            def one(generated) -> None:
                frames, track = generated
                logged = len(caplog.records)
                converse(url, frames, track, tally)
                tracebacks = [r for r in caplog.records[logged:] if r.exc_info]  # checked here, so Hypothesis shrinks it
                assert not tracebacks, tracebacks[0].getMessage()
            one()
            chunk += 1
        honest.stop.set()
        honest.join(300)
    assert not honest.failed and not honest.changed and honest.runs >= 1, (honest.failed, honest.changed[:3])
    tracebacks = [r for r in caplog.records if r.exc_info or "Traceback" in r.getMessage()]
    assert not tracebacks, tracebacks[0].getMessage()
    tally.honest_runs = honest.runs
    if os.environ.get("FUZZ_REASONS"):
        print("\n".join(f"{n:6d} {r}" for r, n in sorted(tally.reasons.items(), key=lambda x: -x[1])))
    return tally


# -- the edge client against a fuzzing server -------------------------------------------------------
class FuzzingServer:
    """Answers `hello` with `self.ready` and every verify with `self.verdict`, counting what it sent."""

    def __init__(self) -> None:
        self.ready, self.verdict, self.sent, self.listening = b"", b"", 0, threading.Event()

    async def handle(self, ws) -> None:
        try:
            await ws.recv()
            await ws.send(self.ready)
            self.sent += 1
            async for raw in ws:
                if decode(raw)["type"] == "verify":
                    await ws.send(self.verdict)
                    self.sent += 1
        except ConnectionClosed:
            pass

    async def main(self) -> None:
        self.loop, self.stop = asyncio.get_running_loop(), asyncio.Event()
        async with serve(self.handle, "127.0.0.1", 0, compression=None, max_size=None) as server:
            self.url = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
            self.listening.set()
            await self.stop.wait()

    def __enter__(self) -> FuzzingServer:
        self.thread = threading.Thread(target=lambda: asyncio.run(self.main()), daemon=True)
        self.thread.start()
        assert self.listening.wait(30)
        return self

    def __exit__(self, *exc) -> None:
        self.loop.call_soon_threadsafe(self.stop.set)
        self.thread.join(30)


def edge_against(fake: FuzzingServer, models, ready: bytes, verdict: bytes) -> str:
    """One generation against the fuzzing server: "ok", or the kind of its one-line error."""
    fake.ready, fake.verdict = ready, verdict
    remote = RemoteCloud(fake.url, timeout_s=5, connect_timeout_s=5)
    try:
        remote.connect()
        speculative_decode(models["edge"].backend, remote, Prompt(IDS), GREEDY, DecodeConfig(max_new_tokens=6))
        return "ok"
    except (CloudUnreachable, CloudLost) as e:
        assert "\n" not in str(e) and not EXCEPTION_TEXT.search(str(e)), str(e)
        return type(e).__name__
    finally:
        remote.close()


# Half the client's handshakes get an honest ready, so its fuzzed verdicts are reached however many fields a ready
# has (each field of a fuzzed one is changed with probability 1/2: a ready that grew a field passed less often, and
# the quick run's verdicts were reached 3 times in 200).
HONEST_READY = msgpack.packb(READY, use_bin_type=True)


def fuzz_client(models, replies: int, first_seed: int) -> dict[str, int]:
    outcomes: dict[str, int] = {}
    with FuzzingServer() as fake:
        chunk = 0
        while fake.sent < replies:
            @settings(max_examples=100, database=None, deadline=None, suppress_health_check=list(HealthCheck))
            @seed(first_seed + chunk)
            @given(st.just(HONEST_READY) | reply(READY), reply(VERDICT))
            def one(ready, verdict) -> None:
                outcome = edge_against(fake, models, ready, verdict)
                outcomes[outcome] = outcomes.get(outcome, 0) + 1
            one()
            chunk += 1
        outcomes["replies"] = fake.sent
    return outcomes


def test_fuzzed_messages_are_answered_in_one_line_and_the_honest_client_keeps_its_tokens(models, caplog):
    tally = fuzz_server(models, caplog, messages=300, first_seed=QUICK_SEED)
    assert tally.errors and tally.replies > tally.errors  # both refusals and real answers were exercised
    assert {"bad_message", "no_session"} <= set(tally.codes), tally.codes


def test_the_edge_client_fails_in_one_line_on_fuzzed_replies(models):
    outcomes = fuzz_client(models, replies=200, first_seed=QUICK_SEED)
    assert outcomes.get("CloudUnreachable") and outcomes.get("CloudLost"), outcomes


@pytest.mark.fuzz
def test_long_fuzz(models, caplog):
    """The long run: `FUZZ_MESSAGES=20000 FUZZ_REPLIES=5000 pytest -m fuzz tests/test_fuzz_protocol.py -s`."""
    messages, replies = int(os.environ.get("FUZZ_MESSAGES", 20_000)), int(os.environ.get("FUZZ_REPLIES", 5_000))
    first_seed = int(os.environ.get("FUZZ_SEED", random.randrange(1 << 32)))
    tally = fuzz_server(models, caplog, messages, first_seed)
    outcomes = fuzz_client(models, replies, first_seed)
    print(f"\nfuzz seed {first_seed}: server {tally.sent} messages over {tally.connections} connections, "
          f"{tally.replies} replies {dict(sorted(tally.kinds.items()))} (errors {dict(sorted(tally.codes.items()))}), "
          f"0 tracebacks, honest client {tally.honest_runs} runs unchanged; "
          f"client {outcomes.pop('replies')} replies, outcomes {outcomes}")
