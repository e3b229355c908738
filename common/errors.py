"""The project's user-input errors, importable without torch: the CLI catches them before any heavy import.

Failure policy (README, "When things go wrong"): a ``ConfigError`` or ``DataError`` is the user's to fix;
it is found before a run directory is created, printed as one line, and exits with status 2."""


class ConfigError(ValueError):
    """A config the runner cannot use; its message is one line."""


class DataError(Exception):
    """Bad or missing input data; the runner prints it as one line."""
