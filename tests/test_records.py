"""The raw record's JSON object is the one results.jsonl has always held: built by `ResultRecord`, its
keys and their order unchanged, for an in-process point and a split one (whose split-only fields are
set and which carries `prompt_ids`)."""
import json
from dataclasses import asdict
from pathlib import Path

from bench.core.point import Point
from bench.core.records import parse_records, result_record
from specdec.core.trace import Counters, Cycle, Generation

# Times are binary fractions, so every derived number below is exact.
CORRECTED = Cycle(draft_tokens=[5, 6], entropies_nats=[0.5, 1.5], escalated=True, accepted=1, extra_token=7,
                  extra_kind="correction", edge_s=0.25, cloud_s=0.5, cloud_tokens_in=12)
UNVERIFIED = Cycle(draft_tokens=[8], entropies_nats=[0.25], escalated=False, accepted=1, edge_s=0.125)
BONUS = Cycle(draft_tokens=[9, 10], entropies_nats=[0.5, 0.5], escalated=True, accepted=2, extra_token=11,
              extra_kind="bonus", edge_s=0.25, cloud_s=0.25, cloud_tokens_in=3)
POINT = Point(mode="spec", edge="e", cloud="c", dtype="float32", edge_runtime="torch", cloud_runtime="torch",
              constraints="none", chat_template=True, deployment="inproc", k=2, entropy_threshold=1.0,
              accept_threshold=0.1, policy="greedy", verifier="cached", uncertainty="max", draft_stop="none",
              k_schedule="constant", max_new_tokens=8, temperature=0.0, seed=0, prompts="code")


def generation(cycles: list[Cycle], **timings) -> Generation:
    tokens = [t for c in cycles for t in c.draft_tokens[: c.accepted] + ([c.extra_token] if c.extra_kind else [])]
    return Generation(tokens=tokens, counters=Counters.of(cycles, k=2), cycles=cycles, text="a,bc", prompt_tokens=3,
                      prompt_ids=[1, 2, 3], stopped_by="max_new_tokens", **timings)


def test_an_in_process_record_has_the_keys_it_always_had_in_their_order():
    point = POINT.record()  # a run's point: no link
    record = result_record(generation([CORRECTED, UNVERIFIED], prefill_s=0.5, ttft_s=0.75, decode_s=1.5, edge_s=0.5,
                                      cloud_s=0.5), point, "p0", 1.625, 1000)
    expected = {
        "id": "p0", **point,
        "status": "ok", "tokens": [5, 7, 8], "text": "a,bc", "new_tokens": 3, "prompt_tokens": 3,
        "latency_s": 1.625, "ttft_s": 0.75, "tpot_s": 0.375, "tokens_per_s": 2.0, "prefill_s": 0.5, "edge_s": 0.5,
        "cloud_s": 0.5, "overhead_s": 0.5, "stopped_by": "max_new_tokens",
        "cycles": 2, "cloud_calls": 1, "num_drafts": 1, "num_draft_tokens": 2, "num_accepted_tokens": 1,
        "accepted_per_position": [1, 0], "unverified_tokens": 1, "corrections": 1, "bonus_tokens": 0,
        "overlap_kept_tokens": 0, "overlap_wasted_tokens": 0, "acceptance_rate": 0.5,
        "punct_density": 0.25, "peak_rss_bytes": 1000,
        "wire_up_bytes": None, "wire_down_bytes": None, "link_s": None, "server_queue_s": None,
        "server_compute_s": None, "edge_wait_s": None,
        "block_len_mean": 1.5, "block_len_hist": [1, 1],
        "trace": [asdict(CORRECTED), asdict(UNVERIFIED)],
    }
    assert list(point)[:3] == ["mode", "edge", "cloud"] and "link" not in point
    assert list(record) == list(expected)
    assert record == expected


def test_a_split_record_fills_the_split_fields_and_ends_with_the_prompt_ids():
    sent = [Cycle(**{**asdict(CORRECTED), "wire_up_bytes": 300, "wire_down_bytes": 40, "wait_s": 1.0,
                     "server_queue_s": 0.125, "edge_wait_s": 0.0625}),
            UNVERIFIED,
            Cycle(**{**asdict(BONUS), "wire_up_bytes": 200, "wire_down_bytes": 30, "wait_s": 0.5})]
    # a sweep's split point: the link and overlap, and what the sweep records beside the point
    point = {**Point(**{**asdict(POINT), "deployment": "split", "link": "4g", "overlap": True}).record(sweep=True),
             "network": "4g", "repeat": 1}
    record = result_record(generation(sent, prefill_s=0.5, ttft_s=0.75, decode_s=3.0, edge_s=1.0, cloud_s=0.75),
                           point, "p1", 3.25, 2000)
    expected = {
        "id": "p1", **point,
        "status": "ok", "tokens": [5, 7, 8, 9, 10, 11], "text": "a,bc", "new_tokens": 6, "prompt_tokens": 3,
        "latency_s": 3.25, "ttft_s": 0.75, "tpot_s": 0.45, "tokens_per_s": 2.0, "prefill_s": 0.5, "edge_s": 1.0,
        "cloud_s": 0.75, "overhead_s": 1.25, "stopped_by": "max_new_tokens",
        "cycles": 3, "cloud_calls": 2, "num_drafts": 2, "num_draft_tokens": 4, "num_accepted_tokens": 3,
        "accepted_per_position": [2, 1], "unverified_tokens": 1, "corrections": 1, "bonus_tokens": 1,
        "overlap_kept_tokens": 0, "overlap_wasted_tokens": 0, "acceptance_rate": 0.75,
        "punct_density": 0.25, "peak_rss_bytes": 2000,
        # waits minus the server's time: (1 - 0.5 - 0.125) + (0.5 - 0.25)
        "wire_up_bytes": 500, "wire_down_bytes": 70, "link_s": 0.625, "server_queue_s": 0.125,
        "server_compute_s": 0.75, "edge_wait_s": 0.0625,
        "block_len_mean": 5 / 3, "block_len_hist": [1, 2],
        "trace": [asdict(c) for c in sent],
        "prompt_ids": [1, 2, 3],
    }
    assert point["link"] == "4g" and point["overlap"] is True
    assert list(record) == list(expected)
    assert record == expected
    line = json.dumps(record, ensure_ascii=False).encode() + b"\n"
    assert parse_records(line, Path("results.jsonl")) == [record]  # readers read it back as it was written


def test_a_lost_cloud_is_recorded_degraded():
    degraded = Generation(tokens=[5], counters=Counters(cycles=1), cycles=[], degraded=True, decode_s=0.5)
    record = result_record(degraded, POINT.record(), "p2", 0.5, 1)
    assert record["status"] == "degraded" and record["tpot_s"] is None and record["block_len_mean"] is None
    assert record["block_len_hist"] == [] and "prompt_ids" not in record
