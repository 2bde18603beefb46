"""Cloud NLL of outputs (bench/measure/nll.py, `specbench score`): the value is the model's own
log-likelihood, scoring is resumable, and summaries and reports carry it."""
import json
import math

import pytest
import torch

from bench.cli import main
from bench.core.records import ResultsFile
from bench.derive.scores import SCORE_FIELDS, SCORES, read_scores, score_key
from bench.derive.summary import summarize
from bench.measure.nll import output_nll
from specdec.models.loading import load_model

pytestmark = pytest.mark.subprocess  # see CONTRIBUTING.md: the quick loop leaves these out


@pytest.fixture(scope="module")
def swept(pair, tmp_path_factory):
    root = tmp_path_factory.mktemp("sweep")
    prompts = root / "p.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "prompt": t}) + "\n" for i, t in enumerate(["hello world", "say yes"])))
    out = root / "s"
    assert main(["sweep", "--edge", pair["edge"], "--cloud", pair["cloud"], "--prompts", str(prompts), "--out", str(out),
                 "--max-new-tokens", "8", "--dtype", "float32", "--mode", "cloud,edge,spec", "--k", "3",
                 "--entropy-threshold", "0", "--policy", "greedy"]) == 0
    return out


def test_output_nll_is_the_models_own_mean_negative_log_likelihood(pair):
    cloud = load_model(pair["cloud"], "float32", log=lambda m: None)
    prompt = cloud.encode("hello world")
    tokens = [5, 17, 42, 9]
    with torch.inference_mode():
        logits = cloud.backend.model(torch.cat([prompt.input_ids, torch.tensor(tokens)]).unsqueeze(0)).logits[0]
    P = prompt.input_ids.numel()
    expected = -sum(torch.log_softmax(logits[P - 1 + i].float(), -1)[t] for i, t in enumerate(tokens)) / len(tokens)
    assert output_nll(cloud, prompt, tokens) == pytest.approx(float(expected), abs=1e-5)
    assert math.isnan(output_nll(cloud, prompt, []))


def test_score_is_resumable_and_reaches_summary_and_report(swept, tmp_path, capsys):
    import pandas as pd

    assert pd.read_csv(swept / "summary.csv")["cloud_nll"].isna().all()  # not scored yet
    assert main(["score", str(swept)]) == 0  # scorer: the sweep's cloud, found in the results
    assert pd.read_csv(swept / "summary.csv")["cloud_nll"].notna().all()  # the sweep's summary, rewritten
    scores = ResultsFile(swept / SCORES, SCORE_FIELDS).read()
    rows = ResultsFile(swept / "results.jsonl").read()
    assert {s["key"] for s in scores} == {score_key(r) for r in rows} and len(scores) == len(rows) == 6
    assert all(s["cloud_nll"] > 0 for s in scores)
    by_key = read_scores(swept)
    cloud_rows = [r for r in rows if r["mode"] == "cloud"]
    spec_rows = [r for r in rows if r["mode"] == "spec"]
    # greedy spec at threshold 0 writes the cloud's own text, so it scores the same
    for c in cloud_rows:
        s = next(r for r in spec_rows if r["id"] == c["id"])
        assert by_key[score_key(s)] == pytest.approx(by_key[score_key(c)])
    assert main(["score", str(swept)]) == 0  # rerun: nothing rescored
    assert len(ResultsFile(swept / SCORES, SCORE_FIELDS).read()) == 6
    assert "scored 0 outputs (6 already scored" in capsys.readouterr().err
    summary = summarize(rows, by_key).set_index("mode")
    assert summary.loc["cloud", "cloud_nll"] == pytest.approx(sum(by_key[score_key(r)] for r in cloud_rows) / 2)
    assert math.isnan(summarize(rows).set_index("mode").loc["cloud", "cloud_nll"])  # not scored: NaN
    assert main(["report", str(swept), "--out", str(tmp_path / "r")]) == 0
    assert "cloud NLL nats/token" in (tmp_path / "r" / "index.html").read_text()


def test_score_bad_inputs(pair, swept, tmp_path, capsys):
    assert main(["score", str(tmp_path / "missing")]) == 2
    assert "results.jsonl not found" in capsys.readouterr().err
    assert main(["score", str(swept), "--dtype", "bfloat16"]) == 2  # another scorer's file is there
    assert "delete it to rescore" in capsys.readouterr().err


def test_edge_only_results_need_an_explicit_scorer(tmp_path, capsys):
    ResultsFile(tmp_path / "results.jsonl").append({"id": "p0", "mode": "edge", "edge": "e", "cloud": None,
                                                    "prompts": "code", "status": "ok", "text": "x"})
    assert main(["score", str(tmp_path)]) == 2
    assert "pass --model MODEL" in capsys.readouterr().err
