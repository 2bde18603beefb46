"""Token trees through the verifier server: a server whose runtime verifies trees says so (`ready.trees`), takes a
verify's `parents` and answers with the kept `path`; trees and chains verified through it equal in-process, token for
token, and both equal the cloud's own greedy decoding. A server that verifies chains says so, and a tree sent to it
anyway is refused in one line. The client keeps no path the server could invent."""
from __future__ import annotations

import pytest
import torch

from specdec.core.config import DecodeConfig, SpecConfig
from specdec.core.session import AcceptedSequence
from specdec.core.tree import TokenTree
from specdec.core.verdict import CloudLost
from specdec.engine import Engine
from specdec.errors import ConfigError
from specdec.models.loading import load_model
from specdec.remote.background import BackgroundServer
from specdec.remote.client import RemoteCloud, kept_path
from specdec.remote.protocol import ProtocolError, VerdictReply
from specdec.remote.server_session import ServerSession

pytestmark = [pytest.mark.server, pytest.mark.filterwarnings("ignore::UserWarning")]

QUIET = dict(log=lambda message: None)
# Recurring spans, so prompt lookup finds several matches with different continuations (the tree's branches).
TEXTS = ["one two three one two four one two five one two", "yes no yes hello yes no world yes no",
         "a b c a b d a b c a b", "hello world hello you hello world hello"]
DECODE = DecodeConfig(max_new_tokens=16)


def lookup(branches: int) -> SpecConfig:
    return SpecConfig(k=4, entropy_threshold=0, policy="greedy", drafter="prompt-lookup",
                      drafter_options=f"branches={branches}")


@pytest.fixture(scope="module")
def kernels_server(pair):
    background = BackgroundServer(load_model(pair["cloud"], "float32", runtime="kernels-int8", **QUIET))
    with background as url:
        yield url


def generations(engine: Engine) -> list:
    try:
        return [engine.generate(text) for text in TEXTS]
    finally:
        engine.close()


def decisions(generation) -> list[tuple]:
    return [(c.draft_tokens, c.escalated, c.accepted, c.extra_token, c.extra_kind) for c in generation.cycles]


@pytest.fixture(scope="module")
def torch_server(pair):
    with BackgroundServer(load_model(pair["cloud"], "float32", runtime="torch", **QUIET)) as url:  # the dynamic cache
        yield url


@pytest.fixture(scope="module")
def static_server(pair):
    """The torch runtime on the server's static cache of many sessions (static_slots.py), eager on the CPU."""
    from specdec.models.loading import LoadSettings, load
    from specdec.remote.server_config import ServeConfig

    loaded = load(pair["cloud"], LoadSettings("float32", kv_cache="static", sessions=4), **QUIET)
    with BackgroundServer(loaded, ServeConfig(max_sessions=4)) as url:
        yield url


SERVERS = {"kernels-int8": "kernels_server", "torch": "torch_server", "torch on the static cache": "static_server"}


@pytest.mark.parametrize("server", list(SERVERS))
@pytest.mark.parametrize("branches", [1, 4])
def test_trees_and_chains_through_a_server_equal_in_process_and_the_clouds_own_greedy_decoding(
        pair, request, server, branches, monkeypatch):
    url, runtime = request.getfixturevalue(SERVERS[server]), server.split()[0]
    trees_sent = []
    tree_of = ServerSession.tree_of
    monkeypatch.setattr(ServerSession, "tree_of", lambda self, verify: trees_sent.append(tree_of(self, verify))
                        or trees_sent[-1])
    common = dict(dtype="float32", spec=lookup(branches), decode=DECODE, **QUIET)
    split = generations(Engine(mode="spec", edge=pair["edge"], cloud_url=url, **common))
    local = generations(Engine(mode="spec", cloud=pair["cloud"], cloud_runtime=runtime, **common))
    own = generations(Engine(mode="cloud", cloud=pair["cloud"], cloud_runtime=runtime, dtype="float32",
                             decode=DECODE, **QUIET))
    assert [g.tokens for g in split] == [g.tokens for g in local] == [g.tokens for g in own]
    assert [decisions(g) for g in split] == [decisions(g) for g in local]
    multi = [tree for tree in trees_sent if tree is not None]
    if branches == 1:
        assert not multi  # a chain travels as a chain: no parents
    else:
        assert multi and any(not tree.is_chain for tree in multi), "no tree with two branches reached the server"


@pytest.mark.parametrize("options", ["tree_nodes=6,spec_factor=0", "tree_nodes=6,by_cost=1"])
def test_the_suffix_drafters_trees_through_a_server_are_the_clouds_own_greedy_decoding(pair, kernels_server, options):
    """Its global corpus carries across the engine's requests on the edge; sized by cost, its choices follow measured
    times (a server's differ from in-process), so only the tokens are compared there."""
    spec = SpecConfig(k=4, entropy_threshold=0, policy="greedy", drafter="suffix", drafter_options=options)
    common = dict(dtype="float32", spec=spec, decode=DECODE, **QUIET)
    split = generations(Engine(mode="spec", edge=pair["edge"], cloud_url=kernels_server, **common))
    local = generations(Engine(mode="spec", cloud=pair["cloud"], cloud_runtime="kernels-int8", **common))
    own = generations(Engine(mode="cloud", cloud=pair["cloud"], cloud_runtime="kernels-int8", dtype="float32",
                             decode=DECODE, **QUIET))
    assert [g.tokens for g in split] == [g.tokens for g in local] == [g.tokens for g in own]
    if "by_cost" not in options:
        assert [decisions(g) for g in split] == [decisions(g) for g in local]
    assert sum(g.counters.num_accepted_tokens for g in split) > 0


def test_a_server_that_verifies_chains_says_so_and_refuses_a_tree_in_one_line(pair, tmp_path):
    # a cloud of sliding-window layers (Gemma3) verifies chains only: its attention builds its own masks
    chains_only = _gemma3_like_the_cloud(pair["cloud"], tmp_path / "gemma3")
    with BackgroundServer(load_model(chains_only, "float32", runtime="torch", **QUIET)) as url:
        engine = Engine(mode="spec", edge=pair["edge"], cloud_url=url, dtype="float32", spec=lookup(4),
                        decode=DECODE, **QUIET)
        try:
            with pytest.raises(ConfigError, match="verifies only as chains") as refused:
                engine.generate(TEXTS[0])
            assert "\n" not in str(refused.value)
        finally:
            engine.close()
        cloud = RemoteCloud(url)
        try:
            cloud.connect()
            assert cloud.accepts_trees is False
            ids = torch.tensor([20, 21, 22, 20, 21])
            session = cloud.open(_prompt(ids), lookup(4), DECODE, _no_constraints(), cloud.vocab_size,
                                 torch.Generator())
            tree = TokenTree.from_branches([[22, 23], [24]], budget=4)
            with pytest.raises(CloudLost, match="refused: verify: this session verifies chains only") as lost:
                session.send(AcceptedSequence(ids, 8), tree.tokens, None, tree)
                session.receive()
            assert "\n" not in str(lost.value)
        finally:
            cloud.close()


def test_the_client_keeps_only_a_path_down_the_tree_it_sent():
    tree = TokenTree.from_branches([[5, 6, 7], [5, 9], [8]], budget=5)  # nodes 0:5 1:6 2:7 3:9 4:8
    reply = dict(token=1, tokens_in=5, compute_s=0.0, queue_s=0.0)
    assert kept_path(tree, VerdictReply(accepted=2, path=[0, 3], **reply)) == (0, 3)
    assert kept_path(tree, VerdictReply(accepted=0, path=[], **reply)) == ()
    for accepted, path, why in ((2, None, "must list the 2 kept nodes"), (2, [0], "must list the 2 kept nodes"),
                                (2, [0, 4], "is no path from the root"), (1, [1], "is no path from the root"),
                                (1, [9], "is no path from the root")):
        with pytest.raises(ProtocolError, match=why):
            kept_path(tree, VerdictReply(accepted=accepted, path=path, **reply))


def _gemma3_like_the_cloud(cloud: str, path) -> str:
    """A tiny random Gemma3 (a sliding-window layer, then a full one) with the pair cloud's vocabulary and tokenizer,
    saved at `path`."""
    from transformers import AutoTokenizer, Gemma3ForCausalLM, Gemma3TextConfig

    from tests.tiny import COMMON

    tokenizer = AutoTokenizer.from_pretrained(cloud)
    config = Gemma3TextConfig(**{**COMMON, "vocab_size": 64, "eos_token_id": tokenizer.eos_token_id}, head_dim=16,
                              sliding_window=4, layer_types=["sliding_attention", "full_attention"])
    Gemma3ForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def _prompt(ids: torch.Tensor):
    from specdec.backends.prompt import Prompt

    return Prompt(ids)


def _no_constraints():
    from specdec.core.processors import Constraints

    return Constraints()
