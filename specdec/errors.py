"""Errors a user can act on. Each message names the problem and the fix, in one line."""


class SpecdecError(Exception):
    """Base class: the CLI prints `error: <message>` and exits with code 2."""


class ConfigError(SpecdecError, ValueError):
    """A setting is out of range or inconsistent (k < 1, threshold outside [0, 1], ...)."""


class InputError(SpecdecError, ValueError):
    """A prompt, prompt file or audio input is missing or malformed."""


class ModelError(SpecdecError):
    """A model name cannot be resolved, fetched or loaded."""
