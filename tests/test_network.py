"""The network model: presets, custom specs and their errors, and exact byte/latency arithmetic on
hand-built traces, cached (audio features on the first call) vs stateless (on every call)."""
from __future__ import annotations

import math
from dataclasses import asdict

import pytest

from bench.cli import main
from bench.core.network import (
    HEADER_BYTES,
    PRESETS,
    NetworkCost,
    NetworkProfile,
    escalation_bytes,
    network_cost,
    network_latency_s,
    profile,
)
from specdec import DecodeConfig, Prompt, SpecConfig, speculative_decode
from specdec.backends.hf_causal import HFCausalBackend
from specdec.errors import ConfigError
from tests.tiny import noisy_copy, random_prompt, tiny_causal

FEATURES = 16_000  # bytes of audio features
# 8 Mbit/s up = 1e6 B/s, 80 Mbit/s down = 1e7 B/s: byte counts read directly as microseconds.
NET = "rtt=40ms,up=8mbit,down=80mbit"


def cycle(escalated=True, accepted=4, extra_kind=None, cloud_tokens_in=0, sent_features=False, k=4):
    return {
        "escalated": escalated, "accepted": accepted, "extra_kind": extra_kind,
        "cloud_tokens_in": cloud_tokens_in, "sent_features": sent_features, "draft_tokens": list(range(k)),
    }


# A cached session: features on the first call only; unseen accepted tokens ride along lazily.
CACHED = [
    cycle(accepted=3, extra_kind="correction", cloud_tokens_in=5, sent_features=True),  # 1 unseen + 4 draft
    cycle(escalated=False),  # accepted on the edge: no call
    cycle(accepted=4, extra_kind="bonus", cloud_tokens_in=9),  # correction + 4 unverified + 4 draft
    cycle(accepted=4, extra_kind=None, cloud_tokens_in=5),  # last block: no room for a bonus
]


def test_presets():
    assert set(PRESETS) == {"none", "wifi", "4g", "5g"}
    assert profile("4G") is PRESETS["4g"] and profile(" wifi ") is PRESETS["wifi"]
    for name, net in PRESETS.items():
        assert net.name == name and net.rtt_s >= 0 and net.uplink_bps > 0 and net.downlink_bps > 0
    # slower uplink than downlink everywhere, and 4G is the slowest link
    assert all(net.uplink_bps <= net.downlink_bps for net in PRESETS.values())
    assert PRESETS["4g"].rtt_s == max(net.rtt_s for net in PRESETS.values())


def test_custom_spec():
    net = profile(NET)
    assert (net.name, net.rtt_s, net.uplink_bps, net.downlink_bps) == (NET, 0.040, 8e6, 80e6)
    net = profile("down=1gbit/s, UP=500kbit, rtt=0.1s")
    assert (net.rtt_s, net.uplink_bps, net.downlink_bps) == (0.1, 5e5, 1e9)
    assert profile("rtt=0ms,up=1.5mbit,down=2e1mbit").downlink_bps == 20e6


@pytest.mark.parametrize(
    "spec, message",
    [
        ("lte", r"unknown network 'lte': use one of none, wifi, 4g, 5g, or write e\.g\. 'rtt=40ms"),
        ("rtt=40ms,up=10mbit", r"missing down;"),
        ("rtt=40ms,up=10mbit,down=50mbit,jitter=5ms", r"bad field 'jitter=5ms', keys are rtt, up, down"),
        ("rtt=40ms,up=10mbit,down=50mbit,rtt=1ms", r"rtt given twice"),
        ("rtt=40,up=10mbit,down=50mbit", r"bad rtt value '40', need a number with a unit in ms\|s"),
        ("rtt=40ms,up=10mb,down=50mbit", r"bad up value '10mb', need a number with a unit in kbit\|mbit\|gbit"),
        ("rtt=40ms,up=-1mbit,down=50mbit", r"bad up value '-1mbit'"),
        ("rtt=40ms,up=0mbit,down=50mbit", r"uplink_bps must be > 0"),
        ("rtt=40ms,up,down=50mbit", r"bad field 'up'"),
        ("rtt=1e9s,up=10mbit,down=50mbit", r"an rtt of 1e\+09 s is beyond any network \(at most 60 s"),
        ("rtt=40ms,up=1e-30mbit,down=50mbit", r"uplink_bps 1e-24 bit/s is below any network"),
    ],
)
def test_bad_specs(spec, message):
    with pytest.raises(ConfigError, match=message) as error:
        profile(spec)
    assert "\n" not in str(error.value)


def test_profile_validates_itself():
    with pytest.raises(ConfigError, match=r"network 'x': rtt_s must be a finite number >= 0, got -0.1"):
        NetworkProfile("x", -0.1, 1e6, 1e6)
    with pytest.raises(ConfigError, match=r"downlink_bps must be > 0 \(math.inf for free\), got nan"):
        NetworkProfile("x", 0.0, 1e6, math.nan)


def test_escalation_bytes():
    assert escalation_bytes(5, 0, 2) == (5 * 4 + HEADER_BYTES, 2 * 4 + HEADER_BYTES)
    assert escalation_bytes(5, FEATURES, 1) == (20 + FEATURES + HEADER_BYTES, 4 + HEADER_BYTES)
    assert escalation_bytes(3, 0, 1, bytes_per_token=2) == (6 + HEADER_BYTES, 2 + HEADER_BYTES)
    with pytest.raises(ConfigError, match=r"counts must be >= 0.*tokens_in=-1"):
        escalation_bytes(-1, 0, 1)


def test_cached_trace_arithmetic():
    cost = network_cost(CACHED, profile(NET), FEATURES)
    # uplink 4 B/id: 5*4 + 16000 + 64, 9*4 + 64, 5*4 + 64; downlink: count (+ extra id) + 64
    assert cost == NetworkCost(latency_s=pytest.approx(0.1362892), uplink_bytes=16_268, downlink_bytes=212, calls=3)
    # 3 RTTs + 16268 B at 1e6 B/s + 212 B at 1e7 B/s
    assert cost.latency_s == pytest.approx(3 * 0.040 + 16_268 / 1e6 + 212 / 1e7, rel=1e-12)
    assert network_latency_s(CACHED, profile(NET), FEATURES) == cost.latency_s


def test_stateless_sends_features_every_call():
    # the stateless verifier resends context + draft and the features on every call
    stateless = [
        cycle(accepted=3, extra_kind="correction", cloud_tokens_in=20, sent_features=True),  # 16 ctx + 4 draft
        cycle(escalated=False),
        cycle(accepted=4, extra_kind="bonus", cloud_tokens_in=28, sent_features=True),
        cycle(accepted=4, extra_kind=None, cloud_tokens_in=33, sent_features=True),
    ]
    net = profile(NET)
    cached, full = network_cost(CACHED, net, FEATURES), network_cost(stateless, net, FEATURES)
    assert full.uplink_bytes == 3 * FEATURES + (20 + 28 + 33) * 4 + 3 * HEADER_BYTES
    assert full.uplink_bytes - cached.uplink_bytes == 2 * FEATURES + (81 - 19) * 4
    assert full.downlink_bytes == cached.downlink_bytes and full.calls == cached.calls == 3
    assert full.latency_s - cached.latency_s == pytest.approx((2 * FEATURES + 62 * 4) / 1e6)


def test_none_is_free_and_edge_only_costs_nothing():
    cost = network_cost(CACHED, profile("none"), FEATURES)
    assert cost.latency_s == 0.0 and cost.calls == 3 and cost.uplink_bytes == 16_268  # bytes still count
    assert network_cost([cycle(escalated=False)] * 3, PRESETS["4g"], FEATURES) == NetworkCost(0.0, 0, 0, 0)
    assert network_cost([], PRESETS["5g"], FEATURES).calls == 0


def test_real_trace_from_the_engine():
    cloud = tiny_causal("llama", sharpness=30.0)
    edge = HFCausalBackend(noisy_copy(cloud, 0.3))
    generation = speculative_decode(
        edge, HFCausalBackend(cloud), Prompt(random_prompt(0)), SpecConfig(k=4, entropy_threshold=1.2),
        DecodeConfig(max_new_tokens=19),
    )
    trace = [asdict(c) for c in generation.cycles]  # as written to results.jsonl
    net = PRESETS["4g"]
    cost = network_cost(trace, net, features_bytes=0)
    calls = generation.counters.cloud_calls
    assert cost.calls == calls
    assert cost.uplink_bytes == sum(4 * c.cloud_tokens_in for c in generation.cycles if c.escalated) + calls * HEADER_BYTES
    assert cost.latency_s >= calls * net.rtt_s


def test_a_link_beyond_physical_sense_is_one_line(capsys):
    for flags in (["--rtt", "1e9s", "--up", "10mbit", "--down", "10mbit"],
                  ["--rtt", "40ms", "--up", "1e-30mbit", "--down", "10mbit"]):
        assert main(["link", "--to", "127.0.0.1:9", *flags]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("error: network")
        assert "beyond any network" in err or "below any network" in err
