"""Split deployment: the cloud verifier behind `specbench serve`, the edge as its client.

Greedy spec over the server == in-process spec == cloud mode, token for token (cached and stateless
verifiers, with and without a shaped link); counters identical to in-process; speculative sampling
through the server keeps the cloud's distribution (full and top-N draft uploads); audio features
cross once per session and the server verifies with them."""
from __future__ import annotations

import pytest
import torch
from scipy.stats import chisquare

from bench.core.network import profile
from bench.measure.link import BackgroundLink
from specdec.backends.prompt import Prompt
from specdec.core.config import DecodeConfig, DeployConfig, SpecConfig
from specdec.core.decode import speculative_decode
from specdec.engine import Engine
from specdec.models.loading import load_model
from specdec.remote.background import BackgroundServer
from specdec.remote.client import RemoteCloud

pytestmark = pytest.mark.server  # see CONTRIBUTING.md: the quick loop leaves these out

TEXTS = ["hello world", "what is one two", "yes no . ,", "say three", "write a function to sort a list"]
GREEDY = dict(entropy_threshold=0.0, policy="greedy")


@pytest.fixture(scope="module")
def cloud_model(pair):
    return load_model(pair["cloud"], "float32")


@pytest.fixture(scope="module")
def server(cloud_model):
    background = BackgroundServer(cloud_model)
    with background as url:
        yield url, background.server


def generate_all(engine: Engine) -> list:
    try:
        return [engine.generate(text) for text in TEXTS]
    finally:
        engine.close()


def comparable(generation) -> tuple:
    """Tokens, counters and per-cycle decisions; the overlap counters exist only in split runs."""
    counters = {k: v for k, v in generation.counters.as_dict().items() if not k.startswith("overlap_")}
    return generation.tokens, counters, [
        (c.draft_tokens, c.escalated, c.accepted, c.extra_token, c.extra_kind, c.cloud_tokens_in) for c in generation.cycles
    ]


@pytest.mark.parametrize("overlap", [False, True, "auto"])
@pytest.mark.parametrize("verifier", ["cached", "stateless"])
@pytest.mark.parametrize("k", [1, 3, 6])
def test_split_greedy_equals_in_process_and_cloud_mode(pair, server, verifier, k, overlap):
    url, _ = server
    spec = SpecConfig(k=k, verifier=verifier, **GREEDY)
    decode = DecodeConfig(max_new_tokens=14)
    common = dict(edge=pair["edge"], dtype="float32", spec=spec, decode=decode, log=lambda m: None)
    split = generate_all(Engine(mode="spec", cloud_url=url, deploy=DeployConfig(overlap=overlap), **common))
    local = generate_all(Engine(mode="spec", cloud=pair["cloud"], **common))
    cloud = generate_all(Engine(mode="cloud", cloud=pair["cloud"], dtype="float32", decode=decode, log=lambda m: None))
    assert [g.tokens for g in split] == [g.tokens for g in cloud]
    assert [comparable(g) for g in split] == [comparable(g) for g in local]
    cycles = [c for g in split for c in g.cycles]
    # Every path ran: rejections with a correction, full acceptances with a bonus.
    assert any(c.extra_kind == "correction" for c in cycles) and any(c.extra_kind == "bonus" for c in cycles)
    assert all(c.wire_up_bytes > 0 and c.wire_down_bytes > 0 and c.wait_s >= c.cloud_s for c in cycles)


@pytest.mark.parametrize("verifier", ["cached", "stateless"])
@pytest.mark.parametrize("k", [1, 4])
def test_overlap_auto_is_lossless_both_ways(pair, server, verifier, k):
    """`--overlap auto` (the default) decides per cycle whether to draft ahead: greedy output equals
    cloud-only token for token in process and through the server, and the split run went both ways
    (sequential warm-up cycles, then drafting ahead to measure its cost), each cycle saying which."""
    url, _ = server
    spec = SpecConfig(k=k, verifier=verifier, **GREEDY)
    decode = DecodeConfig(max_new_tokens=16)
    common = dict(edge=pair["edge"], dtype="float32", spec=spec, decode=decode, log=lambda m: None)
    auto = DeployConfig(overlap="auto")
    assert DeployConfig().overlap == "auto"
    split = generate_all(Engine(mode="spec", cloud_url=url, deploy=auto, **common))
    local = generate_all(Engine(mode="spec", cloud=pair["cloud"], deploy=auto, **common))
    cloud = generate_all(Engine(mode="cloud", cloud=pair["cloud"], dtype="float32", decode=decode, log=lambda m: None))
    assert [g.tokens for g in split] == [g.tokens for g in cloud] == [g.tokens for g in local]
    ways = {c.ahead_chosen for g in split for c in g.cycles if c.escalated}
    assert ways == {True, False}
    assert not any(c.ahead_chosen for g in local for c in g.cycles)  # in process there is no round trip to fill


def test_split_with_entropy_gate_sends_unescalated_blocks_lazily(pair, server):
    """Blocks accepted without the cloud reach it with the next verify, and outputs equal in-process."""
    url, _ = server
    spec = SpecConfig(k=3, entropy_threshold=3.3, policy="threshold", accept_threshold=0.2)
    common = dict(edge=pair["edge"], dtype="float32", spec=spec, decode=DecodeConfig(max_new_tokens=16), log=lambda m: None)
    split = generate_all(Engine(mode="spec", cloud_url=url, **common))
    local = generate_all(Engine(mode="spec", cloud=pair["cloud"], **common))
    assert [comparable(g) for g in split] == [comparable(g) for g in local]
    escalated = [c.escalated for g in split for c in g.cycles]
    assert any(escalated) and not all(escalated)


def test_split_over_a_shaped_link_is_exact_and_pays_the_rtt(pair, server):
    url, _ = server
    host, port = url.rsplit(":", 1)
    link_profile = profile("rtt=30ms,up=10mbit,down=20mbit")
    spec = SpecConfig(k=3, **GREEDY)
    common = dict(edge=pair["edge"], dtype="float32", spec=spec, decode=DecodeConfig(max_new_tokens=10), log=lambda m: None)
    with BackgroundLink(link_profile, (host, int(port))) as shaped:
        split = generate_all(Engine(mode="spec", cloud_url=shaped, **common))
    local = generate_all(Engine(mode="spec", cloud=pair["cloud"], **common))
    assert [comparable(g) for g in split] == [comparable(g) for g in local]
    waits = [c.wait_s for g in split for c in g.cycles if c.escalated]
    assert min(waits) >= link_profile.rtt_s  # the relay delays each way by RTT / 2: a lower bound, never flaky


def test_edge_mode_with_a_cloud_url_never_contacts_it(pair):
    """Nothing listens on port 9 of loopback: an edge run must not even try."""
    engine = Engine(mode="edge", edge=pair["edge"], cloud_url="127.0.0.1:9", dtype="float32",
                    decode=DecodeConfig(max_new_tokens=4), log=lambda m: None)
    assert len(engine.generate("hello world").tokens) == 4


def sample_first_token_counts(edge, cloud, ids, spec, temperature, trials) -> torch.Tensor:
    counts = torch.zeros(64)
    for seed in range(trials):
        generation = speculative_decode(edge, cloud, Prompt(ids), spec,
                                        DecodeConfig(max_new_tokens=1, temperature=temperature, seed=seed))
        counts[generation.tokens[0]] += 1
    return counts


def chi_square_p(counts: torch.Tensor, expected: torch.Tensor) -> float:
    trials = counts.sum()
    keep = expected * trials >= 5  # pool the tail: chi-square needs expected counts >= 5
    observed = torch.cat([counts[keep], counts[~keep].sum().view(1)]).double()
    wanted = torch.cat([expected[keep], expected[~keep].sum().view(1)]).double() * trials
    wanted *= observed.sum() / wanted.sum()
    return chisquare(observed.numpy(), wanted.numpy()).pvalue


@pytest.mark.parametrize("topn", [None, 8])
def test_speculative_sampling_through_the_server_keeps_the_cloud_distribution(pair, cloud_model, server, topn):
    """The first token of `sample` spec over the server ~ softmax(cloud / T). With top-N drafting the
    edge samples from the truncated distribution it uploads, so the rule stays exact."""
    url, _ = server
    edge = load_model(pair["edge"], "float32").backend
    remote = RemoteCloud(url)
    remote.connect()
    ids = torch.tensor([3, 17, 5, 22, 9, 40])
    temperature = 1.0
    with torch.inference_mode():
        logits = cloud_model.backend.model(ids.unsqueeze(0)).logits[0, -1]
    expected = torch.softmax(logits / temperature, -1)
    spec = SpecConfig(k=3, entropy_threshold=0, policy="sample", draft_topn=topn)
    counts = sample_first_token_counts(edge, remote, ids, spec, temperature, trials=1200)
    remote.close()
    assert chi_square_p(counts, expected) > 0.001


def test_top_n_uploads_fewer_bytes_than_the_full_distribution(pair, server):
    url, _ = server
    common = dict(edge=pair["edge"], dtype="float32", decode=DecodeConfig(max_new_tokens=12, temperature=1.0, seed=3),
                  log=lambda m: None)
    up = {}
    for topn in (None, 4):
        spec = SpecConfig(k=3, entropy_threshold=0, policy="sample", draft_topn=topn)
        generations = generate_all(Engine(mode="spec", cloud_url=url, spec=spec, **common))
        cycles = [c for g in generations for c in g.cycles if c.escalated]
        up[topn] = sum(c.wire_up_bytes for c in cycles) / sum(len(c.draft_tokens) for c in cycles)
    # full: 64 float32 per draft token (vocab 64) ≈ 256 B; top-4: 4 × (int32 + float32) = 32 B
    assert up[4] < up[None] - 150


def test_audio_features_cross_once_and_the_server_verifies_with_them(tmp_path):
    from tests.omni_fixtures import random_waveform, tiny_omni_tokenizer, tiny_thinker
    from tests.tiny import noisy_copy

    tokenizer = tiny_omni_tokenizer()
    cloud = tiny_thinker(seed=0, tokenizer=tokenizer)
    paths = {}
    for role, model in (("edge", noisy_copy(cloud, noise=0.2)), ("cloud", cloud)):
        model.save_pretrained(tmp_path / role)
        tokenizer.save_pretrained(tmp_path / role)
        paths[role] = str(tmp_path / role)
    spec, decode = SpecConfig(k=3, **GREEDY), DecodeConfig(max_new_tokens=8)
    clips = [random_waveform(seed) for seed in (1, 2)]
    question = "what is said in the audio clip ?"
    with BackgroundServer(load_model(paths["cloud"], "float32")) as url:
        engine = Engine(mode="spec", edge=paths["edge"], cloud_url=url, dtype="float32", spec=spec, decode=decode,
                        log=lambda m: None)
        split = [engine.generate(question, waveform=clip) for clip in clips]
        engine.close()
    cloud_mode = Engine(mode="cloud", cloud=paths["cloud"], dtype="float32", decode=decode, log=lambda m: None)
    assert [g.tokens for g in split] == [cloud_mode.generate(question, waveform=clip).tokens for clip in clips]
    for generation in split:
        sent = [c.sent_features for c in generation.cycles if c.escalated]
        assert sent[0] and not any(sent[1:])  # once per session
        assert generation.cycles[0].wire_up_bytes > generation.features_bytes > 0
        assert all(c.wire_up_bytes < generation.features_bytes for c in generation.cycles[1:])
