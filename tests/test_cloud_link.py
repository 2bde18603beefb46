"""The cloud as one generation sees it (`specdec.cloud.CloudLink`): the session opens on the first
escalation only, a lost cloud fails the generation or (on_loss "edge") turns it edge-only for good,
and the session is closed either way. A scripted cloud stands in for the server."""
from __future__ import annotations

import pytest

from specdec.cloud import CloudLink, CloudLost, Verdict


class ScriptedSession:
    round_trip_s = None
    compute_s = 0.25

    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True


class ScriptedCloud:
    vocab_size, accepts_audio = 64, False

    def __init__(self) -> None:
        self.sessions: list[ScriptedSession] = []

    def open(self, *opening) -> ScriptedSession:
        assert opening == ("prompt", "spec")
        self.sessions.append(ScriptedSession())
        return self.sessions[-1]


def lose(session: ScriptedSession) -> Verdict:
    raise CloudLost("the cloud verifier at 127.0.0.1:1 closed the connection: connection lost")


def test_the_session_opens_on_the_first_verify_only_and_closes_at_the_end():
    cloud = ScriptedCloud()
    link = CloudLink(cloud, ("prompt", "spec"))
    assert cloud.sessions == [] and link.compute_s == 0.0  # no escalation, no cost to the cloud
    verdicts = [link.verify(lambda session: Verdict(accepted=i, next_token=7, tokens_in=3, sent_features=False))
                for i in range(3)]
    assert [v.accepted for v in verdicts] == [0, 1, 2] and len(cloud.sessions) == 1
    assert link.compute_s == 0.25
    assert not cloud.sessions[0].closed
    link.close()
    assert cloud.sessions[0].closed and link.session is None


def test_a_lost_cloud_turns_the_generation_edge_only_for_good():
    cloud = ScriptedCloud()
    link = CloudLink(cloud, ("prompt", "spec"), on_loss="edge")
    assert link.verify(lose) is None and link.lost and link.session is None
    calls = []
    assert link.verify(lambda session: calls.append(session)) is None  # no more calls once lost
    assert calls == [] and len(cloud.sessions) == 1 and cloud.sessions[0].closed


def test_a_lost_cloud_fails_the_generation_by_default():
    cloud = ScriptedCloud()
    link = CloudLink(cloud, ("prompt", "spec"))
    with pytest.raises(CloudLost, match="closed the connection"):
        link.verify(lose)
    assert not link.lost
    link.close()  # what speculative_decode's `finally` does
    assert cloud.sessions[0].closed and link.session is None
