"""`overlap = "auto"`'s rule (specdec/core/overlap.py) on synthetic cycle numbers, answers computed by hand:
drafting ahead pays iff P(full accept) * P(guess right) * (forwards that fit in a round trip) * step
time exceeds the extra send -> verdict time measured while drafting ahead. No timing is measured here."""
from __future__ import annotations

import pytest

from specdec.core.overlap import PROBE, REPROBE, WARMUP, OverlapEvidence, OverlapGovernor, ahead_gain_s, draft_ahead_pays


def evidence(**changes) -> OverlapEvidence:
    # step 0.1 s, round trip 0.45 s: floor(4.5) - 1 = 3 forwards fit after the guess's own, k = 4 allows them
    values = dict(step_s=0.1, verify_s=0.45, verify_ahead_s=0.50, full_accept_rate=0.5, guess_rate=0.8, k=4)
    return OverlapEvidence(**{**values, **changes})


def test_gain_is_hit_probability_times_the_forwards_that_fit():
    assert ahead_gain_s(evidence()) == pytest.approx(0.5 * 0.8 * 3 * 0.1)  # 0.12 s
    assert ahead_gain_s(evidence(step_s=0.01, verify_s=1.0, k=2)) == pytest.approx(0.5 * 0.8 * 2 * 0.01)  # k caps it
    assert ahead_gain_s(evidence(verify_s=0.15)) == 0.0  # floor(1.5) - 1 = 0: only the guess fits
    assert ahead_gain_s(evidence(full_accept_rate=None)) == 0.0


@pytest.mark.parametrize("changes, pays", [
    ({}, True),  # gain 0.12 s > cost 0.50 - 0.45 = 0.05 s (disjoint cores: drafting ahead barely slows the verify)
    ({"verify_ahead_s": 0.70}, False),  # cost 0.25 s > 0.12 s (shared cores: the edge slows the server)
    ({"verify_ahead_s": 0.40}, True),  # faster while drafting ahead (noise): cost 0, gain 0.12 s
    ({"verify_s": 0.15, "verify_ahead_s": 0.15}, False),  # nothing fits: gain 0 is no gain
    ({"full_accept_rate": 0.1, "guess_rate": 0.5}, False),  # 0.1 * 0.5 * 3 * 0.1 = 0.015 s < 0.05 s
    ({"verify_ahead_s": None}, None),  # the cost is not measured yet
    ({"step_s": None}, None),
])
def test_draft_ahead_pays_on_hand_checked_cycles(changes, pays):
    assert draft_ahead_pays(evidence(**changes)) is pays


def test_the_governor_warms_up_sequential_probes_ahead_then_follows_the_rule():
    governor = OverlapGovernor(k=4)
    ways = []
    for _ in range(WARMUP):  # sequential cycles: step 0.1 s, round trip 0.45 s, blocks accepted whole half the time
        ways.append(governor.choose())
        governor.observe(False, 0.45, 0.1, 4, 4 if len(ways) % 2 else 2, None, None)
    for _ in range(PROBE):  # drafting ahead: the verdict read 0.25 s later (an oversubscribed machine)
        ways.append(governor.choose())
        governor.observe(True, 0.70, 0.1, 4, 4, guess=7, bonus=7)
    assert ways == [False] * WARMUP + [True] * PROBE
    e = governor.evidence()
    # 1 whole block of 2 sequential + 2 of 2 ahead: 3/4; both guesses right: 1.0; means 0.45 s and 0.70 s
    assert (e.full_accept_rate, e.guess_rate, e.verify_s, e.verify_ahead_s) == (0.75, 1.0, 0.45, 0.70)
    # gain 0.75 * 1.0 * 3 * 0.1 = 0.225 s < cost 0.25 s: sequential, except one re-probe in REPROBE cycles
    decided = [governor.choose() for _ in range(REPROBE)]
    assert decided == [False] * (REPROBE - 1) + [True]


def test_untimed_cycles_count_for_acceptance_only():
    governor = OverlapGovernor(k=2)
    governor.observe(False, None, 0.1, 2, 1, None, None)  # the call that opened the server's session
    e = governor.evidence()
    assert e.verify_s is None and e.full_accept_rate == 0.0 and e.guess_rate == 0.5
    assert governor.choose() is False  # still warming up
