"""Packages that one domain or feature alone needs, installed by the extra of pyproject.toml named after it
(``pip install 'quest-study[pointcloud]'``; ``all`` installs every one)."""
import importlib
from types import ModuleType

from common.errors import ConfigError, error_line


def install_command(extra: str) -> str:
    return f"pip install 'quest-study[{extra}]'"


def require(module: str, extra: str) -> ModuleType:
    """``module`` imported, or a one-line ``ConfigError`` naming the extra that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise ConfigError(f"{module} cannot be imported ({error_line(err)}); install it with {install_command(extra)}") from None
