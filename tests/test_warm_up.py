"""A sweep's first generation of each kind of engine is preceded by an untimed one (first-call costs
are not the model's speed) that changes nothing about the timed generation (tiny models, fp32)."""
import pytest

from bench.core.prompts import PromptRecord
from bench.core.records import ResultsFile
from bench.measure.run import warm_up
from bench.measure.tinypair import PROMPTS
from specdec.core.config import DecodeConfig, SpecConfig
from specdec.engine import Engine


def engine(pair, **deploy):
    return Engine(mode="spec", edge=pair["edge"], cloud=pair["cloud"], dtype="float32",
                  spec=SpecConfig(k=3, entropy_threshold=0, policy="greedy"), decode=DecodeConfig(max_new_tokens=10),
                  log=lambda message: None)


def test_warm_up_leaves_the_timed_generation_as_a_fresh_engine_makes_it(pair):
    record = PromptRecord(id="p0", prompt=PROMPTS[0])
    fresh = engine(pair).generate(record.prompt).tokens
    warmed = engine(pair)
    warm_up(warmed, PromptRecord(id="p1", prompt=PROMPTS[1]))
    warmed._governor()  # what an overlap-"auto" engine carries between generations ...
    warmed.forget_history()  # ... is dropped, as warm_up does
    assert "overlap" not in warmed._derived
    assert warmed.generate(record.prompt).tokens == fresh


@pytest.mark.subprocess  # a sweep's workers
def test_a_sweep_warms_each_kind_of_engine_once_and_records_only_timed_generations(pair, prompts, tmp_path):
    from bench.cli import main
    out = tmp_path / "r"
    assert main(["sweep", "--edge", pair["edge"], "--cloud", pair["cloud"], "--prompts", prompts, "--out", str(out),
                 "--max-new-tokens", "6", "--dtype", "float32", "--mode", "cloud,edge,spec", "--k", "1,2"]) == 0
    rows = ResultsFile(out / "results.jsonl").read()
    assert len(rows) == 4 * 3  # 4 points x 3 prompts: the warm-ups left no record
    assert all(r["status"] == "ok" for r in rows)
    warmed = [r for r in rows if "warm_up_s" in r]
    assert sorted(r["mode"] for r in warmed) == ["cloud", "edge", "spec"]  # k is not a kind: same models, same place
    for r in warmed:  # on the first timed generation of its kind
        assert r is next(x for x in rows if x["mode"] == r["mode"]) and r["warm_up_s"] > 0
