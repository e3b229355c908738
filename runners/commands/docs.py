"""`quest docs [--build DIR] [--addr HOST:PORT]`: the documentation site (MkDocs, ``docs/mkdocs.yml``), served
locally with live reload, or built into a folder.

``quest docs`` runs ``mkdocs serve -f docs/mkdocs.yml`` and prints the address to open (http://127.0.0.1:8000 by
default); ``quest docs --build site`` runs ``mkdocs build --strict`` into ``site/``, as CI does, so that a broken
link or anchor is an error. MkDocs empties the folder it builds into, so DIR must be new, empty or one this command
built before (it leaves a ``.quest-docs-build`` file there); any other folder is refused and nothing in it is
touched. An address whose port is out of range, in use or on a host not of this machine is refused before MkDocs
starts. MkDocs, its Material theme and mkdocstrings come with the ``test`` extra (``pip install -e '.[test]'``);
without them this is a one-line error (exit 2).
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import socket
import subprocess
import sys
from pathlib import Path

from common.arguments import CommandParser, whole
from common.errors import ConfigError

CONFIG = Path(__file__).resolve().parents[2] / "docs" / "mkdocs.yml"
NEEDED = ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python")
DEFAULT_ADDR = "127.0.0.1:8000"
MARKER = ".quest-docs-build"  # a hidden file, which mkdocs keeps when it empties the folder


def command(build: str | None = None, addr: str | None = None) -> list[str]:
    """The mkdocs command line this runs."""
    if build is not None:
        return [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-f", str(CONFIG), "-d", str(Path(build).resolve())]
    return [sys.executable, "-m", "mkdocs", "serve", "-f", str(CONFIG), *(["-a", addr] if addr else [])]


def address(text: str) -> str:
    """An argparse type: ``HOST:PORT``, the port a whole number from 1 to 65535."""
    host, colon, port = text.rpartition(":")
    if not colon or not host:
        raise argparse.ArgumentTypeError(f"must be HOST:PORT, got {text!r}")
    try:
        whole(1, 65_535)(port)
    except argparse.ArgumentTypeError as err:
        raise argparse.ArgumentTypeError(f"the port {err}") from None
    return text


def check_free(addr: str) -> None:
    """Refuse an address mkdocs could not serve on (a port in use, a host not of this machine) in one line, before
    it starts: it would end in a traceback. Bound as a server binds it, so a port just closed is free here too."""
    host, _, port = addr.rpartition(":")
    try:
        family, kind, _, _, where = socket.getaddrinfo(host.strip("[]"), int(port), type=socket.SOCK_STREAM)[0]
        with socket.socket(family, kind) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(where)
    except OSError as err:
        raise ConfigError(f"cannot serve on {addr} ({err.strerror or err}); give another with --addr HOST:PORT") from None


def claim(folder: Path) -> None:
    """Make ``folder`` this command's to build into, or refuse it in one line: mkdocs empties it first, so it must be
    new, empty or built into before (``MARKER``), never a folder of something else (a sweep's runs)."""
    if folder.exists() and not (folder / MARKER).is_file():
        if not folder.is_dir():
            raise ConfigError(f"{folder} is a file, not a folder to build the site into")
        if any(folder.iterdir()):
            raise ConfigError(f"{folder} holds files that quest docs did not build, and mkdocs empties the folder it "
                              "builds into: give a new or empty folder")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / MARKER).write_text("built by quest docs --build: it may empty this folder and build the site again\n")


def main(argv: list[str]) -> int:
    parser = CommandParser("quest docs", __doc__)
    parser.add_argument("--build", metavar="DIR", type=Path,
                        help="build the site into DIR (new, empty or built into before) in strict mode instead of serving it")
    parser.add_argument("--addr", metavar="HOST:PORT", type=address, default=DEFAULT_ADDR,
                        help=f"where to serve it (default {DEFAULT_ADDR})")
    args = parser.parse_args(argv)
    if missing := [name for name in NEEDED if importlib.util.find_spec(name.split(".")[0]) is None]:
        raise ConfigError(f"quest docs needs {', '.join(missing)}: pip install -e '.[test]'")
    if not CONFIG.is_file():
        raise ConfigError(f"{CONFIG} is missing: quest docs runs from a checkout of the project")
    if args.build is not None:
        claim(args.build)
    else:
        check_free(args.addr)
    quiet = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # Material's banner about its successor, on every call
    return subprocess.run(command(args.build, args.addr), env=quiet).returncode
