"""`specbench report`: exact Pareto fronts, recommendations and per-position acceptance on
synthetic results; a report from a tiny sweep, opened in real headless Chromium; bad inputs."""
import argparse
import html
import json
import math
import re
import shutil
import subprocess
from pathlib import Path

import markupsafe
import numpy as np
import pandas as pd
import pytest

from bench.cli import main
from bench.commands.report import add_report_parser
from bench.derive.summary import load_rows, summarize
from bench.read.report import build_report
from bench.read.report.inputs import load_inputs
from bench.read.report.pareto import FRONTS, front_members, pareto_mask, point_labels
from bench.read.report.recommend import recommend
from bench.read.report.views import per_position_acceptance, sample_points, split_notes
from specdec.errors import InputError
from tests.tiny import save_tiny_pair

ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"
CLOUD_TEXT = "the cat, the dog, and the bird sat."  # 3 marks in 35 characters: inside the 10-25 % band
EDGE_TEXT = "dog dog dog dog dog dog"


def row(mode="spec", prompt="p0", prompts="s1", k=4, thr=0.0, policy="greedy", text=CLOUD_TEXT, latency_s=1.0,
        network_s=0.0, new_tokens=10, drafted=0, accepted=0, per_position=None, drafts=0, calls=0, cycles=4, **extra):
    spec = mode == "spec"
    return {
        "id": prompt, "mode": mode, "dtype": "float32", "prompts": prompts, "policy": policy if spec else None,
        "k": k if spec else None, "entropy_threshold": thr if spec else None, "accept_threshold": 0.1 if spec else None,
        "verifier": "cached" if spec else None, "status": "ok", "tokens": list(range(new_tokens)), "text": text,
        "new_tokens": new_tokens, "latency_s": latency_s, "latency_with_network_s": latency_s + network_s,
        "ttft_s": 0.1, "tpot_s": 0.01, "edge_s": 0.0, "cloud_s": 0.0, "overhead_s": 0.0, "cycles": cycles,
        "cloud_calls": calls, "num_drafts": drafts, "num_draft_tokens": drafted, "num_accepted_tokens": accepted,
        "accepted_per_position": per_position or ([0] * k if spec else []), "uplink_bytes": 100 * calls,
        "peak_rss_bytes": 1 << 30, **extra,
    }


def synthetic_rows() -> list[dict]:
    """Set s1: baselines and three spec points, two prompts each. Set s2: spec only."""
    rows = []
    for prompt in ("p0", "p1"):
        rows += [
            row("cloud", prompt, latency_s=1.0),  # 10 tok/s
            row("edge", prompt, text=EDGE_TEXT, latency_s=0.2),  # 50 tok/s
            # (0, 4, greedy): 20 tok/s, acceptance 0.5, every block to the cloud, cheap network
            row(prompt=prompt, thr=0.0, latency_s=0.5, network_s=0.2, drafted=8, accepted=4, drafts=2, calls=2,
                cycles=2, per_position=[3, 1, 0, 0] if prompt == "p0" else [1, 1, 1, 0]),
            # (2, 4, greedy): 25 tok/s, acceptance 0.75, half the blocks, an expensive network
            row(prompt=prompt, thr=2.0, latency_s=0.4, network_s=0.9, drafted=4, accepted=3, drafts=1, calls=1,
                cycles=2, per_position=[1, 1, 1, 0]),
            # (inf, 4, greedy): the edge alone through the spec engine
            row(prompt=prompt, thr=math.inf, text=EDGE_TEXT, latency_s=0.25),
            row(prompt=prompt, prompts="s2", thr=1.0, latency_s=0.5, drafted=8, accepted=2, drafts=2, calls=2, cycles=2),
        ]
    return rows


@pytest.fixture(scope="module")
def summary():
    return summarize(synthetic_rows())


def label_of(summary, label):
    labels = point_labels(summary)
    return labels[labels == label].index[0]


# --- Pareto fronts -------------------------------------------------------------------------------

def test_pareto_mask_ties_dominance_and_nan():
    x = [1, 2, 3, 2, 4, np.nan, 1]
    y = [10, 20, 15, 20, 25, 30, 5]
    # (3,15) loses to (2,20); (1,5) loses to (1,10) on y alone; the two (2,20) tie and both stay.
    assert pareto_mask(x, y).tolist() == [True, True, False, True, True, False, False]
    # both lower-is-better: (1,5) now beats (1,10) and (2,*); the NaN point is never on the front.
    assert pareto_mask(x, y, True, True).tolist() == [False, False, False, False, False, False, True]
    # both higher-is-better
    assert pareto_mask(x, y, False, False).tolist() == [False, False, False, False, True, False, False]
    assert pareto_mask([], []).tolist() == []


def test_front_is_per_prompt_set_and_labels(summary):
    labels = point_labels(summary)
    assert set(labels) == {"cloud-only", "edge-only", "(0, 4, greedy)", "(2, 4, greedy)", "(inf, 4, greedy)",
                           "(1, 4, greedy)"}
    latency_chrf = next(f for f in FRONTS if f.name == "latency_chrf")
    members = front_members(summary, latency_chrf)
    # s1: edge-only is fastest (0.2 s) but far from the cloud; (2, 4, greedy) is the fastest at chrF 100.
    # (inf, 4, greedy) writes the edge's text more slowly than edge-only; cloud-only and (0, 4) are slower at 100.
    on_front = sorted(labels[members & (summary["prompts"] == "s1")])
    assert on_front == ["(2, 4, greedy)", "edge-only"]
    # s2 has no cloud-only point, so no chrF: nothing is on that front there.
    assert not members[summary["prompts"] == "s2"].any()
    calls = next(f for f in FRONTS if f.name == "calls_acceptance")
    # s2's only spec point is alone in its set, so it is on its front whatever s1 holds.
    assert sorted(labels[front_members(summary, calls)]) == ["(1, 4, greedy)", "(2, 4, greedy)"]


def test_labels_name_the_axes_that_vary():
    frame = pd.DataFrame({
        "mode": ["spec", "spec", "cloud"], "dtype": ["float32", "bfloat16", "float32"], "prompts": ["s"] * 3,
        "policy": ["greedy", "threshold", "-"], "k": [4.0, 2.0, "-"], "entropy_threshold": [0.5, math.inf, "-"],
        "accept_threshold": [0.1, 0.3, "-"], "verifier": ["cached", "cached", "-"],
    })
    assert point_labels(frame).tolist() == ["(0.5, 4, greedy, float32, a=0.1)", "(inf, 2, threshold, bfloat16, a=0.3)",
                                            "cloud-only (float32)"]


# --- recommendations -----------------------------------------------------------------------------

def test_recommendations_pick_by_rule(summary):
    picks = recommend(summary)
    s1 = picks[picks["prompts"] == "s1"].set_index("rule")
    assert s1["label"].to_dict() == {
        "fastest": "(inf, 4, greedy)",  # quality ignored; edge-only (50 tok/s) is another model: never a pick
        "fastest_near_cloud": "(2, 4, greedy)",  # 25 tok/s at chrF 100 beats (0, 4) at 20
        "fastest_near_cloud_network": "(0, 4, greedy)",  # 0.7 s with its network beats 1.0 (cloud) and 1.3 s
        "fewest_calls": "(2, 4, greedy)",  # the only point with acceptance >= 0.6 (0.75)
        "fastest_punct_band": "(2, 4, greedy)",  # the edge's text has no punctuation at all
    }
    assert s1.at["fastest_near_cloud", "why"] == "tokens/s 25.0; chrF vs cloud 100.0 (cloud-only chrF 100.0)"
    assert s1.at["fewest_calls", "why"] == "cloud calls per block 0.50; acceptance 0.75; tokens/s 25.0"
    assert s1.at["fastest_near_cloud_network", "why"].startswith("p50 latency with network 0.700 s")
    s2 = picks[picks["prompts"] == "s2"].set_index("rule")
    assert s2.at["fastest", "label"] == "(1, 4, greedy)"
    assert s2.at["fastest_near_cloud", "label"] is None
    assert "no cloud-only point" in s2.at["fastest_near_cloud", "why"]
    assert s2.at["fewest_calls", "label"] is None and s2.at["fewest_calls", "why"] == "no point satisfies the rule"


def test_recommendation_ties_go_to_faster_then_earlier():
    base = {"prompts": "s", "mode": "spec", "dtype": "f", "policy": "greedy", "accept_threshold": 0.1,
            "verifier": "cached", "k": 4.0, "chrf_vs_cloud": 90.0, "acceptance_rate": 0.8, "cloud_call_rate": 0.5,
            "punct_density": 0.0, "latency_with_network_p50_s": 1.0}
    frame = pd.DataFrame([{**base, "entropy_threshold": 1.0, "tokens_per_s": 10.0},
                          {**base, "entropy_threshold": 2.0, "tokens_per_s": 12.0},
                          {**base, "entropy_threshold": 3.0, "tokens_per_s": 12.0}])
    picks = recommend(frame).set_index("rule")
    assert picks.at["fewest_calls", "label"] == "(2, 4, greedy)"  # same calls: the faster, then the first


def test_a_winner_inside_the_noise_is_not_named_as_one():
    """Two spec points whose per-prompt speed-ups scatter around the same value: the faster on
    average still wins the rule, but the "why" says the sweep cannot tell it from the runner-up."""
    rows = []
    for i, (fast_s, slow_s) in enumerate([(0.3, 0.5), (0.6, 0.4), (0.4, 0.45), (0.5, 0.35)]):
        prompt = f"p{i}"
        rows += [row("cloud", prompt, latency_s=1.0), row(prompt=prompt, thr=0.0, latency_s=fast_s),
                 row(prompt=prompt, thr=1.0, latency_s=slow_s)]
    picks = recommend(summarize(rows)).set_index("rule")
    assert picks.at["fastest_near_cloud", "label"] == "(1, 4, greedy)"  # 40 / 1.7 s beats 40 / 1.8 s
    assert picks.at["fastest_near_cloud", "separable"] is False
    assert "NOT separable from the runner-up (0, 4, greedy): 95 % intervals of speed-up" in picks.at["fastest_near_cloud", "why"]
    clear = [r if r["mode"] == "cloud" or r["entropy_threshold"] == 1.0 else {**r, "latency_s": r["latency_s"] * 3} for r in rows]
    picks = recommend(summarize(clear)).set_index("rule")
    assert picks.at["fastest_near_cloud", "separable"] is True and "NOT" not in picks.at["fastest_near_cloud", "why"]


def test_separability_is_judged_against_one_baseline_whatever_the_cloud_runtimes():
    """Two spec points verified in two cloud runtimes, whose own cloud-only baselines run at 10 and 20
    tok/s: against their own baselines their speed-ups (≈ 2.4× and ≈ 1.2×) never overlap, yet per
    prompt the two points are as fast as each other. Judged against the fastest plain decoding (one
    baseline for both), the sweep cannot tell them apart, and says so."""
    rows = []
    for i, (fast_s, slow_s) in enumerate([(0.3, 0.5), (0.6, 0.4), (0.4, 0.45), (0.5, 0.35)]):
        prompt = f"p{i}"
        rows += [row("cloud", prompt, latency_s=1.0, cloud_runtime="torch"),
                 row("cloud", prompt, latency_s=0.5, cloud_runtime="llamacpp"),
                 row(prompt=prompt, latency_s=fast_s, edge_runtime="llamacpp", cloud_runtime="torch"),
                 row(prompt=prompt, latency_s=slow_s, edge_runtime="llamacpp", cloud_runtime="llamacpp")]
    summary = summarize(rows)
    spec = summary[summary["mode"] == "spec"].set_index("cloud_runtime")
    assert spec.at["torch", "speedup_vs_cloud_ci_low"] > spec.at["llamacpp", "speedup_vs_cloud_ci_high"]
    picks = recommend(summary).set_index("rule")
    assert picks.at["fastest_near_cloud", "separable"] is False
    assert "95 % intervals of speed-up vs the fastest plain decoding overlap" in picks.at["fastest_near_cloud", "why"]


def test_bf16_greedy_drift_is_said_plainly(tmp_path):
    from bench.read.report.recommend import precision_notes

    rows = [row("cloud", p, text=CLOUD_TEXT) for p in ("p0", "p1")] + [row(prompt=p, text=t) for p, t in
                                                                      (("p0", CLOUD_TEXT), ("p1", CLOUD_TEXT[:-6] + "mat."))]
    assert precision_notes(summarize(rows)) == []  # fp32
    bf16 = [{**r, "dtype": "bfloat16"} for r in rows]
    notes = precision_notes(summarize(bf16))
    assert len(notes) == 1 and "bf16 greedy drifts: 1 of 1 greedy spec points" in notes[0] and "fp32" in notes[0]
    page = build_report(write_results(tmp_path / "r", bf16), tmp_path / "out").read_text(encoding="utf-8")
    assert "bf16 greedy drifts" in page
    # a quantized cloud's verify drifts from that cloud's own decoding whatever --dtype says, and is named
    int8 = [{**r, "dtype": "bfloat16", "cloud_runtime": "torch-int8",
             **({"edge_runtime": "llamacpp"} if r["mode"] == "spec" else {})}
            for r in rows]
    notes = precision_notes(summarize(int8))
    assert len(notes) == 1 and notes[0].startswith("torch-int8 cloud greedy drifts: 1 of 1 greedy spec points"), notes
    assert "one scale over all its rows" in notes[0]


def test_per_position_acceptance_is_vllm_style(summary):
    table = per_position_acceptance(load_rows(synthetic_rows()), summary)
    labels = point_labels(summary)
    curve = table[table["point"] == label_of(summary, "(0, 4, greedy)")]
    # accepted_per_position summed over prompts [4, 2, 1, 0] over 4 verified blocks
    assert curve["p_accept"].tolist() == [1.0, 0.5, 0.25, 0.0]
    assert curve["position"].tolist() == [1, 2, 3, 4] and set(curve["num_drafts"]) == {4}
    # spec points that verified nothing (threshold inf) have no curve
    assert "(inf, 4, greedy)" not in set(labels[table["point"]])


# --- the report folder -----------------------------------------------------------------------------

def write_results(folder: Path, rows: list[dict], sweep: dict | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    if sweep is not None:
        (folder / "sweep.json").write_text(json.dumps(sweep), encoding="utf-8")
    return folder


def test_report_escapes_everything_from_results(tmp_path):
    hostile = "<script>alert('x')</script> & <img src=x onerror=alert(1)>"
    rows = [{**r, "text": hostile} if r["mode"] == "edge" else r for r in synthetic_rows()]
    rows.append({"id": "p9", "mode": "spec", "prompts": "s1", "status": "failed", "error": "<b>bad</b> audio"})
    results = write_results(tmp_path / "res", rows, {"config": {"edge": "<edge>", "cloud": "c"}, "environment": {}})
    index = build_report(results, tmp_path / "out")
    page = index.read_text(encoding="utf-8")
    assert "<script" not in page and "<img src=x" not in page
    assert str(markupsafe.escape(hostile)) in page
    assert "&lt;edge&gt;" in page and "&lt;b&gt;bad&lt;/b&gt; audio" in page
    assert "1 failed" in page


def test_bad_inputs_say_what_to_do(tmp_path):
    with pytest.raises(InputError, match="does not exist: pass the --out folder"):
        build_report(tmp_path / "nowhere", tmp_path / "o")
    with pytest.raises(InputError, match="has no results.jsonl"):
        build_report(tmp_path, tmp_path / "o")
    (tmp_path / "results.jsonl").write_text("")
    with pytest.raises(InputError, match="is empty: run the sweep"):
        build_report(tmp_path, tmp_path / "o")
    failed = {"id": "p0", "mode": "edge", "status": "failed", "error": "x"}
    write_results(tmp_path, [failed, {**failed, "status": "over_memory_cap"}])
    with pytest.raises(InputError, match=r"no successful results \(1 failed, 1 over_memory_cap\)"):
        build_report(tmp_path, tmp_path / "o")
    (tmp_path / "results.jsonl").write_text('{"id": "p0", "mode": "edge"}\nnot json\n')
    with pytest.raises(InputError, match="line 2 is not a JSON record"):
        build_report(tmp_path, tmp_path / "o")
    write_results(tmp_path, synthetic_rows())
    with pytest.raises(InputError, match="is not a profile folder"):
        build_report(tmp_path, tmp_path / "o", profile=tmp_path)


@pytest.fixture(scope="module")
def tiny_sweep(tmp_path_factory):
    root = tmp_path_factory.mktemp("report")
    pair = save_tiny_pair(root / "models")
    prompts = root / "p.jsonl"
    texts = ["hello world", 'say <b>yes</b> & "no"']
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "prompt": t}) + "\n" for i, t in enumerate(texts)))
    out = root / "sweep"
    assert main(["sweep", "--edge", pair["edge"], "--cloud", pair["cloud"], "--prompts", str(prompts), "--out", str(out),
                 "--mode", "cloud,edge,spec", "--k", "1,2", "--entropy-threshold", "0,inf", "--policy", "greedy",
                 "--dtype", "float32", "--max-new-tokens", "6", "--network", "4g"]) == 0
    return out


def report_command(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="specbench")
    add_report_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


@pytest.fixture(scope="module")
def tiny_report(tiny_sweep, tmp_path_factory):
    out = tmp_path_factory.mktemp("built") / "report"
    assert report_command(["report", str(tiny_sweep), "--out", str(out)]) == 0
    return out


@pytest.mark.subprocess  # a real tiny sweep in child processes
def test_report_from_a_tiny_sweep(tiny_report, tiny_sweep, capsys):
    index = tiny_report / "index.html"
    page = index.read_text(encoding="utf-8")
    sources = re.findall(r'<img src="([^"]+)"', page)
    # speed-up intervals, vs the fastest plain decoding per pairing, six fronts, one heat-map figure, theory,
    # per-position; where speculation pays: map, scatter
    assert len(sources) == 14
    assert all(not s.startswith(("/", "http", "file:")) and (tiny_report / s).is_file() for s in sources)
    for section in ("Recommended settings", "All points", "Sample outputs", "Run metadata", "Glossary"):
        assert section in page
    assert page.count('class="read"') >= 12  # a how-to-read paragraph for every figure and table
    assert "say &lt;b&gt;yes&lt;/b&gt; &amp; &#34;no&#34;" in page  # the prompt, escaped
    assert "(0, 2, greedy)" in page and "cloud-only" in page and "4g" in page
    assert "http://" not in page and "https://" not in page and "<script" not in page
    capsys.readouterr()
    embedded = tiny_report.parent / "embedded"
    assert report_command(["report", str(tiny_sweep), "--out", str(embedded), "--embed"]) == 0
    assert capsys.readouterr().out.strip() == str(embedded / "index.html")
    assert re.findall(r'<img src="([^"]+)"', (embedded / "index.html").read_text())[0].startswith("data:image/png;base64,")


def run_chromium(chromium: str, profile_dir: Path, *args: str) -> subprocess.CompletedProcess:
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--disable-quic", f"--user-data-dir={profile_dir}",
             "--hide-scrollbars"]
    return subprocess.run([chromium, *flags, *args], capture_output=True, text=True, timeout=120)


IMAGE_CHECK = """<script>
window.addEventListener("load", () => {
  const found = Array.from(document.images, i => ({src: i.getAttribute("src").slice(0, 60), width: i.naturalWidth}));
  const out = document.createElement("pre"); out.id = "image-check"; out.textContent = JSON.stringify(found);
  document.body.appendChild(out);
});
</script>"""


@pytest.mark.subprocess  # a real tiny sweep in child processes
def test_report_opens_in_chromium_after_moving(tiny_report, chromium, tmp_path):
    moved = tmp_path / "mailed" / "report copy"  # moved, and a space in the path
    shutil.copytree(tiny_report, moved)
    page = (moved / "index.html").read_text(encoding="utf-8")
    (moved / "_check.html").write_text(page.replace("</body>", IMAGE_CHECK + "</body>"), encoding="utf-8")
    done = run_chromium(chromium, tmp_path / "chrome-dom", "--virtual-time-budget=10000", "--dump-dom",
                        (moved / "_check.html").as_uri())
    found = re.search(r'<pre id="image-check">(.*?)</pre>', done.stdout, re.S)
    assert found, f"chromium printed no image check: {done.stderr[-1500:]}"
    images = json.loads(html.unescape(found.group(1)))
    assert len(images) == 14  # as in test_report_from_a_tiny_sweep
    assert [i["src"] for i in images if i["width"] <= 0] == []  # every <img> loaded
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "report.png"
    shot.unlink(missing_ok=True)
    done = run_chromium(chromium, tmp_path / "chrome-shot", "--window-size=1280,4000", f"--screenshot={shot}",
                        (moved / "index.html").as_uri())
    assert shot.is_file() and shot.stat().st_size > 20_000, done.stderr[-1500:]


def test_a_torn_last_line_is_skipped_and_left_alone(tmp_path):
    """A sweep may be appending while the report reads: the file is never modified."""
    write_results(tmp_path, synthetic_rows())
    with (tmp_path / "results.jsonl").open("a") as f:
        f.write('{"id": "p2", "mode": "cl')
    before = (tmp_path / "results.jsonl").read_bytes()
    assert len(load_inputs(tmp_path).rows) == len(synthetic_rows())
    assert (tmp_path / "results.jsonl").read_bytes() == before


def test_recommendations_never_pick_edge_only(summary):
    """Edge-only is the smaller model's own text: the fastest, and never a recommendation."""
    picks = recommend(summary)
    assert (summary.loc[picks["point"].dropna().astype(int), "mode"] != "edge").all()
    assert summary.loc[summary["prompts"] == "s1"].sort_values("tokens_per_s").iloc[-1]["mode"] == "edge"


def test_a_spec_label_names_its_drafter_where_drafters_differ(summary):
    """A model point and a prompt-lookup point at one (threshold, k, policy) once shared a label."""
    spec = summary[summary["mode"] == "spec"].iloc[[0]]
    both = pd.concat([spec.assign(drafter="model"), spec.assign(drafter="prompt-lookup")], ignore_index=True)
    first = point_labels(both).tolist()
    assert first[0] != first[1]
    assert first[0].startswith("(model, ") and first[1].startswith("(prompt-lookup, ")
    assert point_labels(both.iloc[[0]]).iloc[0] == first[0].replace("model, ", "", 1)  # one drafter: not named


def test_sample_points_are_edge_recommended_spec_then_cloud(summary):
    labels = point_labels(summary)
    shown = sample_points(summary, recommend(summary), "s1")
    assert labels[shown].tolist() == ["edge-only", "(inf, 4, greedy)", "(2, 4, greedy)", "(0, 4, greedy)", "cloud-only"]


def _split_summary(placement: str) -> pd.DataFrame:
    base = {"mode": "spec", "dtype": "float32", "prompts": "code", "entropy_threshold": 0.0, "k": 2, "policy": "greedy",
            "accept_threshold": 0.1, "verifier": "cached", "edge_runtime": "torch", "cloud_runtime": "torch"}
    rows = [{**base, "deployment": "split", "link": "4g", "overlap": overlap, "split_cores": placement,
             "speedup_vs_cloud": 1.2, "speedup_vs_cloud_ci_low": 1.1, "speedup_vs_cloud_ci_high": 1.3,
             "speedup_vs_colocated": 0.9, "speedup_vs_colocated_ci_low": 0.8, "speedup_vs_colocated_ci_high": 1.0}
            for overlap in ("auto", True)]
    rows.append({**base, "deployment": "colocated", "link": "-", "overlap": "-", "split_cores": placement,
                 "speedup_vs_cloud": 1.3, "speedup_vs_colocated": float("nan")})
    return pd.DataFrame(rows)


def test_split_comparisons_name_the_co_located_baseline_and_the_placement():
    summary = _split_summary("disjoint")
    labels = point_labels(summary)
    # a split point and its co-located baseline, and the overlap settings, are told apart
    assert list(labels) == ["(0, 2, greedy, split, overlap auto)", "(0, 2, greedy, split, overlap true)",
                            "(0, 2, greedy, colocated)"]
    notes = split_notes(summary, labels)
    assert notes[0].startswith("Split points emulate two machines")
    assert notes[1] == ("(0, 2, greedy, split, overlap auto): 1.20× [1.10–1.30] cloud-only; 0.90× [0.80–1.00] "
                        "co-located (both models on the cloud's cores).")
    assert len(notes) == 3  # one per split point, none for the co-located point itself
    shared = split_notes(_split_summary("shared"), labels)
    assert "SHARED cores" in shared[0] and "do not emulate two machines" in shared[0]
    assert split_notes(summary[summary["deployment"] == "colocated"], labels) == []


def test_the_latency_calls_front_holds_spec_points_only(summary):
    """Edge-only and cloud-only make no cloud calls per block: on that front they would beat every spec point."""
    from bench.read.report.pareto import FRONTS

    front = next(f for f in FRONTS if f.name == "latency_calls")
    members = front_members(summary, front)
    assert members.any() and (summary.loc[members, "mode"] == "spec").all()
    assert (front.points(summary)["mode"] == "spec").all()
