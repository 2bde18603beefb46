"""The cloud as one generation sees it (`specdec.core.cloud.CloudLink`): the session opens on the first
escalation only, a lost cloud fails the generation or (`EdgeFallbackLink`, on_cloud_loss "edge") turns
it edge-only for good, and the session is closed either way. A scripted cloud stands in for the server."""
from __future__ import annotations

import pytest
import torch

from specdec.core.cloud import CloudLink, EdgeFallbackLink, open_link
from specdec.core.verdict import CloudLost, Verdict

BLOCK = torch.tensor([1, 2, 3])


class ScriptedSession:
    round_trip_s = None
    compute_s = 0.25

    def __init__(self, lost: bool = False) -> None:
        self.closed, self.lost, self.calls = False, lost, 0

    def verify(self, seq, draft_tokens, draft_probs) -> Verdict:
        if self.lost:
            raise CloudLost("the cloud verifier at 127.0.0.1:1 closed the connection: connection lost")
        self.calls += 1
        return Verdict(accepted=self.calls - 1, next_token=7, tokens_in=3, sent_features=False)

    def close(self) -> None:
        self.closed = True


class ScriptedCloud:
    vocab_size, accepts_audio = 64, False

    def __init__(self, lost: bool = False) -> None:
        self.sessions: list[ScriptedSession] = []
        self.lost = lost

    def open(self, *opening) -> ScriptedSession:
        assert opening == ("prompt", "spec")
        self.sessions.append(ScriptedSession(self.lost))
        return self.sessions[-1]


def test_the_session_opens_on_the_first_verify_only_and_closes_at_the_end():
    cloud = ScriptedCloud()
    link = CloudLink(cloud, ("prompt", "spec"))
    assert cloud.sessions == [] and link.compute_s == 0.0  # no escalation, no cost to the cloud
    verdicts = [link.send(None, BLOCK, None).verdict() for _ in range(3)]
    assert [v.accepted for v in verdicts] == [0, 1, 2] and len(cloud.sessions) == 1
    assert all(0 < v.sent_at <= v.read_at for v in verdicts)  # the link stamps when it sent and read
    assert link.compute_s == 0.25
    assert not cloud.sessions[0].closed
    link.close()
    assert cloud.sessions[0].closed and link.session is None


def test_a_lost_cloud_turns_the_generation_edge_only_for_good():
    cloud = ScriptedCloud(lost=True)
    link = open_link(cloud, ("prompt", "spec"), on_loss="edge")
    assert isinstance(link, EdgeFallbackLink)
    assert link.send(None, BLOCK, None).verdict() is None and link.lost and link.session is None
    assert link.send(None, BLOCK, None).verdict() is None  # no more calls once lost
    assert len(cloud.sessions) == 1 and cloud.sessions[0].closed


def test_a_lost_cloud_fails_the_generation_by_default():
    cloud = ScriptedCloud(lost=True)
    link = open_link(cloud, ("prompt", "spec"))
    with pytest.raises(CloudLost, match="closed the connection"):
        link.send(None, BLOCK, None)
    assert not link.lost
    link.close()  # what speculative_decode's `finally` does
    assert cloud.sessions[0].closed and link.session is None
