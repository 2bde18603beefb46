"""The runtime peers on the tiny pair (fp32, no timing asserted): llama-cpp-python's own greedy
generation equals specbench's llama.cpp cloud-only on the same tiny GGUF; the speculative example's
report parses; a missing example binary is one line naming the build; HF assisted with an `@int8`
assistant equals greedy."""
from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bench.measure.peers.hf_assisted import Timed, hf_assisted
from bench.measure.peers.llama_speculative import (
    BINARY_ENV,
    BUILD_COMMAND,
    SPEC_SETTINGS,
    parse_report,
    speculative_command,
)
from bench.measure.peers.runtimes import (
    Peer,
    PeerSettings,
    external_peers,
    fastest_plain,
    first_token,
    first_token_ratio,
    llama_peer_name,
    per_set_table,
    run_interleaved,
    same_as_reference,
    set_label,
    spec_peers,
    speedups,
    table,
    warm_up_prompt,
)
from specdec.core.config import DecodeConfig
from specdec.engine import Engine
from specdec.errors import ConfigError, SpecdecError
from specdec.models.loading import load_model

TEXTS = ["hello world", "what is one two", "say three", "write a function to sort a list"]
QUIET = dict(log=lambda m: None)
FIXTURES = Path(__file__).parent / "fixtures"


def cloud_only_tokens(cloud: str, **settings) -> list[list[int]]:
    engine = Engine(mode="cloud", cloud=cloud, dtype="float32", decode=DecodeConfig(max_new_tokens=16), **settings, **QUIET)
    try:
        return [engine.generate(text).tokens for text in TEXTS]
    finally:
        engine.close()


def test_llama_cpp_python_greedy_equals_specbench_llamacpp_cloud_only(pair, tmp_path):
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (pip install 'specbench[llamacpp]')")
    from transformers import AutoModelForCausalLM

    from bench.measure.peers.runtimes import LlamaCppPython
    from tests.tiny_gguf import write_llama_gguf

    model = AutoModelForCausalLM.from_pretrained(pair["cloud"], dtype=torch.float32)
    gguf = str(write_llama_gguf(model, f"{pair['cloud']}/model.gguf", model.config.eos_token_id))
    cloud = load_model(gguf, "float32", **QUIET)
    ours = cloud_only_tokens(gguf, cloud_runtime="llamacpp")
    plain = LlamaCppPython(gguf, threads=1)
    theirs = [plain.generate(cloud.encode(text).input_ids.tolist(), 16, cloud.eos_ids) for text in TEXTS]
    assert theirs == ours
    # Its prompt lookup (LlamaPromptLookupDecoding) keeps only what its own greedy choice agrees with, on prompts
    # longer than one batch of 16 (a draft of up to 10 + 1 rows fits one).
    long = [" ".join([text] * 6) for text in TEXTS]
    plain = LlamaCppPython(gguf, threads=1, n_batch=16)
    lookup = LlamaCppPython(gguf, threads=1, prompt_lookup=True, n_batch=16)
    ids = [cloud.encode(text).input_ids.tolist() for text in long]
    assert min(len(i) for i in ids) > 16
    assert [lookup.generate(i, 16, cloud.eos_ids) for i in ids] == [plain.generate(i, 16, cloud.eos_ids) for i in ids]


def test_peer_settings_take_spec_bench_sets_and_cloud_runtimes():
    settings = PeerSettings.from_env({"SPECBENCH_PEER_SETS": "code,spec-bench:q.jsonl:summarization,rag,en-chat",
                                      "SPECBENCH_PEER_RUNTIMES": "llamacpp, torch-int8t"})
    assert settings.sets == ("code", "spec-bench:q.jsonl:summarization,rag", "en-chat")
    assert settings.cloud_runtimes == ("llamacpp", "torch-int8t")
    with pytest.raises(ConfigError, match=r"SPECBENCH_PEER_RUNTIMES names 'onnx'.*e\.g\."):
        PeerSettings.from_env({"SPECBENCH_PEER_RUNTIMES": "onnx"})
    lookups = [(cloud, drafter) for _, cloud, _, drafter in spec_peers(("llamacpp", "torch-int8t")) if drafter != "model"]
    assert lookups == [("llamacpp", "prompt-lookup"), ("torch-int8t", "prompt-lookup")]


def test_the_examples_report_parses():
    """Captured from the example built from llama-cpp-python 0.3.36's llama.cpp, on a tiny F32 GGUF pair
    like this module's (token pieces `<tN>` written as user-defined tokens and no BOS, so text
    round-trips): `-p '<t5><t6><t7><t8>' -n 12 -t 1 -td 1 --temp 0 --top-k 1 --spec-type draft-simple`.
    stdout: two newlines, the prompt's echo, the text, four newlines; the figures on stderr. Its 13
    tokens equal llama-cpp-python's greedy on that file (checked when captured)."""
    prompt = "<t5><t6><t7><t8>"
    stdout = (FIXTURES / "llama_speculative_simple.stdout.txt").read_text()
    stderr = (FIXTURES / "llama_speculative_simple.stderr.txt").read_text()
    report = parse_report(stdout, stderr, prompt)
    assert report.text == "<t29><t29><t43><t43><t43><t43><t43><t21><t40><t29><t29><t29><t29>"
    assert (report.prompt_tokens, report.new_tokens, report.draft_max, report.drafted, report.accepted) == (4, 13, 3, 23, 5)
    assert report.wall_s == pytest.approx(0.001 + 0.016)
    with pytest.raises(SpecdecError, match="echoed a different prompt"):
        parse_report(stdout, stderr, "another prompt")
    with pytest.raises(SpecdecError, match="no n_drafted, n_accept"):  # a log cut short at exit (seen once)
        parse_report(stdout, stderr.split("n_drafted")[0], prompt)


def test_the_example_runs_greedy_with_the_same_threads_and_a_draft_type():
    command = speculative_command(Path("bin"), "t.gguf", "d.gguf", "p", threads=2, max_new_tokens=48)
    flags = dict(zip(command[1::2], command[2::2]))
    assert (flags["-m"], flags["-md"], flags["-t"], flags["-td"], flags["-n"]) == ("t.gguf", "d.gguf", "2", "2", "48")
    assert (flags["--temp"], flags["--top-k"], flags["--spec-type"]) == ("0", "1", "draft-simple")


@pytest.mark.parametrize("spec_type", ["ngram-simple", "ngram-mod"])
def test_the_examples_draft_free_types_run_greedy_without_a_draft_model(spec_type):
    command = speculative_command(Path("bin"), "t.gguf", None, "p", threads=2, max_new_tokens=48, spec_type=spec_type)
    flags = dict(zip(command[1::2], command[2::2]))
    assert "-md" not in command and "-td" not in command
    assert (flags["-m"], flags["-t"], flags["--temp"], flags["--top-k"], flags["--spec-type"]) == (
        "t.gguf", "2", "0", "1", spec_type)


def test_the_examples_types_are_refused_in_one_line_where_they_do_not_fit():
    with pytest.raises(ConfigError, match="llama.cpp's draft-simple needs a draft model: give --draft D.gguf"):
        speculative_command(Path("bin"), "t.gguf", None, "p", threads=2, max_new_tokens=8)
    with pytest.raises(ConfigError, match="llama.cpp's ngram-mod drafts from the context, not a draft model: drop --draft"):
        speculative_command(Path("bin"), "t.gguf", "d.gguf", "p", threads=2, max_new_tokens=8, spec_type="ngram-mod")
    with pytest.raises(ConfigError, match="unknown llama.cpp speculation type 'none': use one of draft-simple, "):
        speculative_command(Path("bin"), "t.gguf", None, "p", threads=2, max_new_tokens=8, spec_type="none")
    assert PeerSettings.from_env({"SPECBENCH_PEER_LLAMA_SPEC": "draft-simple, ngram-mod"}).llama_spec_types == (
        "draft-simple", "ngram-mod")
    with pytest.raises(ConfigError, match="SPECBENCH_PEER_LLAMA_SPEC names 'ngram-xl': use some of"):
        PeerSettings.from_env({"SPECBENCH_PEER_LLAMA_SPEC": "ngram-xl"})


@pytest.mark.subprocess  # runs the example's module as a child process
@pytest.mark.parametrize("binary", [None, "no/such/llama-speculative-simple"])
def test_a_missing_example_binary_is_one_line_naming_the_build(binary, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != BINARY_ENV}
    if binary:
        env[BINARY_ENV] = str(tmp_path / binary)
    result = subprocess.run([sys.executable, "-m", "bench.measure.peers.llama_speculative", "run", "--target", "t.gguf",
                             "--draft", "d.gguf", "--prompt", "hi"], capture_output=True, text=True, env=env, timeout=120)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: ") and BUILD_COMMAND in lines[0], lines


@pytest.mark.parametrize("name", sorted(SPEC_SETTINGS))
def test_the_examples_named_settings_pass_their_flags(name):
    base, flags = SPEC_SETTINGS[name]
    command = speculative_command(Path("bin"), "t.gguf", None, "p", threads=2, max_new_tokens=48, spec_type=name)
    assert command[command.index("--spec-type") + 1] == base and command[-len(flags):] == list(flags)
    assert all(flag.startswith(f"--spec-{base}-") for flag in flags[::2])  # the flags of its own type
    assert " ".join(flags) in llama_peer_name(name)
    assert PeerSettings.from_env({"SPECBENCH_PEER_LLAMA_SPEC": name}).llama_spec_types == (name,)


def test_peer_settings_name_external_peers_llama_python_ways_and_drafters():
    settings = PeerSettings.from_env({"SPECBENCH_PEER_EXTERNAL": "vllm, onnxruntime-genai",
                                      "SPECBENCH_PEER_LLAMA_PYTHON": "plain", "SPECBENCH_PEER_SPEC": "prompt-lookup,auto"})
    assert settings.external == ("vllm", "onnxruntime-genai") and settings.llama_python == ("plain",)
    assert [drafter for *_, drafter in spec_peers(("kernels-int4",), settings.spec_modes)] == ["prompt-lookup", "auto"]
    # every draft-free drafter joins the comparison, the suffix drafter included, each verified in every runtime asked
    suffix = PeerSettings.from_env({"SPECBENCH_PEER_SPEC": "suffix,prompt-lookup"}).spec_modes
    assert spec_peers(("kernels-int4", "llamacpp"), suffix) == [
        (None, "kernels-int4", 4, "prompt-lookup"), (None, "llamacpp", 4, "prompt-lookup"),
        (None, "kernels-int4", 4, "suffix"), (None, "llamacpp", 4, "suffix")]
    assert PeerSettings().external == () and PeerSettings().llama_python == ("plain", "flash-off", "lookup")
    # each k of SPECBENCH_PEER_K is a peer of its own (the model drafter keeps its pairings)
    ks = PeerSettings.from_env({"SPECBENCH_PEER_SPEC": "prompt-lookup", "SPECBENCH_PEER_K": "4, 8"})
    assert ks.draft_free_ks == (4, 8) and PeerSettings().draft_free_ks == (4,)
    assert spec_peers(("kernels-int4",), ks.spec_modes, ks.draft_free_ks) == [
        (None, "kernels-int4", 4, "prompt-lookup"), (None, "kernels-int4", 8, "prompt-lookup")]
    for value in ("0", "4,x", "-1", ","):
        with pytest.raises(ConfigError, match=r"SPECBENCH_PEER_K=.*need whole numbers >= 1, comma-separated, e\.g\. "):
            PeerSettings.from_env({"SPECBENCH_PEER_K": value})
    for variable, value in (("SPECBENCH_PEER_EXTERNAL", "sglang"), ("SPECBENCH_PEER_LLAMA_PYTHON", "fast"),
                            ("SPECBENCH_PEER_SPEC", "eagle")):
        with pytest.raises(ConfigError, match=rf"{variable} names '{value}': use some of .*e\.g\. {variable}="):
            PeerSettings.from_env({variable: value})


def test_the_hybrid_peers_run_the_edge_in_the_clouds_runtime_one_per_options_entry():
    hybrid = PeerSettings.from_env({"SPECBENCH_PEER_SPEC": "hybrid,suffix",
                                    "SPECBENCH_PEER_HYBRID": "suffix=1; suffix=1,head_vocab=64"})
    assert hybrid.hybrid_options == ("suffix=1", "suffix=1,head_vocab=64")
    assert PeerSettings().hybrid_options == ("suffix=1,head_vocab=32768",)
    assert spec_peers(("kernels-int4",), hybrid.spec_modes, (4, 8)) == [
        ("kernels-int4", "kernels-int4", 4, "hybrid"), ("kernels-int4", "kernels-int4", 8, "hybrid"),
        (None, "kernels-int4", 4, "suffix"), (None, "kernels-int4", 8, "suffix")]
    for value, why in (("suffix=x", "must be an integer"), ("branches=2", "takes no option 'branches'")):
        with pytest.raises(ConfigError, match=rf"^SPECBENCH_PEER_HYBRID='{value}': drafter.*{why}.*e\.g\. "
                                              r"SPECBENCH_PEER_HYBRID='suffix=1;suffix=1,head_vocab=32768'\)$"):
            PeerSettings.from_env({"SPECBENCH_PEER_HYBRID": value})


def test_an_external_peer_not_installed_is_refused_before_any_model_loads(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_HOME", str(tmp_path))
    monkeypatch.setattr("bench.measure.peers.runtimes.model_dir", lambda alias: tmp_path / alias)
    with pytest.raises(ConfigError, match="run `specbench peers install vllm`"):
        external_peers("vllm", "edge", "cloud", threads=2)


def _timed(config: str, rates: list[float], ttft: float | None = 0.05, tokens: int = 10) -> list[Timed]:
    return [Timed(config, i, list(range(tokens)), tokens / rate, extra={"ttft_s": ttft}) for i, rate in enumerate(rates)]


def test_after_the_first_token_leaves_out_every_token_the_first_cycle_emitted():
    """A speculative first cycle emits its kept draft and the cloud's token at the first-token time: those tokens came
    with the prompt's time, so they are not counted after it (crediting them flattered every spec peer by ~2 %)."""
    from types import SimpleNamespace

    from bench.measure.peers.runtimes import first_tokens

    cycle = SimpleNamespace(accepted=3, extra_token=7)
    assert first_tokens(SimpleNamespace(cycles=[cycle, cycle], tokens=[1] * 9)) == 4
    assert first_tokens(SimpleNamespace(cycles=[SimpleNamespace(accepted=2, extra_token=None)], tokens=[1, 2])) == 2
    assert first_tokens(SimpleNamespace(cycles=[], tokens=[5, 6])) == 1
    assert first_tokens(SimpleNamespace(cycles=[], tokens=[])) == 0
    plain = _timed("plain", [10, 10])
    spec = [Timed("spec", i, list(range(10)), 0.5, extra={"ttft_s": 0.1, "first_tokens": 4}) for i in range(2)]
    after, _, _ = speedups(plain + spec, "spec", "plain", after_first=True)
    assert after == pytest.approx((6 / 0.4) / (9 / 0.95))
    spec = [Timed("spec", i, list(range(4)), 0.5, extra={"ttft_s": 0.1, "first_tokens": 4}) for i in range(2)]
    assert math.isnan(speedups(plain + spec, "spec", "plain", after_first=True)[0])  # nothing came after the first cycle


def test_speedups_are_pooled_over_the_fastest_plain_with_a_paired_interval():
    timed = (_timed("a plain", [10, 20, 10, 20]) + _timed("b plain", [12, 24, 12, 24]) + _timed("spec", [24, 48, 24, 48])
             + _timed("text only", [12, 24, 12, 24], ttft=None))
    peers = [Peer("a plain", None, lambda i: None, plain=True), Peer("b plain", None, lambda i: None, plain=True),
             Peer("spec", "a plain", lambda i: None), Peer("text only", "a plain", lambda i: None)]
    assert fastest_plain(timed, peers) == "b plain"  # the spec peer is faster, but not a plain decoding
    point, low, high = speedups(timed, "spec", "b plain")
    assert point == pytest.approx(2.0) and low == pytest.approx(2.0) and high == pytest.approx(2.0)  # same ratio each
    point, low, high = speedups(timed, "spec", "a plain")
    assert point == pytest.approx(2.4) and low <= point <= high
    # after the first token: 9 tokens over (wall - 0.05 s); a peer that reports no first-token time is left out
    after, _, _ = speedups(timed, "spec", "b plain", after_first=True)
    assert after == pytest.approx(sum(10 / r - 0.05 for r in [12, 24, 12, 24]) / sum(10 / r - 0.05 for r in [24, 48, 24, 48]))
    assert math.isnan(speedups(timed, "text only", "b plain", after_first=True)[0])
    text = table(timed, peers, max_new_tokens=10)
    assert "x fastest plain (b plain)" in text.splitlines()[0]
    assert "| 2.00x [2.00-2.00] |" in text and "4/4 (a plain)" in text
    assert "first token, median [95%]" in text.splitlines()[0] and "| 0.05 s [0.05-0.05] |" in text
    assert text.splitlines()[4].split(" | ")[4] == "-"  # "text only" reports no first token
    slow = _timed("slow", [10, 10, 10], ttft=None)
    slow = [Timed(t.config, t.prompt, t.tokens, t.wall_s, extra={"ttft_s": s}) for t, s in zip(slow, (1.0, 3.0, 2.0))]
    assert first_token(slow, "slow")[0] == 2.0 and 1.0 <= first_token(slow, "slow")[1] <= 2.0 <= first_token(slow, "slow")[2]
    fast = [Timed("fast", t.prompt, t.tokens, t.wall_s, extra={"ttft_s": s}) for t, s in zip(slow, (0.5, 1.5, 1.0))]
    assert first_token_ratio(fast + slow, "fast", "slow") == (pytest.approx(0.5), pytest.approx(0.5), pytest.approx(0.5))
    assert math.isnan(first_token_ratio(timed, "text only", "b plain")[0])  # no first token reported


def test_per_set_table_takes_each_sets_own_fastest_plain_and_shows_where_a_drafter_loses():
    # set 1 (prompts 0-1): "b plain" is the faster plain and spec pays 2x; set 2 (prompts 2-3): "a plain" is faster
    # and spec loses (0.5x of it)
    timed = (_timed("a plain", [10, 10, 40, 40]) + _timed("b plain", [20, 20, 20, 20]) + _timed("spec", [40, 40, 20, 20]))
    peers = [Peer("a plain", None, lambda i: None, plain=True), Peer("b plain", None, lambda i: None, plain=True),
             Peer("spec", "a plain", lambda i: None)]
    text = per_set_table(timed, peers, [("summarization", [0, 1]), ("translation", [2, 3])])
    head, fastest, *rows = text.splitlines()
    assert head == "config | summarization | translation" and fastest == "(fastest plain) | b plain | a plain"
    spec = next(row for row in rows if row.startswith("spec |")).split(" | ")
    assert spec[1].startswith("2.00x [2.00-2.00] / ") and spec[2].startswith("0.50x [0.50-0.50] / ")
    assert set_label("spec-bench:../q.jsonl:summarization") == "summarization" and set_label("code") == "code"
    assert set_label("spec-bench:/a:b/q.jsonl:qa,rag") == "qa,rag"


def test_peers_warm_on_a_prompt_that_is_not_timed(tmp_path):
    """An engine that keeps a prompt's prefix answered a warmed prompt's first token from that cache: the warm-up runs
    an untimed prompt, and its generation is neither returned nor written."""
    records = {"a": ["a1", "a2"], "b": ["b1", "b2", "b3"]}
    assert warm_up_prompt([("a", records["a"]), ("b", records["b"])], per_set=2)[0] == "b3"  # set a has no spare
    assert warm_up_prompt([("a", records["a"]), ("b", records["b"])], per_set=1)[0] == "a2"
    chosen, said = warm_up_prompt([("a", records["a"])], per_set=2)
    assert chosen == "a1" and "timed" in said  # nothing spare: the first timed prompt, and it says so
    ran: list[tuple[str, int]] = []

    def peer(name: str) -> Peer:
        def run(i: int) -> Timed:
            ran.append((name, i))
            return Timed(name, i, [i], 1.0)
        return Peer(name, None, run, plain=True)
    sink = tmp_path / "raw.jsonl"
    timed = run_interleaved([peer("x"), peer("y")], n_prompts=2, sink=sink, threads=1, warm_up=2)
    assert ran[:2] == [("x", 2), ("y", 2)] and sorted(ran[2:]) == [("x", 0), ("x", 1), ("y", 0), ("y", 1)]
    assert sorted((t.config, t.prompt) for t in timed) == [("x", 0), ("x", 1), ("y", 0), ("y", 1)]
    assert len(sink.read_text().splitlines()) == 4


def test_text_peers_compare_by_prefix_past_the_budget():
    """The example may decode past -n: its text must start with the reference's, and equal it when the
    reference stopped before its budget."""
    timed = [Timed("ref", 0, [1, 2, 3], 1.0, text="a b c"), Timed("ref", 1, [4, 9], 1.0, text="d"),
             Timed("ex", 0, [], 1.0, text="a b c d", counted=4), Timed("ex", 1, [], 1.0, text="d e", counted=3)]
    assert same_as_reference(timed, "ex", "ref", max_new_tokens=3) == (1, 2)


def test_hf_assisted_with_an_int8_assistant_equals_greedy(pair):
    cloud = load_model(pair["cloud"], "float32", **QUIET)
    assistant = load_model(f"{pair['edge']}@int8", "float32", **QUIET)
    assert type(assistant.backend.model.model.layers[0].mlp.up_proj).__module__.startswith("torch.ao.nn.quantized")
    settings = {"num_assistant_tokens": 4, "num_assistant_tokens_schedule": "constant",
                "assistant_confidence_threshold": 0.0}
    assisted = [hf_assisted(assistant, cloud, text, 16, settings) for text in TEXTS]
    assert assisted == cloud_only_tokens(pair["cloud"])
