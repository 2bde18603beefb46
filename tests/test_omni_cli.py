"""Audio manifests through `specbench run` and `specbench sweep` on tiny random Qwen2.5-Omni
thinkers saved to disk: the models load as thinkers, greedy spec equals cloud mode, the cloud
verifier hears the audio (its tokens and logits follow the audio; a deaf control
shows the check has teeth), and a bad sample fails alone."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import soundfile
import soxr
import torch

from bench.cli import main
from bench.core.prompts import SAMPLES_MANIFEST
from bench.measure.run import FailedSamples, run
from specdec.backends.omni_thinker import OmniThinkerBackend
from specdec.core.config import DecodeConfig, SpecConfig
from specdec.engine import Engine
from specdec.models.loading import load, load_model
from tests.omni_fixtures import random_waveform, tiny_omni_tokenizer, tiny_thinker
from tests.tiny import noisy_copy

pytestmark = pytest.mark.subprocess  # see CONTRIBUTING.md: the quick loop leaves these out

QUESTION = "what is said in the audio clip ?"  # words of the tiny tokenizer
SPEC = ["--k", "3", "--entropy-threshold", "0", "--policy", "greedy"]  # every block verified


@pytest.fixture(scope="module")
def thinkers(tmp_path_factory):
    """A tiny cloud thinker and a partly-agreeing edge (weight noise), saved with one tokenizer."""
    root = tmp_path_factory.mktemp("omni")
    tokenizer = tiny_omni_tokenizer()
    cloud = tiny_thinker(seed=0, tokenizer=tokenizer)
    paths = {}
    for role, model in (("edge", noisy_copy(cloud, noise=0.2)), ("cloud", cloud)):
        model.save_pretrained(root / role)
        tokenizer.save_pretrained(root / role)
        paths[role] = str(root / role)
    return paths


def shipped(sample_id: str) -> np.ndarray:
    waveform, rate = soundfile.read(SAMPLES_MANIFEST.parent / f"{sample_id}.flac", dtype="float32")
    assert rate == 16000
    return waveform


def manifest(folder, entries: dict[str, np.ndarray | str | None], **fields) -> str:
    """A manifest in `folder` with one record per entry: a waveform is written as `<id>.flac`, a
    string is used as the audio path as it is, None leaves the file out (a missing-file sample)."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = []
    for sample_id, audio in entries.items():
        name = audio if isinstance(audio, str) else f"{sample_id}.flac"
        if isinstance(audio, np.ndarray):
            soundfile.write(folder / name, audio, 16000)
        lines.append({"id": sample_id, "audio": name, "prompt": QUESTION, "language": "en", "reference": "hello world", **fields})
    path = folder / "manifest.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return str(path)


def run_cli(mode, thinkers, prompts, out, *extra):
    roles = {"edge": ["--edge", thinkers["edge"]], "cloud": ["--cloud", thinkers["cloud"]],
             "spec": ["--edge", thinkers["edge"], "--cloud", thinkers["cloud"], *SPEC]}[mode]
    return main(["run", "--mode", mode, *roles, "--prompts", prompts, "--out", str(out),
                 "--max-new-tokens", "10", "--dtype", "float32", *map(str, extra)])


def rows(out):
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]


def test_a_saved_tiny_thinker_loads_as_an_omni_thinker_with_its_audio_tokens(thinkers):
    original = tiny_omni_tokenizer()
    loaded = load_model(thinkers["cloud"], "float32", log=lambda m: None)
    assert isinstance(loaded.backend, OmniThinkerBackend) and loaded.backend.accepts_audio
    assert loaded.feature_extractor.sampling_rate == 16000
    for name in ("audio_token", "audio_bos_token", "audio_eos_token"):
        token = getattr(loaded.tokenizer, name)
        assert token == getattr(original, name)
        assert loaded.tokenizer.convert_tokens_to_ids(token) == original.convert_tokens_to_ids(token)
    assert loaded.backend.audio_token_id == original.convert_tokens_to_ids(original.audio_token)
    assert loaded.tokenizer.get_vocab() == original.get_vocab() and loaded.tokenizer.chat_template == original.chat_template


def test_spec_on_an_audio_manifest_equals_cloud_mode(thinkers, tmp_path):
    # A shipped 16 kHz FLAC, a 44.1 kHz stereo WAV (resampled and downmixed on read) and a
    # MER-style record whose prompt comes from its prompt_type.
    stereo = soxr.resample(shipped("zh-01"), 16000, 44100)
    (tmp_path / "set").mkdir()
    soundfile.write(tmp_path / "set" / "zh-01.wav", np.stack([stereo, 0.5 * stereo], axis=1), 44100)
    prompts = manifest(tmp_path / "set", {"en-01": shipped("en-01"), "zh-01": "zh-01.wav"})
    with open(prompts, "a") as f:
        f.write(json.dumps({"id": "mer", "audio": "en-01.flac", "prompt_type": "concise", "language": "zh",
                            "reference": "男声平稳。"}, ensure_ascii=False) + "\n")
    assert run_cli("cloud", thinkers, prompts, tmp_path / "cloud") == 0
    assert run_cli("spec", thinkers, prompts, tmp_path / "spec") == 0
    cloud, spec = rows(tmp_path / "cloud"), rows(tmp_path / "spec")
    assert [r["id"] for r in spec] == ["en-01", "zh-01", "mer"] and all(r["status"] == "ok" for r in spec + cloud)
    assert [r["tokens"] for r in spec] == [r["tokens"] for r in cloud]  # greedy, every block verified: lossless
    for row in spec:
        assert row["cloud_calls"] == row["cycles"] > 0 and row["new_tokens"] == 10
        assert row["trace"][0]["sent_features"] and not any(c["sent_features"] for c in row["trace"][1:])
        assert row["prompt_tokens"] > 50  # the audio placeholders: ~25 per second of audio
    assert spec[2]["language"] == "zh" and spec[2]["reference"] == "男声平稳。"


def same_length_noise(waveform: np.ndarray) -> np.ndarray:
    """Noise as long as `waveform`: the same number of audio placeholders, so the two prompts
    have identical token ids and differ only in their audio features."""
    return random_waveform(waveform.size / 16000, seed=1)[: waveform.size]


def test_the_verified_tokens_follow_the_audio(thinkers, tmp_path):
    speech = shipped("en-01")
    noise = same_length_noise(speech)
    assert noise.size == speech.size
    tokens = {}
    for name, audio in (("speech", speech), ("noise", noise)):
        out = tmp_path / name
        assert run_cli("spec", thinkers, manifest(tmp_path / f"{name}-set", {"clip": audio}), out) == 0
        (row,) = rows(out)
        assert row["prompt_tokens"] == rows(tmp_path / "speech")[0]["prompt_tokens"]  # same ids, only the audio differs
        tokens[name] = row["tokens"]
    # Under greedy with every block verified the output is the cloud's own greedy output: if the
    # cloud did not hear the audio both runs would give the same tokens.
    assert tokens["speech"] != tokens["noise"]


class RecordingCloud(OmniThinkerBackend):
    """The cloud thinker, recording every logits block it returns and the audio it was given."""

    def __init__(self, model, name=""):
        super().__init__(model, name)
        self.logits: list[torch.Tensor] = []
        self.feature_keys: list[tuple[str, ...]] = []

    def prefill(self, prompt, token_ids, keep=0, use_cache=True):
        self.feature_keys.append(tuple(sorted(prompt.features)))
        state, logits = super().prefill(prompt, token_ids, keep, use_cache)
        if logits is not None:
            self.logits.append(logits.clone())
        return state, logits

    def forward(self, state, token_ids, keep=None):
        logits = super().forward(state, token_ids, keep)
        self.logits.append(logits.clone())
        return logits


class DeafCloud(RecordingCloud):
    """The deaf-verifier bug: the placeholder tokens go up, the audio features do not."""

    def _audio_inputs(self, prompt, token_ids):
        return {}


def first_verified_logits(cloud_class, thinkers, prompts: str, out, verifier: str) -> tuple[torch.Tensor, RecordingCloud]:
    """Row 0 of the cloud's first verification: its distribution for the first new token given the
    prompt and audio alone (the causal mask hides the edge's draft from it)."""
    spies = []

    def loader(name, settings, log=print):
        loaded = load(name, settings, log)
        if name == thinkers["cloud"]:
            loaded = dataclasses.replace(loaded, backend=cloud_class(loaded.backend.model, name))
            spies.append(loaded.backend)
        return loaded

    engine = Engine(mode="spec", edge=thinkers["edge"], cloud=thinkers["cloud"], dtype="float32", loader=loader,
                    spec=SpecConfig(k=3, entropy_threshold=0.0, policy="greedy", verifier=verifier),
                    decode=DecodeConfig(max_new_tokens=6), log=lambda m: None)
    run(engine, prompts, out, progress=False)
    (spy,) = spies
    return spy.logits[0][0], spy


@pytest.mark.parametrize("verifier", ["cached", "stateless"])
def test_the_cloud_verifier_consumes_the_audio_features(thinkers, tmp_path, verifier):
    speech = shipped("en-01")
    sets = {name: manifest(tmp_path / name, {"clip": audio}) for name, audio in
            (("speech", speech), ("noise", same_length_noise(speech)))}
    heard = {name: first_verified_logits(RecordingCloud, thinkers, sets[name], tmp_path / f"out-{name}", verifier)
             for name in sets}
    for _, spy in heard.values():
        assert spy.feature_keys[0] == ("feature_attention_mask", "input_features")
    assert (heard["speech"][0] - heard["noise"][0]).abs().max() > 1e-2
    # Control: a verifier that drops the features (the deaf-verifier bug) sees the same logits for
    # both clips, so the assertion above is what catches it.
    deaf = {name: first_verified_logits(DeafCloud, thinkers, sets[name], tmp_path / f"deaf-{name}", verifier)[0]
            for name in sets}
    torch.testing.assert_close(deaf["speech"], deaf["noise"], atol=1e-6, rtol=0)


def broken_manifest(folder) -> str:
    """One good sample and three bad ones: a missing file, a corrupt file, a 31 s clip."""
    folder.mkdir(parents=True)
    (folder / "corrupt.wav").write_bytes(b"RIFF\x24\x00\x00\x00WAVEjunk" + bytes(64))
    soundfile.write(folder / "long.flac", np.zeros(31 * 16000, dtype=np.float32), 16000)
    return manifest(folder, {"good": shipped("en-06"), "missing": None, "corrupt": "corrupt.wav", "long": "long.flac"})


def test_bad_samples_fail_alone_in_a_run_and_a_rerun_redoes_only_them(thinkers, tmp_path, capsys):
    prompts, out = broken_manifest(tmp_path / "set"), tmp_path / "out"
    assert run_cli("spec", thinkers, prompts, out) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: 3 of 4 samples failed, e.g. sample 'missing': audio missing.flac not found"), err
    assert "fix them and rerun to redo only those" in err[-1]
    status = {r["id"]: r for r in rows(out)}
    assert status["good"]["status"] == "ok" and status["good"]["new_tokens"] == 10
    failing = ("missing", "corrupt", "long")
    assert {i: status[i]["status"] for i in failing} == dict.fromkeys(failing, "failed")
    assert "cannot be decoded" in status["corrupt"]["error"] and "over the 30 s cap" in status["long"]["error"]
    assert status["long"]["reference"] == "hello world" and status["long"]["k"] == 3  # the point, for the record
    # Fix two files; the rerun redoes the three failed samples only, and one still fails.
    soundfile.write(tmp_path / "set" / "missing.flac", shipped("en-07"), 16000)
    soundfile.write(tmp_path / "set" / "long.flac", shipped("en-07")[:16000], 16000)
    assert run_cli("spec", thinkers, prompts, out) == 2
    assert "1 of 3 samples failed, e.g. sample 'corrupt'" in capsys.readouterr().err
    redone = rows(out)[4:]
    assert [(r["id"], r["status"]) for r in redone] == [("missing", "ok"), ("corrupt", "failed"), ("long", "ok")]


def test_the_length_cap_is_a_run_setting(thinkers, tmp_path):
    prompts = manifest(tmp_path / "set", {"clip": shipped("en-01")})  # 3.1 s
    engine = Engine(mode="cloud", cloud=thinkers["cloud"], dtype="float32", decode=DecodeConfig(max_new_tokens=4),
                    log=lambda m: None)
    with pytest.raises(FailedSamples,
                       match=r"1 of 1 samples failed, e.g. sample 'clip': audio clip.flac is 3.1 s, over the 2 s cap") as caught:
        run(engine, prompts, tmp_path / "out", progress=False, max_audio_s=2.0)
    assert [r["status"] for r in caught.value.rows] == ["failed"]
    assert run(engine, prompts, tmp_path / "out", progress=False, max_audio_s=4.0)[0]["status"] == "ok"


def test_bad_samples_fail_alone_in_a_sweep(thinkers, tmp_path, capsys):
    prompts = broken_manifest(tmp_path / "set")
    out = tmp_path / "sweep"
    code = main(["sweep", "--edge", thinkers["edge"], "--cloud", thinkers["cloud"], "--prompts", prompts,
                 "--out", str(out), "--mode", "cloud,spec", "--k", "3", "--entropy-threshold", "0", "--policy", "greedy",
                 "--max-new-tokens", "8", "--dtype", "float32"])
    assert code == 0, capsys.readouterr().err
    results = rows(out)
    assert len(results) == 8  # 2 points x 4 samples
    for row in results:
        assert row["status"] == ("ok" if row["id"] == "good" else "failed"), row
        if row["status"] == "failed":
            assert row["error"].startswith(f"sample '{row['id']}': audio ")
    good = {r["mode"]: r["tokens"] for r in results if r["id"] == "good"}
    assert good["spec"] == good["cloud"]
    summary = (out / "summary.csv").read_text().splitlines()
    assert {"wer", "cer"} <= set(summary[0].split(","))
    assert "2 ok" in capsys.readouterr().err


def test_the_shipped_samples_run_by_name(thinkers, tmp_path):
    assert run_cli("edge", thinkers, "audio-samples", tmp_path / "out", "--limit", 2) == 0
    assert ([(r["id"], r["status"], r["language"]) for r in rows(tmp_path / "out")]
            == [("en-01", "ok", "en"), ("en-02", "ok", "en")])
