"""Command-line options generated from the config dataclasses, as optimum-benchmark does: one flag
per field, with the field's type, default, help and choices, so `run`, `profile` and `sweep` offer
the same settings and a setting added to specdec/core/config.py reaches all three.

    --name-with-dashes   one per field (plus any `flags` the field's metadata lists as aliases);
                         a bool is one switch with both spellings, --NAME and --no-NAME
                         (argparse.BooleanOptionalAction)
    run, profile         EngineConfig + PromptInputs (+ --out) + SpecConfig + DecodeConfig
    sweep                SweepConfig: grid axes take comma-separated lists, and no flag has a
                         default, so a TOML config is overridden only by the flags given
"""
from __future__ import annotations

import argparse
import types
import typing
from collections.abc import Callable
from dataclasses import MISSING, Field, dataclass, fields
from enum import StrEnum
from pathlib import Path
from typing import Any

from bench.core.folder import canonical_path
from bench.core.point import AXES, RUN_SETTINGS
from bench.core.prompts import PromptInputs, canonical_prompts
from bench.measure.runtime_auto import AUTO, AUTO_FIELDS
from bench.measure.sweep.sweep_config import SweepConfig
from specdec.core.config import DecodeConfig, DeployConfig, EngineConfig, SpecConfig, parse_overlap
from specdec.engine import Engine
from specdec.errors import ConfigError
from specdec.settings import Overlap

# Where each setting is defined (its help, choices and aliases), for the sweep's copy of it.
DEFINED_IN = {f.name: f for cls in RUN_SETTINGS for f in fields(cls)}


def parse_float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None


def parse_list(text: str) -> list[str]:
    """Comma-separated values. A custom network spec keeps its own commas: 'none,rtt=20ms,up=5mbit,
    down=20mbit' is two values (a `key=value` item continues the spec before it, unless it is `rtt=`)."""
    items: list[str] = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        continues = "=" in item and not item.lower().startswith("rtt=") and items and "=" in items[-1]
        if continues:
            items[-1] += "," + item
        else:
            items.append(item)
    return items


PARSERS: dict[type, Callable[[str], Any]] = {int: int, float: parse_float, str: str, Path: Path}


def parser_of(kind: type) -> Callable[[str], Any]:
    """The parser of one flag value of type `kind`. A setting's enum takes its word (argparse checks the field's
    choices, the config's __post_init__ parses it into the enum)."""
    return PARSERS[str if isinstance(kind, type) and issubclass(kind, StrEnum) else kind]


def parse_overlap_flag(text: str) -> bool | Overlap:
    try:
        return parse_overlap(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not auto, true or false") from None


@dataclass(frozen=True)
class Option:
    """One flag for one dataclass field."""

    name: str  # the field's name = argparse's dest
    flags: tuple[str, ...]  # the first is the one written back by `argv`
    action: str  # "store" | "switch" (--NAME / --no-NAME) | "tristate" (--NAME [VALUE] / --no-NAME)
    parse: Callable[[str], Any] | None
    default: Any
    required: bool
    help: str | None
    choices: tuple | None

    def add_to(self, parser: argparse.ArgumentParser) -> None:
        extra: dict[str, Any] = {"dest": self.name, "default": self.default, "help": self.help}
        if self.action == "store":
            extra.update(type=self.parse, required=self.required, choices=self.choices)
        elif self.action == "tristate":  # --overlap auto|true|false; bare --overlap is true, --no-overlap false
            extra.update(type=self.parse, nargs="?", const=True)
            parser.add_argument("--no-" + self.flags[0].removeprefix("--"), dest=self.name, action="store_const",
                                const=False, default=self.default, help=argparse.SUPPRESS)
        else:
            extra.update(action=argparse.BooleanOptionalAction)
        parser.add_argument(*self.flags, **extra)

    def argv(self, value: Any) -> list[str]:
        """The flags that give `value`; nothing for the default."""
        if value is None or (value == self.default and not self.required):
            return []
        if self.action == "switch" or (self.action == "tristate" and isinstance(value, bool)):
            return [self.flags[0] if value else "--no-" + self.flags[0].removeprefix("--")]
        return [self.flags[0], str(value)]


def _then(first: Callable[[str], Any], second: Callable[[Any], Any]) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        return second(first(text))
    return parse


def _value_type(hint: Any) -> type:
    """The type of one value: `int` -> int, `float | None` -> float, `tuple[int, ...]` -> int."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        args = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        if len(args) > 1:  # `bool | str` (overlap): its field's metadata names its parser
            return hint
        (hint,) = args
    return typing.get_args(hint)[0] if typing.get_origin(hint) is tuple else hint


def _flags(f: Field, source: Field) -> tuple[str, ...]:
    return (f"--{f.name.replace('_', '-')}", *source.metadata.get("flags", ()))


def field_options(cls: type) -> list[Option]:
    """The run-style options of a config dataclass: typed, with the field's default. A field that
    copies a run setting (`dtype: str = EngineConfig.dtype`) takes that setting's help, choices and
    aliases; a tuple field takes a comma-separated list."""
    hints, options = typing.get_type_hints(cls), []
    for f in fields(cls):
        if not f.init or f.metadata.get("flag") is False:  # set otherwise (serve's token: from --token-file)
            continue
        source = f if f.metadata.get("help") else DEFINED_IN.get(f.name, f)
        kind = _value_type(hints[f.name])
        required = f.default is MISSING and f.default_factory is MISSING
        default = None if required else f.default
        help_text, choices = source.metadata.get("help"), source.metadata.get("choices")
        if source.metadata.get("parse") == "overlap":
            options.append(Option(f.name, _flags(f, source), "tristate", parse_overlap_flag, default, False, help_text, None))
        elif kind is bool:  # one switch, both spellings: `--overlap` and `--no-overlap`
            options.append(Option(f.name, _flags(f, source), "switch", None, default, False, help_text, None))
        else:
            parse = parser_of(kind)
            if canonical := source.metadata.get("canonical"):  # an old name is today's before choices are checked
                parse = _then(parse, canonical)
            parse = _comma_list(parse) if typing.get_origin(hints[f.name]) is tuple else parse
            options.append(Option(f.name, _flags(f, source), "store", parse, default, required, help_text, choices))
    return options


def _comma_list(parse: Callable[[str], Any]) -> Callable[[str], tuple]:
    def parse_all(text: str) -> tuple:
        try:
            return tuple(parse(item) for item in parse_list(text))
        except (ValueError, argparse.ArgumentTypeError):
            raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list, e.g. 1,2,4") from None

    return parse_all


def sweep_options() -> list[Option]:
    """Every SweepConfig field as a flag without a default; an axis takes a comma-separated list."""
    hints, options = typing.get_type_hints(SweepConfig), []
    for f in fields(SweepConfig):
        if f.metadata.get("toml_only"):  # a list of tables has no flag: the config file gives it
            continue
        source = DEFINED_IN.get(f.name, f)
        kind = _value_type(hints[f.name])
        help_text = f.metadata.get("help") or source.metadata.get("help")
        choices = source.metadata.get("choices")
        if f.name in AXES:
            described = "one grid axis, comma-separated" + (f": {help_text}" if help_text else "")
            described += f"; each one of {', '.join(choices)}" if choices else ""
            options.append(Option(f.name, _flags(f, source), "store", parse_list, None, False, described, None))
        elif kind is bool:
            options.append(Option(f.name, _flags(f, source), "switch", None, None, False, help_text, None))
        else:
            parse = parser_of(kind)
            if canonical := source.metadata.get("canonical"):  # an old name is today's before choices are checked
                parse = _then(parse, canonical)
            parse = _comma_list(parse) if typing.get_origin(hints[f.name]) is tuple else parse
            options.append(Option(f.name, _flags(f, source), "store", parse, None, False, help_text, choices))
    return options


RUN_OUT = Option("out", ("--out",), "store", Path, None, True, "results directory (rerun to resume)", None)


def run_options() -> list[Option]:
    engine, prompts, spec, decode, deploy = (field_options(cls) for cls in RUN_SETTINGS)
    return [*engine, *prompts, RUN_OUT, *spec, *decode, *deploy]


def add_run_options(parser: argparse.ArgumentParser) -> None:
    for option in run_options():
        option.add_to(parser)


def run_argv(args: argparse.Namespace, out: Path) -> list[str]:
    """`specbench run` arguments equal to the run options in `args`, with --out replaced."""
    values = {**vars(args), "out": out}
    return [flag for option in run_options() for flag in option.argv(values.get(option.name))]


def values(cls: type, args: argparse.Namespace) -> dict[str, Any]:
    """The fields of `cls` read from `args` (which has an attribute of the same name for each)."""
    return {f.name: getattr(args, f.name) for f in fields(cls)
            if f.init and not f.metadata.get("toml_only") and f.metadata.get("flag") is not False}


def engine_from_args(args: argparse.Namespace, log: Callable[[str], object]) -> Engine:
    """The engine of `run` and `profile`, its settings validated; local model folders and the token
    file as resolved paths (one folder, one name in the records and the results folder's identity)."""
    spec, decode = SpecConfig(**values(SpecConfig, args)), DecodeConfig(**values(DecodeConfig, args))
    deploy = DeployConfig(**{**values(DeployConfig, args), "token_file": canonical_path(args.token_file)})
    engine = {**values(EngineConfig, args), "edge": canonical_path(args.edge), "cloud": canonical_path(args.cloud)}
    return Engine(**engine, spec=spec, decode=decode, deploy=deploy, log=log)


def inputs_from_args(args: argparse.Namespace) -> PromptInputs:
    """The prompt settings of `run` and `profile`, validated; a prompts file as its resolved path."""
    return PromptInputs(**{**values(PromptInputs, args), "prompts": canonical_prompts(args.prompts)})


def add_sweep_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, help="TOML sweep config (keys as below, with underscores); flags override it")
    parser.add_argument("--out", required=True, type=Path, help="results directory (rerun to resume)")
    for option in sweep_options():
        option.add_to(parser)


def check_flag_values(overrides: dict[str, Any]) -> None:
    """Each value a flag gives a setting with named choices is one of them (`auto` too for a runtime axis, which the
    calibration resolves), named as the flags' before a config file is read: a bad flag is not the file's fault."""
    for name, given in overrides.items():
        defined = DEFINED_IN.get(name) or next((f for f in fields(SweepConfig) if f.name == name), None)
        choices = defined.metadata.get("choices") if defined is not None else None
        if choices is None or not all(isinstance(c, str) for c in choices):
            continue
        for value in given if isinstance(given, (list, tuple)) else (given,):
            if isinstance(value, str) and value not in choices and not (value == AUTO and name in AUTO_FIELDS):
                raise ConfigError(f"the sweep options: unknown {name} {value!r}: use one of {', '.join(choices)}")


def sweep_from_args(args: argparse.Namespace, choose_runtimes=None) -> SweepConfig:
    """The sweep config: the TOML file (if any) with the flags given on top; `auto` runtimes resolved by
    `choose_runtimes` (bench/measure/runtime_auto.py)."""
    overrides = {name: value for name, value in values(SweepConfig, args).items() if value is not None}
    check_flag_values(overrides)
    if args.config:
        return SweepConfig.from_toml(args.config, choose_runtimes=choose_runtimes, **overrides)
    return SweepConfig.from_mapping(overrides, choose_runtimes=choose_runtimes)
