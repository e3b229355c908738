"""`quest docs [--build DIR] [--addr HOST:PORT]`: the documentation site (MkDocs, ``docs/mkdocs.yml``), served
locally with live reload, or built into a folder.

``quest docs`` runs ``mkdocs serve -f docs/mkdocs.yml`` and prints the address to open (http://127.0.0.1:8000 by
default); ``quest docs --build site`` runs ``mkdocs build --strict`` into ``site/``, as CI does, so that a broken
link or anchor is an error. MkDocs, its Material theme and mkdocstrings come with the ``test`` extra
(``pip install -e '.[test]'``); without them this is a one-line error (exit 2).
"""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

from common.arguments import CommandParser
from common.errors import ConfigError

CONFIG = Path(__file__).resolve().parents[2] / "docs" / "mkdocs.yml"
NEEDED = ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python")


def command(build: str | None = None, addr: str | None = None) -> list[str]:
    """The mkdocs command line this runs."""
    if build is not None:
        return [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-f", str(CONFIG), "-d", str(Path(build).resolve())]
    return [sys.executable, "-m", "mkdocs", "serve", "-f", str(CONFIG), *(["-a", addr] if addr else [])]


def main(argv: list[str]) -> int:
    parser = CommandParser("quest docs", __doc__)
    parser.add_argument("--build", metavar="DIR", help="build the site into DIR in strict mode instead of serving it")
    parser.add_argument("--addr", metavar="HOST:PORT", help="where to serve it (default 127.0.0.1:8000)")
    args = parser.parse_args(argv)
    if missing := [name for name in NEEDED if importlib.util.find_spec(name.split(".")[0]) is None]:
        raise ConfigError(f"quest docs needs {', '.join(missing)}: pip install -e '.[test]'")
    if not CONFIG.is_file():
        raise ConfigError(f"{CONFIG} is missing: quest docs runs from a checkout of the project")
    quiet = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # Material's banner about its successor, on every call
    return subprocess.run(command(args.build, args.addr), env=quiet).returncode
