"""The registries and protocols of draft stop rules and k schedules (see the package docstring).
Each rule file registers itself; the package imports them all."""
from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch

from specdec.errors import ConfigError


class DraftStop(Protocol):
    def __call__(self, dist: torch.Tensor, entropy_nats: float) -> bool:
        """After drafting a token from `dist` [V]: end the block here?"""
        ...


class KSchedule(Protocol):
    k: int  # the next block's cap, in [1, k_max]

    def update(self, drafted: int, accepted: int) -> None:
        """After a verified block of `drafted` tokens of which `accepted` survived."""
        ...


def block_size(k: int, remaining: int) -> int:
    """Draft tokens for the next block. Near the budget, leave one slot for the cloud's correction
    or bonus token (as HF's assisted generation does): drafting the token the bonus supplies
    anyway costs an edge step for nothing."""
    return max(1, min(k, remaining - 1))


STOPS: dict[str, Callable[[float], DraftStop]] = {}  # name -> factory(parameter)
SCHEDULES: dict[str, Callable[[int], KSchedule]] = {}  # name -> factory(k_max)
STOP_HELP = "none, entropy:NATS (stop after a token whose entropy >= NATS) or pmin:P (top-1 probability < P)"


def register_stop(name: str):
    def add(factory):
        STOPS[name] = factory
        return factory
    return add


def register_schedule(name: str):
    def add(factory):
        SCHEDULES[name] = factory
        return factory
    return add


def parse_stop(text: str) -> tuple[str, float | None]:
    """'none' | 'entropy:2.5' | 'pmin:0.4' -> (name, parameter), validated."""
    name, sep, value = text.strip().partition(":")
    if name == "none" and not sep:
        return "none", None
    if name not in STOPS or not sep:
        raise ConfigError(f"unknown draft stop rule {text!r}: use {STOP_HELP}")
    try:
        parameter = float(value)
    except ValueError:
        raise ConfigError(f"draft stop rule {text!r}: {value!r} is not a number; use {STOP_HELP}") from None
    STOPS[name](parameter)  # the factory validates its range
    return name, parameter


def make_stop(text: str) -> DraftStop | None:
    name, parameter = parse_stop(text)
    return None if parameter is None else STOPS[name](parameter)  # parse_stop: no parameter for "none" only


def make_schedule(name: str, k_max: int) -> KSchedule:
    if name not in SCHEDULES:
        raise ConfigError(f"unknown k schedule {name!r}: use one of {', '.join(SCHEDULES)}")
    return SCHEDULES[name](k_max)
