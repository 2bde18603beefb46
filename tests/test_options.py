"""One source of truth for settings: the config dataclasses make the `run` and `sweep` flags, the
sweep carries every run setting, and policies and verifiers are known by their registries."""
from dataclasses import MISSING, fields

import pytest

from bench.cli import build_parser
from bench.commands.options import RUN_SETTINGS, parse_list, run_options, sweep_from_args, sweep_options
from bench.core.point import AXES
from bench.measure.sweep.sweep_config import SweepConfig
from specdec.core.config import SpecConfig
from specdec.core.policies import POLICIES, make_policy, register_policy
from specdec.core.verifier import VERIFIERS


def flags(options) -> set[str]:
    return {flag for option in options for flag in option.flags}


def test_sweep_takes_every_run_flag():
    sweep = flags(sweep_options())
    # A run's on/off switch (--no-overlap) is a grid axis in a sweep (--overlap true,false).
    missing = {f for f in flags(run_options()) - sweep - {"--out"} if f.replace("--no-", "--") not in sweep}
    assert not missing, f"`specbench run` flags that `specbench sweep` lacks: {sorted(missing)}"


def test_sweep_config_carries_every_run_setting_with_the_runs_default():
    sweep = {f.name: f for f in fields(SweepConfig)}
    for cls in RUN_SETTINGS:
        for f in fields(cls):
            assert f.name in sweep, f"{cls.__name__}.{f.name} cannot be set in a sweep"
            if f.default is MISSING or f.name in ("mode", "prompts"):  # the sweep's own defaults
                continue
            expected = (f.default,) if f.name in AXES else f.default
            assert sweep[f.name].default == expected, f"{f.name}: the sweep's default differs from the run's"


def test_flags_that_were_run_only_now_reach_the_sweep(tmp_path):
    args = build_parser().parse_args([
        "sweep", "--edge", "e", "--cloud", "c", "--out", str(tmp_path), "--mode", "spec", "--no-chat-template",
        "--uncertainty", "mean", "--punct-trigger", "0.4", "--k", "2,4", "--max-audio-seconds", "12"])
    config = sweep_from_args(args)
    assert (config.chat_template, config.uncertainty, config.punct_trigger, config.k) == (False, "mean", 0.4, (2, 4))
    assert config.max_audio_s == 12.0
    spec = config.spec_config(config.points()[0])
    assert (spec.uncertainty, spec.punct_trigger) == ("mean", 0.4)
    assert not config.engine_config(config.points()[0]).chat_template


def test_drafter_options_reach_a_run_and_a_sweep_point(tmp_path):
    """`--drafter-options NAME=VALUE,...` is SpecConfig.drafter_options; a sweep's points carry it."""
    args = build_parser().parse_args(["run", "--mode", "spec", "--prompts", "p", "--out", "o", "--drafter", "ngram",
                                      "--drafter-options", "min_count=2,max_ngram=3"])
    assert args.drafter_options == "min_count=2,max_ngram=3"
    args = build_parser().parse_args([
        "sweep", "--edge", "e", "--cloud", "c", "--out", str(tmp_path), "--mode", "spec", "--drafter", "prompt-lookup",
        "--drafter-options", "max_ngram=1"])
    config = sweep_from_args(args)
    assert config.spec_config(config.points()[0]).drafter_options == "max_ngram=1"


def test_sweep_flags_leave_the_toml_alone_unless_given(tmp_path):
    toml = tmp_path / "s.toml"
    toml.write_text("edge = 'e'\ncloud = 'c'\nchat_template = false\nmax_new_tokens = 7\nrlimit_as = true\n")
    args = build_parser().parse_args(["sweep", "--config", str(toml), "--out", str(tmp_path / "o"), "--k", "3"])
    config = sweep_from_args(args)
    assert (config.chat_template, config.max_new_tokens, config.rlimit_as, config.k) == (False, 7, True, (3,))


def test_run_defaults_are_the_configs():
    args = build_parser().parse_args(["run", "--mode", "edge", "--prompts", "p", "--out", "o"])
    for field in fields(SpecConfig):
        assert getattr(args, field.name) == field.default
    assert args.max_new_tokens == 64 and args.chat_template is True and args.dtype == "bfloat16"


def test_choices_come_from_the_registries(capsys):
    assert SpecConfig.__dataclass_fields__["policy"].metadata["choices"] is POLICIES  # the live registry
    assert set(POLICIES) == {"threshold", "greedy", "sample"} and set(VERIFIERS) == {"cached", "stateless"}
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--mode", "spec", "--prompts", "p", "--out", "o", "--policy", "typical"])
    assert "invalid choice: 'typical'" in capsys.readouterr().err


def test_every_registered_policy_is_a_setting_and_builds():
    for name in POLICIES:
        assert callable(make_policy(SpecConfig(policy=name).policy, 0.3))
    assert make_policy("threshold", 0.3).accept_threshold == 0.3
    with pytest.raises(ValueError, match="two policies are registered as 'greedy'"):
        register_policy("greedy")(lambda *args: None)


def test_a_custom_network_spec_keeps_its_commas_in_a_list():
    assert parse_list("none, 4g,rtt=20ms,up=5mbit,down=20mbit,wifi") == ["none", "4g", "rtt=20ms,up=5mbit,down=20mbit", "wifi"]
    assert parse_list("rtt=1ms,up=1mbit,down=1mbit,rtt=2ms,up=2mbit,down=2mbit") == [
        "rtt=1ms,up=1mbit,down=1mbit", "rtt=2ms,up=2mbit,down=2mbit"]
    assert parse_list("2,4,,6") == ["2", "4", "6"]


def test_a_switch_takes_both_spellings_in_run_and_sweep(tmp_path):
    """`run --overlap` was an error while the sweep axis is `--overlap true,false`: one switch now."""
    parse = build_parser().parse_args
    base = ["run", "--mode", "spec", "--edge", "e", "--cloud-url", "127.0.0.1:1", "--prompts", "p", "--out", "o"]
    assert parse(base).overlap == "auto" and parse([*base, "--overlap"]).overlap is True
    assert parse([*base, "--no-overlap"]).overlap is False
    assert [parse([*base, "--overlap", v]).overlap for v in ("auto", "true", "false", "off")] == ["auto", True, False, False]
    assert parse([*base, "--no-chat-template"]).chat_template is False
    sweep = ["sweep", "--edge", "e", "--cloud", "c", "--out", str(tmp_path)]
    assert parse([*sweep, "--chat-template"]).chat_template is True and parse(sweep).chat_template is None
    (switch,) = [o for o in run_options() if o.name == "overlap"]
    assert (switch.argv(False), switch.argv(True), switch.argv("auto")) == (["--no-overlap"], ["--overlap"], [])
    assert parse([*sweep, "--overlap", "auto,true,false"]).overlap == ["auto", "true", "false"]


def test_a_runtimes_old_name_is_todays_on_every_flag_and_a_wrong_one_is_refused(capsys, tmp_path):
    """`vnni-int4` (the kernels runtimes' name before they ran on every instruction set) still parses, as
    `kernels-int4`, in run and sweep, alone or in a PLAIN+BLOCKS pair; an unknown name stays argparse's error."""
    parse = build_parser().parse_args
    base = ["run", "--mode", "cloud", "--cloud", "c", "--prompts", "p", "--out", "o"]
    assert parse([*base, "--cloud-runtime", "vnni-int4"]).cloud_runtime == "kernels-int4"
    assert parse([*base, "--cloud-runtime", "llamacpp+vnni-int8"]).cloud_runtime == "llamacpp+kernels-int8"
    assert parse([*base, "--edge-runtime", "vnni-int4"]).edge_runtime == "kernels-int4"
    sweep = sweep_from_args(parse(["sweep", "--edge", "e", "--cloud", "c", "--out", str(tmp_path), "--mode", "cloud",
                                   "--cloud-runtime", "vnni-int4,llamacpp"]))
    assert sweep.cloud_runtime == ("kernels-int4", "llamacpp")
    with pytest.raises(SystemExit) as refused:
        parse([*base, "--cloud-runtime", "vnni-int9"])
    assert refused.value.code == 2 and "invalid choice: 'vnni-int9'" in capsys.readouterr().err
