"""bench/measure/drift.py on the tiny cloud: float32 against itself moves nothing (the measure has no offset of its
own), and a quantized runtime's drift is counted where it parts."""
from __future__ import annotations

import argparse
import json

import pytest

from bench.measure.drift import main, measure
from specdec.kernels import missing_flags


def test_the_reference_against_itself_drifts_by_nothing(pair, prompts):
    found = measure(argparse.Namespace(model=pair["cloud"], runtimes="torch", prompts=prompts, limit=2, tokens=8,
                                       threads=1))
    entry = found["runtimes"]["torch"]
    assert entry["max_abs_diff_over_max_logit"] == 0 and entry["argmax_agree"] == entry["rows"] == 16
    assert entry["common_prefix_tokens"] == [8, 8]


@pytest.mark.skipif(bool(missing_flags()), reason=" ".join(missing_flags()))
def test_a_quantized_runtimes_drift_is_written(pair, prompts, tmp_path):
    out = tmp_path / "drift.json"
    assert main(["--model", pair["cloud"], "--runtimes", "kernels-int4", "--prompts", prompts, "--limit", "2",
                 "--tokens", "8", "--threads", "1", "--out", str(out)]) == 0
    entry = json.loads(out.read_text())["runtimes"]["kernels-int4"]
    assert 0 < entry["max_abs_diff_over_max_logit"] < 1 and 0 < entry["argmax_agree"] <= entry["rows"] == 16
    assert all(0 <= n <= 8 for n in entry["common_prefix_tokens"])
