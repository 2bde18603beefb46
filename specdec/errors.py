"""Errors a user can act on. Each message names the problem and the fix, in one line."""
import signal

# Signals a process gets from its own native code going wrong (llama.cpp, a torch kernel); SIGKILL,
# SIGTERM or SIGINT come from outside (the OOM killer, a user) and say nothing about that code.
NATIVE_CRASH_SIGNALS = ("SIGSEGV", "SIGILL", "SIGBUS", "SIGFPE", "SIGABRT")


def signal_name(number: int) -> str:
    """`SIGSEGV` for 11; `signal 200` for a number this platform does not name."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


class SpecdecError(Exception):
    """Base class: the CLI prints `error: <message>` and exits with code 2."""


class ConfigError(SpecdecError, ValueError):
    """A setting is out of range or inconsistent (k < 1, threshold outside [0, 1], ...)."""


class InputError(SpecdecError, ValueError):
    """A prompt, prompt file or audio input is missing or malformed."""


class ModelError(SpecdecError):
    """A model name cannot be resolved, fetched or loaded."""
