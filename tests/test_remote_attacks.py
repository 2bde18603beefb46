"""The split deployment under attack and faults (the cases of the hardening issue): one client's
settings cannot fail another's prompts, SIGTERM with requests in flight ends the server, a lost
cloud while drafting ahead degrades cleanly, non-ASCII tokens, a server that breaks the protocol,
and malformed but well-typed messages (one log line each, never a traceback)."""
from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
import types

import psutil
import pytest
from websockets.asyncio.server import serve
from websockets.exceptions import ConnectionClosed

from bench.cli import main
from specdec.backends.prompt import Prompt
from specdec.core.cloud import LocalCloud
from specdec.core.config import DecodeConfig, SpecConfig
from specdec.core.decode import SpecOptions, autoregressive_decode, speculative_decode
from specdec.core.verdict import CloudLost
from specdec.errors import ConfigError
from specdec.models.loading import load_model
from specdec.remote.background import BackgroundServer
from specdec.remote.client import CloudUnreachable, RemoteCloud
from specdec.remote.protocol import SCHEMA, read_token, token_file_warning
from specdec.remote.server_config import ServeConfig
from tests.test_remote_faults import IDS, opening, raw_client, refused, start_cli_server, still_serves, wait_for
from tests.wire import decode, encode

pytestmark = pytest.mark.server  # see CONTRIBUTING.md: the quick loop leaves these out

GREEDY = SpecConfig(k=3, entropy_threshold=0, policy="greedy")


@pytest.fixture(scope="module")
def models(pair):
    return {role: load_model(path, "float32") for role, path in pair.items()}


# -- 1. one client's settings cannot fail the others' prompts -------------------------------------------
def test_a_temperature_without_a_finite_distribution_is_refused_everywhere(models, pair, tmp_path, capsys):
    with pytest.raises(ConfigError, match="temperature 1e-40 is below 0.01"):
        DecodeConfig(temperature=1e-40)
    assert DecodeConfig(temperature=0.01).do_sample
    assert main(["run", "--mode", "edge", "--edge", pair["edge"], "--prompts", "code", "--out", str(tmp_path / "o"),
                 "--temperature", "1e-40"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: temperature 1e-40 is below 0.01")
    with BackgroundServer(models["cloud"]) as url:
        ws = raw_client(url)
        ws.send(opening(policy="sample", temperature=1e-40))
        error, _ = refused(ws)
        assert "temperature 1e-40 is below 0.01" in error["message"]


def test_a_poisoned_row_fails_alone_and_the_honest_rows_of_its_batch_get_the_clouds_verdict(models):
    """Three sessions in one batched forward (a 1 s window: the three verifies are sent back to back);
    one session's distribution is made non-finite behind validation's back, as a temperature of 1e-40
    once made it. Only that session gets an error, with its own reason."""
    background = BackgroundServer(models["cloud"], ServeConfig(batch_window_ms=1000))
    draft = [7, 1, 30]
    with background as url:
        alone = raw_client(url)  # what an honest session gets when it is served by itself
        alone.send(opening())
        alone.send(encode("verify", base=6, new=[], draft=draft))
        expected = decode(alone.recv(timeout=30))
        alone.send(encode("close"))
        poisoned = raw_client(url)
        poisoned.send(opening(policy="threshold"))  # a policy that reads the distribution (greedy reads logits)
        wait_for(lambda: len(background.server.sessions) == 1, "the poisoned session opened")
        session = next(iter(background.server.sessions.values()))
        session.cloud.decode = types.SimpleNamespace(temperature=1e-40, do_sample=False)
        honest = [raw_client(url) for _ in range(2)]
        for ws in honest:
            ws.send(opening())
        for ws in [poisoned, *honest]:
            ws.send(encode("verify", base=6, new=[], draft=draft))
        error, _ = refused(poisoned)
        assert error["code"] == "verify_failed" and "not finite at temperature 1e-40" in error["message"]
        for ws in honest:
            verdict = decode(ws.recv(timeout=30))
            assert verdict["type"] == "verdict" and verdict["batch"] == 3
            assert (verdict["accepted"], verdict["token"]) == (expected["accepted"], expected["token"])
        still_serves(models, url)


# -- 2. SIGTERM with requests in flight ----------------------------------------------------------------
def test_sigterm_with_requests_in_flight_answers_them_and_exits(pair):
    """Three cloud-only generations that take minutes (a 1 s batch window per step of 400: a fourth
    connection that sends nothing keeps each window open its whole second) are in flight when SIGTERM
    comes: each gets an error verdict naming the shutdown, the process exits 0."""
    process, url = start_cli_server(pair, "--batch-window-ms", "1000", "--max-batch", "8")
    idle = raw_client(url)  # noqa: F841 (held open)
    clients = [raw_client(url) for _ in range(3)]
    for ws in clients:
        ws.send(opening(max_new_tokens=400))
        ws.send(encode("generate"))
    threading.Event().wait(0.5)  # let the server read them; they then run for minutes
    process.terminate()
    for ws in clients:
        error, _ = refused(ws)
        assert error["code"] == "shutdown" and "shutting down" in error["message"]
    assert process.wait(30) == 0  # the bound checked generously; the documented one is 2 s + one forward
    assert process.stderr.read().strip().splitlines()[-1].startswith("stopped: ")


# -- 3. the cloud lost while the edge drafts ahead -------------------------------------------------------
class LosesTheCloud:
    """A cloud that answers with a LocalCloudSession (on the edge's own model, so every verified token is
    the edge's greedy token) and is lost at its `lose_at`-th verify, while the edge drafts ahead
    (its round trip looks long, and the reply is never ready before `receive`)."""

    def __init__(self, backend, lose_at: int) -> None:
        self.local, self.lose_at, self.calls = LocalCloud(backend), lose_at, 0
        self.vocab_size, self.accepts_audio = backend.vocab_size, False

    def open(self, *args):
        outer, inner = self, self.local.open(*args)

        class Verifier:
            round_trip_s = 30.0
            compute_s = 0.0

            def send(self, seq, draft_tokens, draft_probs, tree=None):
                outer.calls += 1
                self.block = (seq, draft_tokens, draft_probs)

            def ready(self):
                return False

            def receive(self):
                if outer.calls == outer.lose_at:
                    raise CloudLost("the cloud verifier is gone")
                return inner.verify(*self.block)

            def verify(self, *block):
                self.send(*block)
                return self.receive()

            def rollback(self, length, seq):
                inner.rollback(length, seq)

            def close(self):
                pass

        return Verifier()


def test_cloud_loss_while_drafting_ahead_finishes_edge_only(models):
    edge = models["edge"].backend
    cloud = LosesTheCloud(edge, lose_at=3)
    generation = speculative_decode(edge, cloud, Prompt(IDS), GREEDY, DecodeConfig(max_new_tokens=24),
                                    SpecOptions(on_cloud_loss="edge", overlap=True))
    lost = next(c for c in generation.cycles if not c.escalated)
    assert lost.ahead_guess is not None  # the edge had drafted ahead when the cloud went
    assert generation.degraded and cloud.calls == 3
    assert generation.tokens == autoregressive_decode(edge, Prompt(IDS), DecodeConfig(max_new_tokens=24)).tokens


# -- 4. tokens as bytes, and a server that breaks the protocol ------------------------------------------
def test_a_non_ascii_token_works_both_ways(models):
    with BackgroundServer(models["cloud"], ServeConfig(token="pässwörd✓")) as url:
        remote = RemoteCloud(url, token="pässwörd✓")
        assert remote.connect()["vocab_size"] == 64
        remote.close()
        for wrong in ("pässwörd", "password", None):
            with pytest.raises(CloudUnreachable, match="bad or missing token"):
                RemoteCloud(url, token=wrong).connect()
    with BackgroundServer(models["cloud"], ServeConfig(token="ascii-secret")) as url:
        with pytest.raises(CloudUnreachable, match="bad or missing token"):
            RemoteCloud(url, token="äscii-secret").connect()
        remote = RemoteCloud(url, token="ascii-secret")
        assert remote.connect()["vocab_size"] == 64
        remote.close()


READY = dict(type="ready", schema=SCHEMA, model="fake", vocab_size=64, tokenizer_sha256="", accepts_audio=False)
VERDICT = dict(type="verdict", accepted=1, token=5, tokens_in=9, compute_s=0.01, queue_s=0.0, batch=1)


def packed(message: dict) -> bytes:
    return encode(message["type"], **{k: v for k, v in message.items() if k != "type"})


class FakeServer:
    """A server that answers `hello` with `ready` and every verify with `verdict` (bytes, as given)."""

    def __init__(self, ready: bytes, verdict: bytes = b"") -> None:
        self.ready, self.verdict, self.listening, self.holder = ready, verdict, threading.Event(), {}

    async def handle(self, ws) -> None:
        await ws.recv()
        await ws.send(self.ready)
        async for raw in ws:
            if decode(raw)["type"] == "verify":
                await ws.send(self.verdict)

    async def main(self) -> None:
        self.holder["loop"], self.holder["stop"] = asyncio.get_running_loop(), asyncio.Event()
        async with serve(self.handle, "127.0.0.1", 0, compression=None, max_size=None) as server:
            self.holder["port"] = server.sockets[0].getsockname()[1]
            self.listening.set()
            await self.holder["stop"].wait()

    def __enter__(self) -> str:
        self.thread = threading.Thread(target=lambda: asyncio.run(self.main()), daemon=True)
        self.thread.start()
        assert self.listening.wait(30)
        return f"127.0.0.1:{self.holder['port']}"

    def __exit__(self, *exc) -> None:
        self.holder["loop"].call_soon_threadsafe(self.holder["stop"].set)
        self.thread.join(30)


@pytest.mark.parametrize("ready,reason", [
    (b"\xc1", "broke the protocol: undecodable message"),
    (packed({**READY, "vocab_size": "64"}), "ready.vocab_size must be int"),
    (packed({k: v for k, v in READY.items() if k != "accepts_audio"}), "ready.accepts_audio must be bool"),
    (packed({**READY, "vocab_size": 0}), r"ready.vocab_size = 0 is outside"),
])
def test_a_malformed_ready_is_one_line(ready, reason):
    with FakeServer(ready) as url:
        with pytest.raises(CloudUnreachable, match=reason):
            RemoteCloud(url).connect()


def test_a_server_of_another_schema_is_refused_in_one_line():
    """A server that answers our hello with a `ready` of another schema (it did not refuse us itself):
    the edge stops at the handshake, before any prompt, naming both schemas."""
    with FakeServer(packed({**READY, "schema": SCHEMA + 1})) as url:
        with pytest.raises(CloudUnreachable, match=f"speaks schema {SCHEMA + 1}, this edge {SCHEMA}") as refused:
            RemoteCloud(url).connect()
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("verdict,reason", [
    (packed({**VERDICT, "accepted": 10**6}), r"verdict.accepted = 1000000 is outside \[0, 3\]"),
    (packed({**VERDICT, "accepted": -3}), r"verdict.accepted = -3 is outside"),
    (packed({"type": "verdict"}), "verdict.accepted must be int, got NoneType"),
    (packed({**VERDICT, "token": 64}), r"verdict.token = 64 is outside \[0, 63\]"),
    (packed({**VERDICT, "compute_s": float("nan")}), "verdict.compute_s = nan is outside"),
    (packed({**VERDICT, "accepted": True}), "verdict.accepted must be int, got bool"),
    (b"\xc1not msgpack", "broke the protocol: undecodable message"),
    (packed({"type": "ready"}), "sent 'ready' where 'verdict' was due"),
    (b"\x00" * (17 << 20), "closed the connection"),  # past the client's 16 MiB cap
])
def test_a_non_conforming_verdict_fails_that_prompt_as_a_lost_cloud(models, verdict, reason):
    with FakeServer(packed(READY), verdict) as url:
        remote = RemoteCloud(url, timeout_s=30)
        remote.connect()
        with pytest.raises(CloudLost, match=reason):
            speculative_decode(models["edge"].backend, remote, Prompt(IDS), GREEDY, DecodeConfig(max_new_tokens=6))
        assert not remote.connected


# -- 5. malformed but well-typed messages: one log line, never a traceback -------------------------------
MALFORMED = {
    "seed 2**64": (opening(seed=2**64 - 1, policy="sample", temperature=1.0), None),  # served: the seed wraps
    "negative seed": (opening(seed=-1), "seed must be in [0, 2**64)"),
    "temperature nan": (opening(temperature=float("nan")), "temperature must be a finite number"),
    "temperature inf": (opening(temperature=float("inf")), "temperature must be a finite number"),
    "temperature 1e-40": (opening(policy="sample", temperature=1e-40), "below 0.01"),
    "accept_threshold nan": (opening(accept_threshold=float("nan")), "accept_threshold is a probability"),
    "max_new_tokens 0": (opening(max_new_tokens=0), "max_new_tokens must be >= 1"),
    "max_new_tokens 2**62": (opening(max_new_tokens=2**62), "need more positions than model"),
    "vocab 2**40": (opening(vocab=2**40), "vocab must be in [1, 64]"),
    "eos id 2**63": (opening(eos_ids=[2**63]), "token ids in [0, 64)"),
    "empty prompt": (opening(prompt_ids=[]), "prompt_ids is empty"),
    "features not tensors": (opening(features=b"\x00" * 64), "features: malformed tensors"),
    "sample without temperature": (opening(policy="sample"), "policy 'sample' needs temperature > 0"),
    "stats since -1": (encode("stats", since=-1), "since must be >= 0"),
}


def test_malformed_but_typed_messages_are_one_log_line_each(models, caplog):
    caplog.set_level(logging.WARNING, logger="specbench.serve")
    with BackgroundServer(models["cloud"]) as url:
        for name, (message, reason) in MALFORMED.items():
            ws = raw_client(url)
            ws.send(message)
            if reason is None:  # a valid open after all: a verify is answered (no probs: a draft-free block)
                ws.send(encode("verify", base=6, new=[], draft=[1], probs=None))
                reply = decode(ws.recv(timeout=30))
                assert reply["type"] == "verdict" and 0 <= reply["accepted"] <= 1, (name, reply)
                continue
            error, _ = refused(ws)
            assert error["type"] == "error" and reason in error["message"], (name, error)
        ws = raw_client(url)  # `since` past every index ever logged (islice raised on 2**63)
        ws.send(encode("stats", since=2**63))
        assert decode(ws.recv(timeout=30))["batches"] == []
        still_serves(models, url)
    assert not [r for r in caplog.records if r.exc_info], "a malformed message logged a traceback"
    refusals = [r for r in caplog.records if r.getMessage().startswith("refused a client")]
    assert len(refusals) == len(MALFORMED) - 1  # one line each, but the seed case, which is served


def test_messages_the_schema_refuses_are_one_line_each_and_the_server_goes_on(models, caplog):
    """Refused while they decode (msgspec's typed decode, then the message's own check): an unknown
    field nested past the decoder's depth, a string that is not UTF-8, a float where an int is due, a
    draft past MAX_DRAFT_TOKENS. Each is one `bad_message` line naming what broke, never a traceback."""
    caplog.set_level(logging.WARNING, logger="specbench.serve")
    deep = b"\x85\xa4type\xa6verify\xa4base\x06\xa3new\x90\xa5draft\x91\x01\xa4junk" + b"\x91" * 100_000 + b"\xc0"
    not_utf8 = opening(policy="@@").replace(b"\xa2@@", b"\xa2\xed\xa0")
    cases = {deep: "undecodable message (nested too deeply)", not_utf8: "undecodable message (a string that is not UTF-8)",
             encode("verify", base=6.0, new=[], draft=[1]): "field 'base' must be int, got float",
             encode("verify", base=6, new=[], draft=[1] * 65): "field 'draft' must be list of length <= 64"}
    with BackgroundServer(models["cloud"]) as url:
        for message, reason in cases.items():
            ws = raw_client(url)
            ws.send(opening())
            ws.send(message)
            error, _ = refused(ws)
            assert (error["code"], error["message"]) == ("bad_message", reason), error
        still_serves(models, url)
    assert not [r for r in caplog.records if r.exc_info], "a message the schema refused logged a traceback"


def test_a_sigkilled_fleet_leaves_no_server_running(pair, models, tmp_path):
    """The fleet's own server gets SIGTERM from the kernel when the fleet dies (PDEATHSIG) and, with
    replayed edges in flight, now exits instead of hanging."""
    settings = ["--dtype", "float32", "--policy", "greedy", "--entropy-threshold", "0", "--k", "3",
                "--max-new-tokens", "12"]
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(f'{{"id": "p{i}", "prompt": "{t}"}}\n' for i, t in enumerate(["hello", "one two"])))
    with BackgroundServer(models["cloud"]) as url:
        assert main(["run", "--mode", "spec", "--edge", pair["edge"], "--cloud-url", url, "--prompts", str(prompts),
                     "--out", str(tmp_path / "rec"), *settings]) == 0
    out = tmp_path / "fleet"
    fleet = subprocess.Popen(
        [sys.executable, "-m", "bench.cli", "fleet", "--edge-replay", str(tmp_path / "rec"), "--cloud", pair["cloud"],
         "--prompts", str(prompts), "--clients", "1,2,4,8", "--no-baseline", "--out", str(out), *settings],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    servers: list[psutil.Process] = []

    def serving() -> bool:
        found = []
        for child in psutil.Process(fleet.pid).children(recursive=True):
            try:
                if "serve" in child.cmdline():
                    found.append(child)
            except psutil.Error:  # a child that just exited (a zombie has no command line)
                pass
        servers[:] = found
        return bool(servers) and (out / "results.jsonl").is_file()

    wait_for(serving, "the fleet's server serving its first level", tries=4000)
    fleet.kill()
    fleet.wait(30)
    gone, alive = psutil.wait_procs(servers, timeout=30)  # a generous bound on "process gone"
    assert servers and not alive, f"the fleet's server outlived it: {alive}"


# -- 6. limits ---------------------------------------------------------------------------------------------
def test_connection_cap_idle_connections_and_sessions_per_client(models):
    with BackgroundServer(models["cloud"], ServeConfig(max_connections=3)) as url:
        idle = [raw_client(url) for _ in range(3)]  # hello, then nothing: the cap is full
        with pytest.raises(CloudUnreachable, match=r"server at capacity: 3 connections open \(--max-connections\)"):
            RemoteCloud(url).connect()
    background = BackgroundServer(models["cloud"], ServeConfig(idle_timeout_s=0.3))
    with background as url:
        idle = [raw_client(url) for _ in range(3)]
        for ws in idle:  # a connection without a session is closed after the idle timeout
            error, _ = refused(ws)
            assert error["code"] == "idle" and "no session on this connection for 0.3 s" in error["message"]
        wait_for(lambda: background.server.connections == 0, "the idle connections closed")
    with BackgroundServer(models["cloud"], ServeConfig(max_sessions_per_client=1)) as url:
        holder = raw_client(url)
        holder.send(opening())
        holder.send(encode("verify", base=6, new=[], draft=[1]))
        assert decode(holder.recv(timeout=30))["type"] == "verdict"
        second = raw_client(url)  # the same address (127.0.0.1) opens a second session
        second.send(opening())
        error, _ = refused(second)
        assert error["code"] == "capacity" and "already holds 1 sessions (--max-sessions-per-client 1)" in error["message"]


def test_a_generation_stops_when_its_client_goes(models):
    """A cloud-only generation of 400 steps (50 ms batch window each: about 20 s) whose client vanishes
    after it began: the server stops it and frees the session long before its budget."""
    background = BackgroundServer(models["cloud"], ServeConfig(batch_window_ms=50))
    with background as url:
        ws = raw_client(url)
        ws.send(opening(max_new_tokens=400))
        ws.send(encode("generate"))
        wait_for(lambda: background.server.batcher.logged >= 2, "the generation began")
        ws.socket.close()
        wait_for(lambda: not background.server.sessions, "the session freed")
        assert background.server.batcher.logged < 400 and background.server.stats["generated"] == 0
        still_serves(models, url)


# -- 7. TLS and the token file -------------------------------------------------------------------------------
@pytest.mark.skipif(shutil.which("openssl") is None, reason="the openssl command makes the test's certificate")
def test_a_tls_round_trip_with_a_self_signed_certificate(models, tmp_path):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)
    with BackgroundServer(models["cloud"], ServeConfig(token="s3cret", tls_cert=str(cert), tls_key=str(key))) as url:
        remote = RemoteCloud(f"wss://{url}", token="s3cret", ca_file=str(cert))
        remote.connect()
        generation = speculative_decode(models["edge"].backend, remote, Prompt(IDS), GREEDY, DecodeConfig(max_new_tokens=8))
        remote.close()
        assert len(generation.tokens) == 8
        assert all(c.wire_up_bytes > 0 and c.wait_s > 0 for c in generation.cycles if c.escalated)  # counted over TLS too
        with pytest.raises(CloudUnreachable, match="CERTIFICATE_VERIFY_FAILED"):  # not trusted: refused
            RemoteCloud(f"wss://{url}", token="s3cret").connect()
        with pytest.raises(CloudUnreachable, match="did not complete the handshake"):  # plain ws:// to a TLS server
            RemoteCloud(url, token="s3cret", connect_timeout_s=5).connect()
    with pytest.raises(ConfigError, match="cannot load the TLS certificate"):
        BackgroundServer(models["cloud"], ServeConfig(tls_cert=str(key), tls_key=str(key)))
    with pytest.raises(ConfigError, match="both --tls-cert and --tls-key"):
        ServeConfig(tls_cert=str(cert))


def test_a_world_readable_token_file_is_warned_about(tmp_path):
    path = tmp_path / "token"
    path.write_text("s3cret\n")
    path.chmod(0o644)
    assert "readable by every user of this machine: chmod 600" in token_file_warning(path)
    path.chmod(0o600)
    assert token_file_warning(path) is None and read_token(path) == "s3cret"


def test_stats_answer_with_the_callers_own_forwards_unless_shared(models):
    for share in (False, True):
        background = BackgroundServer(models["cloud"], ServeConfig(share_stats=share))
        with background as url:
            ws = raw_client(url)
            ws.send(opening())
            ws.send(encode("verify", base=6, new=[], draft=[1]))
            assert decode(ws.recv(timeout=30))["type"] == "verdict"
            background.server.batcher.owners[0] = frozenset({"192.0.2.1"})  # as if another machine's session
            ws.send(encode("stats", since=0))
            batches = decode(ws.recv(timeout=30))["batches"]
            assert len(batches) == (1 if share else 0)


def test_ready_names_the_models_folder_only_to_clients_on_this_machine(models, pair):
    background = BackgroundServer(models["cloud"])
    assert decode(background.server.ready)["model"] == pair["cloud"]  # loopback: `specbench score` needs it
    assert decode(background.server.ready_remote)["model"] == os.path.basename(pair["cloud"]) == "cloud"
    background.server.compute.shutdown()


# -- 6. a session that mixes verify and generate (found by tests/test_fuzz_protocol.py's generator) -----
@pytest.mark.parametrize("draft", [[7, 1, 30], [63, 63, 63]], ids=["some accepted", "accepted 0"])
def test_generate_after_a_verify_continues_from_the_accepted_sequence(models, draft, caplog):
    """hello -> open -> verify -> generate once answered `internal` ("AssertionError: cache length 5
    must be < accepted length 5") and logged a traceback: the verdict's correction (or bonus) was not
    yet in the server's mirror, so the cache had seen every accepted token. Now the generate takes the
    verdict's token first and continues, as the edge would: the verified prefix, the token, then the
    cloud's greedy tokens, equal to a cloud-only generate of that prefix."""
    caplog.set_level(logging.WARNING, logger="specbench.serve")
    with BackgroundServer(models["cloud"]) as url:
        ws = raw_client(url)
        ws.send(opening())
        ws.send(encode("verify", base=6, new=[], draft=draft, probs=None))
        verdict = decode(ws.recv(timeout=30))
        assert verdict["type"] == "verdict"
        if draft[0] == 63:
            assert verdict["accepted"] == 0
        ws.send(encode("generate"))
        generated = decode(ws.recv(timeout=60))
        assert generated["type"] == "generated", generated
        prefix = draft[: verdict["accepted"]] + [verdict["token"]]
        assert generated["tokens"][: len(prefix)] == prefix and len(generated["tokens"]) == 8
        alone = raw_client(url)  # the same prefix given as the prompt: its cloud-only continuation
        alone.send(opening(prompt_ids=IDS.tolist() + prefix, max_new_tokens=8 - len(prefix)))
        alone.send(encode("generate"))
        assert decode(alone.recv(timeout=60))["tokens"] == generated["tokens"][len(prefix):]
    assert not [r for r in caplog.records if r.exc_info], "verify then generate logged a traceback"


def test_a_verify_that_drops_the_last_verdicts_token_is_out_of_sync_in_one_line(models, caplog):
    """After a verdict the server's cache holds every accepted token; a verify whose `new` leaves out
    that verdict's token gave it nothing to predict from: `internal` and a traceback ("cache length 6
    must be < accepted length 6"). Now one `out_of_sync` line. An empty draft is a plain step: its
    verdict is the cloud's next token, which the next verify carries back."""
    caplog.set_level(logging.WARNING, logger="specbench.serve")
    with BackgroundServer(models["cloud"]) as url:
        ws = raw_client(url)
        ws.send(opening())
        ws.send(encode("verify", base=6, new=[], draft=[], probs=None))
        step = decode(ws.recv(timeout=30))
        greedy = autoregressive_decode(models["cloud"].backend, Prompt(IDS), DecodeConfig(max_new_tokens=2)).tokens
        assert step["type"] == "verdict" and step["accepted"] == 0 and step["token"] == greedy[0]
        ws.send(encode("verify", base=7, new=[step["token"]], draft=[], probs=None))
        assert decode(ws.recv(timeout=30))["token"] == greedy[1]
        ws.send(encode("verify", base=7, new=[], draft=[1], probs=None))  # base agrees: the token is left out
        error, _ = refused(ws)
        assert error["code"] == "out_of_sync" and "last verdict's token" in error["message"], error
        still_serves(models, url)
    assert not [r for r in caplog.records if r.exc_info], "a verify without the verdict's token logged a traceback"


def test_constraints_that_mask_the_whole_vocabulary_are_one_line_without_an_exception_name(models, caplog):
    """Found by tests/test_fuzz_protocol.py: an open with vocab 1, the zh profile and eos [0], then a
    verify, answered "this session's verdict failed: SpecdecError: the cloud distribution is not
    finite at temperature 0": an exception's class name on the wire and a cause the user cannot see."""
    caplog.set_level(logging.WARNING, logger="specbench.serve")
    with BackgroundServer(models["cloud"]) as url:
        ws = raw_client(url)
        ws.send(opening(prompt_ids=[0], max_new_tokens=1, constraints="zh", eos_ids=[0], vocab=1))
        ws.send(encode("verify", base=1, new=[], draft=[0], probs=None))
        error, _ = refused(ws)
        assert error["code"] == "verify_failed"
        assert error["message"] == ("this session's verdict failed: the constraints allow no token of this session's "
                                    "vocabulary (1): widen vocab or use other constraints")
        still_serves(models, url)
    assert not [r for r in caplog.records if r.exc_info]


@pytest.mark.parametrize("late", [False, True], ids=["verify-at-once", "verify-after-the-close"])
def test_an_eos_id_outside_the_sessions_vocab_is_refused_at_open(models, caplog, late):
    """Found by tests/test_fuzz_protocol.py: open {vocab 33, constraints zh, eos_ids [49]} was taken
    (49 < the model's 64), and its first verify logged a traceback (IndexError in the zh profile's
    index_fill) and answered the IndexError's text. The eos ids are now checked against the session's
    vocab at open. The verify may find the connection already closed by the refusal (it did, once, with
    the other core busy): either way the open's error is the reply."""
    caplog.set_level(logging.WARNING, logger="specbench.serve")
    with BackgroundServer(models["cloud"]) as url:
        ws = raw_client(url)
        ws.send(opening(constraints="zh", eos_ids=[49], vocab=33))
        if late:  # the busy-core order, forced: the refusal's close comes before the verify is sent
            time.sleep(1.0)
        with contextlib.suppress(ConnectionClosed):
            ws.send(encode("verify", base=6, new=[], draft=[1], probs=None))
        error, _ = refused(ws)
        assert (error["code"], error["message"]) == ("bad_message", "field 'eos_ids' must hold token ids in [0, 33)")
    assert not [r for r in caplog.records if r.exc_info]
