"""Timing a model of the real size whose weights cannot travel (issue 44's GPU fleet): a random-weight
architecture built from a config (`arch:PATH.json`, specdec/models/architecture.py) serves recorded edges, and
a server started with --follow-verdicts keeps each replayed verify's recorded verdict while it computes its
own (`verify.follow`). On the tiny pair (fp32, loopback): the architecture loads the same weights every time and
refuses text; a followed replay keeps the recording's acceptance in one session per generation (no prefill per
verify) and counts the server's own disagreements, none against the real cloud; a server not started so, or a
fleet asking wrongly, is refused in one line."""
from __future__ import annotations

import asyncio
import json

import pytest
import torch

from bench.cli import main
from bench.core.records import read_records
from bench.derive.fleet_summary import read_fleet
from bench.measure.serving.clients import replay, script_of
from bench.measure.serving.fleet_config import FleetConfig
from specdec.backends.prompt import Prompt
from specdec.core.verdict import CloudLost
from specdec.errors import ConfigError, InputError, ModelError
from specdec.models.loading import load_model
from specdec.remote.background import BackgroundServer
from specdec.remote.server_config import ServeConfig
from tests.recording import record_split

pytestmark = pytest.mark.server  # see CONTRIBUTING.md: the quick loop leaves these out

K = 3
SETTINGS = ["--dtype", "float32", "--policy", "greedy", "--entropy-threshold", "0", "--k", str(K), "--max-new-tokens", "12"]
# Not the tiny cloud's shape: drawn with the same seed, that would be the cloud itself.
ARCH = {"model_type": "llama", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256}


@pytest.fixture(scope="module")
def arch(tmp_path_factory):
    path = tmp_path_factory.mktemp("arch") / "tiny.json"
    path.write_text(json.dumps(ARCH))
    return f"arch:{path}"


@pytest.fixture(scope="module")
def cloud_server(pair):
    with BackgroundServer(load_model(pair["cloud"], "float32"), ServeConfig(max_batch=8, follow_verdicts=True)) as url:
        yield url


@pytest.fixture(scope="module")
def arch_server(arch):
    with BackgroundServer(load_model(arch, "float32"), ServeConfig(max_batch=8, follow_verdicts=True)) as url:
        yield url


@pytest.fixture(scope="module")
def recording(pair, prompts, cloud_server, tmp_path_factory):
    return record_split(pair["edge"], cloud_server, prompts, tmp_path_factory.mktemp("recording"), SETTINGS)


def recorded(recording) -> dict:
    return {r["id"]: script_of(r) for r in read_records(recording / "results.jsonl")}


def test_an_architecture_loads_the_same_random_weights_each_time_and_refuses_text(arch):
    first, second = load_model(arch, "float32"), load_model(arch, "float32")
    ids = torch.tensor([3, 17, 5])
    logits = [m.backend.prefill(Prompt(ids), ids, keep=3)[1] for m in (first, second)]
    assert first.backend.vocab_size == 64 and first.runtime == "torch"
    assert torch.equal(logits[0], logits[1])
    with pytest.raises(InputError, match=r"^model 'arch:.*' is a random-weight architecture without a tokenizer: it "
                                         r"serves token ids"):
        first.encode("hello")


@pytest.mark.parametrize("content,reason", [
    (None, r"cannot read the architecture .*missing.json: No such file or directory; give arch:PATH"),
    ("{not json", r"architecture .* is not JSON \(.* at line 1\): fix the file"),
    ('{"hidden_size": 8}', r"architecture .* names no model_type: add e.g."),
])
def test_a_bad_architecture_file_is_one_line(tmp_path, content, reason):
    path = tmp_path / "missing.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ModelError, match=reason):
        load_model(f"arch:{path}", "float32")


@pytest.mark.parametrize("role", ["edge", "cloud"])
def test_a_run_on_an_architecture_is_refused_before_it_starts(arch, prompts, tmp_path, capsys, role):
    models = {"edge": arch, "cloud": "c"} if role == "edge" else {"edge": "e", "cloud": arch}
    assert main(["run", "--mode", "spec", "--edge", models["edge"], "--cloud", models["cloud"], "--prompts", prompts,
                 "--out", str(tmp_path / "r")]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"error: --{role} {arch} is a random-weight architecture: it serves token ids to replayed edges (`specbench "
        "fleet --edge-replay DIR --follow-verdicts`), not text prompts; load a real model here")
    assert not (tmp_path / "r" / "results.jsonl").exists()


def test_an_architecture_runs_in_torch_only(arch):
    with pytest.raises(ModelError, match="random-weight architecture, which the torch runtime builds: use runtime torch"):
        load_model(arch, "float32", runtime="torch-int8")


def test_a_followed_replay_on_random_weights_keeps_the_recorded_acceptance_in_one_session(
        prompts, arch, arch_server, recording, tmp_path):
    out = tmp_path / "fleet"
    assert main(["fleet", "--edge-replay", str(recording), "--cloud-url", arch_server, "--follow-verdicts", "--prompts",
                 prompts, "--clients", "1,2", "--out", str(out), *SETTINGS]) == 0
    records, levels, batches = read_fleet(out)
    scripts = recorded(recording)
    spec = [r for r in records if r["mode"] == "spec"]
    assert len(spec) == 3 * 3 and all(r["status"] == "ok" and r["followed"] for r in spec)
    for row in spec:  # the recording's blocks and verdicts, verify for verify
        script = scripts[row["id"]]
        assert row["verifies"] == len(script.steps)
        assert row["accepted_draft_tokens"] == sum(step.accepted for step in script.steps)
    # Random weights disagree with the recorded verdicts, and the session goes on: no re-open, so one prefill per
    # generation and every other forward a block of at most k + 1 tokens.
    assert sum(r["replay_mismatches"] for r in spec) > 0
    prefills = [b for b in batches if b["mode"] == "spec" and b["max_block"] > K + 1]
    assert len(prefills) <= len(spec)
    cloud = [r for r in records if r["mode"] == "cloud"]
    assert all(r["status"] == "ok" and r["new_tokens"] == scripts[r["id"]].new_tokens for r in cloud)


def test_the_real_cloud_following_its_own_recording_agrees_every_time(pair, prompts, cloud_server, recording):
    vocab = asyncio.run(_vocab(cloud_server))
    for script in recorded(recording).values():
        measured = asyncio.run(replay(cloud_server, script, vocab, follow=True))
        assert measured["followed"] and measured["replay_mismatches"] == 0  # fp32: the server's own verdict is the recorded one


async def _vocab(url: str) -> int:
    from bench.measure.serving.clients import server_info

    return (await server_info(url))["vocab_size"]


def test_the_fleet_starts_an_architecture_server_that_follows(prompts, arch, recording, tmp_path):
    out = tmp_path / "own"
    assert main(["fleet", "--edge-replay", str(recording), "--cloud", arch, "--follow-verdicts", "--prompts", prompts,
                 "--clients", "1", "--no-baseline", "--out", str(out), *SETTINGS]) == 0
    records, _, _ = read_fleet(out)
    assert records and all(r["status"] == "ok" and r["followed"] and r["cloud"].startswith("arch:") for r in records)


def test_a_server_that_keeps_its_own_verdicts_refuses_to_follow(pair, prompts, recording, tmp_path, capsys):
    with BackgroundServer(load_model(pair["cloud"], "float32"), ServeConfig()) as url:
        script = next(iter(recorded(recording).values()))
        with pytest.raises(CloudLost, match=r"refused: verify.follow: this server keeps its own verdicts; start it with "
                                            r"--follow-verdicts"):
            asyncio.run(replay(url, script, 64, follow=True))
        code = main(["fleet", "--edge-replay", str(recording), "--cloud-url", url, "--follow-verdicts", "--prompts",
                     prompts, "--clients", "1", "--out", str(tmp_path / "f"), *SETTINGS])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (f"error: --follow-verdicts: the server at {url} keeps its own verdicts; start it with "
                       "`specbench serve --follow-verdicts`")


def test_following_needs_a_replay_and_random_weights_need_following(prompts, arch, recording):
    with pytest.raises(ConfigError, match=r"^--follow-verdicts keeps recorded verdicts: it needs --edge-replay DIR$"):
        FleetConfig(prompts=prompts, cloud="m", edge="e", follow_verdicts=True)
    with pytest.raises(ConfigError, match=r"has random weights, whose verdicts are noise: add --follow-verdicts"):
        FleetConfig(prompts=prompts, cloud=arch, edge_replay=str(recording))
