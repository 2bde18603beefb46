"""What the split deployment does when things go wrong, and what it refuses.

Unreachable server, a server killed mid-generation, a server that stops answering, malformed,
oversized and garbage input, a client that vanishes mid-call, the session cap, the idle TTL, a
wrong schema, a missing token, a non-loopback bind without credentials; the `serve` and `link`
commands as separate processes, stopped by SIGTERM without leaving anything behind."""
from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
import torch
from websockets.asyncio.server import serve
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from bench.cli import main
from bench.measure.run import FailedSamples, run
from specdec.backends.base import Backend
from specdec.backends.prompt import Prompt
from specdec.core.config import DecodeConfig, DeployConfig, SpecConfig
from specdec.core.decode import SpecOptions, speculative_decode
from specdec.core.verdict import CloudLost
from specdec.engine import Engine
from specdec.errors import ConfigError
from specdec.models.loading import load, load_model
from specdec.remote.background import BackgroundServer
from specdec.remote.client import CloudUnreachable, RemoteCloud
from specdec.remote.protocol import SCHEMA
from specdec.remote.server_config import ServeConfig
from tests.wire import decode, encode

pytestmark = pytest.mark.server  # see CONTRIBUTING.md: the quick loop leaves these out

GREEDY = SpecConfig(k=3, entropy_threshold=0, policy="greedy")
IDS = torch.tensor([3, 17, 5, 22, 9, 40])


@pytest.fixture(scope="module")
def models(pair):
    return {role: load_model(path, "float32") for role, path in pair.items()}


@pytest.fixture
def prompts(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"id": f"p{i}", "prompt": t}) + "\n"
                            for i, t in enumerate(["hello world", "what is one two", "yes no . ,", "say three"])))
    return path


def start_cli_server(pair, *extra) -> tuple[subprocess.Popen, str]:
    process = subprocess.Popen(
        [sys.executable, "-m", "bench.cli", "serve", "--model", pair["cloud"], "--dtype", "float32", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    line = process.stdout.readline()
    assert line.startswith("listening on "), (line, process.stderr.read() if process.poll() is not None else "")
    return process, line.split()[-1]


def raw_client(url: str, **kwargs):
    ws = connect(f"ws://{url}/", compression=None, **kwargs)
    ws.send(encode("hello", schema=SCHEMA, token=None))
    assert decode(ws.recv(timeout=10))["type"] == "ready"
    return ws


def wait_for(condition, what: str, tries: int = 400) -> None:
    """Poll `condition` every 25 ms, at most `tries` times (a bounded loop, not a timing assertion)."""
    for _ in range(tries):
        if condition():
            return
        threading.Event().wait(0.025)
    raise AssertionError(f"never happened: {what}")


def opening(vocab: int = 64, **overrides) -> bytes:
    fields = dict(prompt_ids=IDS.tolist(), features=None, max_new_tokens=8, temperature=0.0, seed=0, policy="greedy",
                  accept_threshold=0.1, verifier="cached", constraints="none", eos_ids=[], vocab=vocab)
    return encode("open", **{**fields, **overrides})


def still_serves(models, url: str) -> None:
    remote = RemoteCloud(url)
    remote.connect()
    generation = speculative_decode(models["edge"].backend, remote, Prompt(IDS), GREEDY, DecodeConfig(max_new_tokens=6))
    remote.close()
    assert len(generation.tokens) == 6


def refused(ws) -> tuple[dict, int | None]:
    """The error reply, then the close the server sends after it."""
    message = decode(ws.recv(timeout=10))
    with pytest.raises(ConnectionClosed):
        ws.recv(timeout=10)
    return message, ws.close_code


# -- the edge cannot reach, or loses, the cloud ------------------------------------------------------
def test_unreachable_server_is_one_line_and_writes_nothing(pair, prompts, tmp_path, capsys):
    out = tmp_path / "out"
    code = main(["run", "--mode", "spec", "--edge", pair["edge"], "--cloud-url", "127.0.0.1:9", "--prompts",
                 str(prompts), "--out", str(out), "--dtype", "float32"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1].startswith("error: cannot reach the cloud verifier at 127.0.0.1:9")
    assert "specbench serve" in err[-1] and not (out / "results.jsonl").exists()


class KillsServerAfter(Backend):
    """An edge backend that SIGKILLs the server process after its n-th forward: a server lost in the
    middle of a generation, at a point the test chooses."""

    def __init__(self, backend, process: subprocess.Popen, after: int) -> None:
        self.backend, self.process, self.after, self.calls = backend, process, after, 0
        self.name, self.vocab_size, self.accepts_audio = backend.name, backend.vocab_size, backend.accepts_audio
        self.model = backend.model

    def prefill(self, *args, **kwargs):
        return self.backend.prefill(*args, **kwargs)

    def forward(self, *args, **kwargs):
        self.calls += 1
        if self.calls == self.after:
            self.process.kill()
            self.process.wait(10)
        return self.backend.forward(*args, **kwargs)

    def crop(self, *args):
        return self.backend.crop(*args)


@pytest.mark.parametrize("on_loss", ["fail", "edge"])
def test_server_killed_mid_generation(pair, models, on_loss):
    process, url = start_cli_server(pair)
    remote = RemoteCloud(url, timeout_s=5)
    remote.connect()
    edge = KillsServerAfter(models["edge"].backend, process, after=5)
    decode_config = DecodeConfig(max_new_tokens=16)
    if on_loss == "fail":
        with pytest.raises(CloudLost, match=f"the cloud verifier at {url}"):
            speculative_decode(edge, remote, Prompt(IDS), GREEDY, decode_config)
        return
    generation = speculative_decode(edge, remote, Prompt(IDS), GREEDY, decode_config, SpecOptions(on_cloud_loss="edge"))
    assert generation.degraded and len(generation.tokens) == 16
    escalated = [c.escalated for c in generation.cycles]
    assert escalated[0] and not escalated[-1]  # verified until the loss, edge-only after it


def test_a_run_records_the_loss_and_a_rerun_resumes(pair, prompts, tmp_path):
    """The server dies during the third prompt (at the edge's 24th forward): that prompt and the rest
    are recorded `failed` with the reason, the first two stay as written, and a rerun against a new
    server redoes only the failed ones."""
    out = tmp_path / "out"
    process, url = start_cli_server(pair)

    def loader(name, settings, log=print):
        loaded = load(name, settings, log)
        return dataclasses.replace(loaded, backend=KillsServerAfter(loaded.backend, process, after=24))

    spec = SpecConfig(k=3, entropy_threshold=0, policy="greedy")
    engine = Engine(mode="spec", edge=pair["edge"], cloud_url=url, dtype="float32", spec=spec,
                    decode=DecodeConfig(max_new_tokens=8), loader=loader, log=lambda m: None,
                    # drafting ahead would make the forward count depend on timing
                    deploy=DeployConfig(cloud_timeout_s=5, overlap=False))
    with pytest.raises(FailedSamples, match="2 of 4 samples failed, e.g. the cloud verifier at"):
        run(engine, str(prompts), out, progress=False)
    before = (out / "results.jsonl").read_bytes()
    rows = [json.loads(line) for line in before.decode().splitlines()]
    assert [r["status"] for r in rows] == ["ok", "ok", "failed", "failed"]
    process, url = start_cli_server(pair)  # the cloud is back, on another port
    try:
        assert main(["run", "--mode", "spec", "--edge", pair["edge"], "--cloud-url", url, "--prompts", str(prompts),
                     "--out", str(out), "--dtype", "float32", "--max-new-tokens", "8", "--k", "3",
                     "--entropy-threshold", "0", "--policy", "greedy", "--no-overlap"]) == 0
    finally:
        process.terminate()
        process.wait(10)
    data = (out / "results.jsonl").read_bytes()
    assert data.startswith(before)  # nothing already written is lost
    assert [(r["id"], r["status"]) for r in map(json.loads, data.decode().splitlines()[4:])] == [("p2", "ok"), ("p3", "ok")]


def test_no_reply_within_the_timeout_is_a_cloud_loss(models):
    """A server that accepts the session and then never answers: the call times out."""
    ready = encode("ready", schema=SCHEMA, model="mute", vocab_size=64, tokenizer_sha256="", accepts_audio=False)
    listening, holder = threading.Event(), {}

    async def mute(ws):
        await ws.recv()
        await ws.send(ready)
        async for _ in ws:
            pass

    async def main_loop():
        holder["loop"], holder["stop"] = asyncio.get_running_loop(), asyncio.Event()
        async with serve(mute, "127.0.0.1", 0, compression=None) as server:
            holder["port"] = server.sockets[0].getsockname()[1]
            listening.set()
            await holder["stop"].wait()

    thread = threading.Thread(target=lambda: asyncio.run(main_loop()), daemon=True)
    thread.start()
    listening.wait(10)
    remote = RemoteCloud(f"127.0.0.1:{holder['port']}", timeout_s=0.5)
    remote.connect()
    with pytest.raises(CloudLost, match="no reply from the cloud verifier .* within 0.5 s"):
        speculative_decode(models["edge"].backend, remote, Prompt(IDS), GREEDY, DecodeConfig(max_new_tokens=6))
    holder["loop"].call_soon_threadsafe(holder["stop"].set)
    thread.join(10)


# -- the server survives bad clients -------------------------------------------------------------------
def test_malformed_messages_get_an_error_and_a_closed_session(models):
    background = BackgroundServer(models["cloud"])
    with background as url:
        cases = {
            b"\xc1not msgpack": "undecodable message",
            encode("dance"): "expected open or verify or generate or close or stats",
            encode("verify", base=6, new=[], draft=[1]): "verify before open",
            opening(policy="nonsense"): "policy must be one of",
            opening(prompt_ids=[1, 2, 999]): "token ids in [0, 64)",
            opening(max_new_tokens="eight"): "field 'max_new_tokens' must be int",
            # 6 prompt tokens + 600 > the tiny cloud's 512 positions: refused before any forward
            opening(max_new_tokens=600): "need more positions than model",
        }
        for message, reason in cases.items():
            ws = raw_client(url)
            ws.send(message)
            error, code = refused(ws)
            assert error["type"] == "error" and reason in error["message"], (message, error)
            assert code == 1008
        ws = raw_client(url)  # a verify out of step with the server's copy of the sequence
        ws.send(opening())
        ws.send(encode("verify", base=7, new=[], draft=[1, 2]))
        error, _ = refused(ws)
        assert error["code"] == "out_of_sync"
        still_serves(models, url)
        # every refused session is freed once its close handshake ends (the server's, up to 2 s)
        wait_for(lambda: background.server.sessions == {}, "every refused session freed")


def test_oversized_message_closes_that_connection_only(models):
    with BackgroundServer(models["cloud"], ServeConfig(max_message_mb=0.01)) as url:
        ws = raw_client(url)
        ws.send(opening(prompt_ids=[1] * 20_000))  # ≈ 20 kB > 10 kB
        with pytest.raises(ConnectionClosed):
            ws.recv(timeout=10)
        assert ws.close_code == 1009  # "message too big"
        still_serves(models, url)


def test_garbage_bytes_and_a_client_vanishing_mid_call(models):
    background = BackgroundServer(models["cloud"])
    with background as url:
        host, port = url.rsplit(":", 1)
        with socket.create_connection((host, int(port))) as sock:  # not even HTTP
            sock.sendall(os.urandom(4096))
        ws = raw_client(url)
        ws.send(opening())
        ws.send(encode("verify", base=6, new=[], draft=[1, 2, 3]))
        ws.socket.close()  # gone before the verdict comes back
        deadline = time.monotonic() + 10
        while background.server.sessions and time.monotonic() < deadline:
            time.sleep(0.05)
        assert background.server.sessions == {}
        still_serves(models, url)


def test_one_session_more_than_max_sessions_is_refused(models):
    with BackgroundServer(models["cloud"], ServeConfig(max_sessions=1)) as url:
        holder = raw_client(url)
        holder.send(opening())
        holder.send(encode("verify", base=6, new=[], draft=[1]))
        assert decode(holder.recv(timeout=10))["type"] == "verdict"
        remote = RemoteCloud(url)
        remote.connect()
        with pytest.raises(CloudLost, match=r"server at capacity: 1 sessions open \(--max-sessions 1\)"):
            speculative_decode(models["edge"].backend, remote, Prompt(IDS), GREEDY, DecodeConfig(max_new_tokens=4))
        holder.send(encode("close"))
        time.sleep(0.2)
        still_serves(models, url)


def test_an_idle_session_expires_after_its_ttl(models):
    background = BackgroundServer(models["cloud"], ServeConfig(session_ttl_s=0.3))
    with background as url:
        ws = raw_client(url)
        ws.send(opening())
        ws.send(encode("verify", base=6, new=[], draft=[1]))
        assert decode(ws.recv(timeout=10))["type"] == "verdict"
        error, _ = refused(ws)  # no message for longer than the TTL: the server hangs up
        assert error["code"] == "expired" and "session expired after 0.3 s idle" in error["message"]
        assert background.server.sessions == {}


def test_wrong_schema_and_missing_token_are_refused(models, tmp_path):
    with BackgroundServer(models["cloud"], ServeConfig(token="s3cret")) as url:
        ws = connect(f"ws://{url}/", compression=None)
        ws.send(encode("hello", schema=SCHEMA + 1, token="s3cret"))
        error, _ = refused(ws)
        assert error["code"] == "schema"
        with pytest.raises(CloudUnreachable, match="bad or missing token"):
            RemoteCloud(url).connect()
        remote = RemoteCloud(url, token="s3cret")
        assert remote.connect()["vocab_size"] == 64
        remote.close()


def test_non_loopback_bind_needs_a_token_file(pair, tmp_path, capsys):
    with pytest.raises(ConfigError, match="refusing to bind 0.0.0.0"):
        ServeConfig(host="0.0.0.0")
    assert ServeConfig(host="0.0.0.0", token="s3cret").host == "0.0.0.0"
    assert main(["serve", "--model", pair["cloud"], "--host", "0.0.0.0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "refusing to bind 0.0.0.0" in err and "--token-file" in err
    (tmp_path / "empty").write_text("\n")
    assert main(["serve", "--model", pair["cloud"], "--token-file", str(tmp_path / "empty")]) == 2
    assert "is empty" in capsys.readouterr().err


# -- the commands as processes -------------------------------------------------------------------------
def test_serve_and_link_processes_end_to_end_and_stop_on_sigterm(pair, prompts, tmp_path):
    server, url = start_cli_server(pair, "--max-sessions", "4")
    link = subprocess.Popen([sys.executable, "-m", "bench.cli", "link", "--to", url, "--rtt", "20ms", "--up", "10mbit",
                             "--down", "20mbit"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    shaped = link.stdout.readline().split()[2]
    common = ["--prompts", str(prompts), "--dtype", "float32", "--max-new-tokens", "8"]
    spec = ["--mode", "spec", "--edge", pair["edge"], "--k", "3", "--entropy-threshold", "0", "--policy", "greedy"]
    assert main(["run", *spec, "--cloud-url", shaped, "--out", str(tmp_path / "split"), *common]) == 0
    assert main(["run", "--mode", "cloud", "--cloud", pair["cloud"], "--out", str(tmp_path / "cloud"), *common]) == 0
    rows = {name: [json.loads(line) for line in (tmp_path / name / "results.jsonl").read_text().splitlines()]
            for name in ("split", "cloud")}
    assert [r["tokens"] for r in rows["split"]] == [r["tokens"] for r in rows["cloud"]]
    split = rows["split"][0]
    assert split["deployment"] == "split" and split["cloud"] == pair["cloud"]
    assert split["wire_up_bytes"] > 0 and split["link_s"] >= 0.02 * split["cloud_calls"]
    for process in (link, server):
        process.send_signal(signal.SIGTERM)
        assert process.wait(10) == 0
        assert process.stderr.read().strip().splitlines()[-1].startswith("stopped: ")
