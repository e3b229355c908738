"""`quest <command>`: the project's commands (``runners.commands``) and those the domains add (``quest
generate`` for language runs, ``quest imagenet`` for vision runs, the domains' benchmarks and reports), each with
``--help``; ``quest --help`` lists them in groups.

Exit status: 0 ok (a diverged run is a result), 1 a run failed, 2 the input is wrong (config, data, paths),
128 + N stopped by signal N (130: SIGINT, Ctrl-C; 143: SIGTERM, a scheduler's preemption).
Heavy packages (torch, Lightning, the domains) load only once the config's keys are known to be good, so a
mistyped key is answered before they load (a data path once the domain's loader runs).
"""
from __future__ import annotations

import ast
import importlib
import importlib.util
import os
import re
import signal
import sys
import traceback

from common.errors import ConfigError, DataError, Stopped
from runners.commands import COMMANDS, GROUPS


def find_command(name: str):
    """The ``main`` of a project command, or of a command a domain plugin registers; None if there is none."""
    if name in COMMANDS:
        return importlib.import_module(f"runners.commands.{COMMANDS[name]}").main
    import runners.config  # noqa: F401  (makes the project's domains package known)
    from common.registry import domain_commands

    target = domain_commands().get(name)
    return None if target is None else importlib.import_module(target).main


def main(argv: list[str] | None = None) -> int:
    from common.records import RecordError
    from runners import console

    console.escape_unencodable()
    console.show_project_warnings()
    console.quiet()
    argv = sys.argv[1:] if argv is None else argv
    try:
        entry = find_command(argv[0]) if argv else None
        if entry is None:
            asked = bool(argv) and argv[0] in ("-h", "--help")
            if argv and not asked:
                print(f"quest: error: no command {argv[0]!r}", file=sys.stderr)
            print(overview(), file=sys.stdout if asked else sys.stderr)
            return 0 if asked else 2
        code = entry(argv[1:])
        return code if isinstance(code, int) else 0  # a tool's main may return its measurements
    except (ConfigError, DataError, RecordError) as err:
        print(f"quest: error: {err}", file=sys.stderr)
        return 2
    except Stopped as stop:  # SIGINT or SIGTERM: stopped on purpose, not a crash
        print(f"quest: {stop}", file=sys.stderr)
        return stop.exit_code
    except BrokenPipeError:  # the reader left (`quest list | head`): as a shell's SIGPIPE, quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python's flush at exit would raise again
        return 128 + signal.SIGPIPE
    except KeyboardInterrupt:  # Ctrl-C outside a run (composing, importing)
        print("quest: stopped by SIGINT", file=sys.stderr)
        return 130
    except Exception as err:
        if (line := path_error(err)) is not None:
            print(f"quest: error: {line}", file=sys.stderr)
            return 2
        traceback.print_exc()  # not the user's input: keep the traceback for whoever debugs it
        print(f"quest: error: {type(err).__name__}: {err}", file=sys.stderr)
        return 1


def summary(module: str) -> str:
    """The first line of a command module's docstring, read from its source (nothing imported), without the
    `quest <name> ...` usage it may start with."""
    try:
        spec = importlib.util.find_spec(module)
        with open(spec.origin, encoding="utf-8") as source:
            doc = ast.get_docstring(ast.parse(source.read())) or ""
    except (ImportError, AttributeError, OSError, SyntaxError, TypeError, ValueError):
        return ""
    line = " ".join(doc.split("\n\n")[0].split())
    if line.startswith("`quest ") and "`: " in line:
        line = line.split("`: ", 1)[1]
    line = re.sub(r"\s*\([^()]*\)", "", line.split(". ")[0]).replace("``", "").rstrip(".")
    return line if len(line) <= 88 else line[:85].rstrip() + "..."


def overview() -> str:
    """``quest --help``: every command in its group, with the first line of its own help."""
    lines = ["usage: quest <command> [arguments] (each command takes --help)", ""]
    for group, names in GROUPS:
        lines.append(f"{group}:")
        lines += [f"  {name:18s} {summary(f'runners.commands.{COMMANDS[name]}')}" for name in names]
    import runners.config  # noqa: F401  (makes the project's domains package known)
    from common.registry import domain_names, get_domain

    lines.append("from the domains:")
    for domain in domain_names():
        try:
            commands = get_domain(domain).commands
        except Exception:  # noqa: BLE001  (a broken plugin: `quest list` says why)
            continue
        lines += [f"  {name:18s} {summary(module)} ({domain})" for name, module in commands.items()]
    lines += ["", __doc__.strip().split("\n\n", 1)[1]]
    return "\n".join(lines)


def path_error(err: Exception) -> str | None:
    """One line for an ``OSError`` on a path, None for any other error. A path reaches here given to the command,
    or as its output under one, where the system refuses it (permission denied, a name too long, a read-only
    folder, a file where a folder belongs, a full disk): the user's to fix, as wrong input is. A
    ``FileNotFoundError`` of the project's own names what is missing in its message."""
    if isinstance(err, OSError) and err.filename is not None:
        return f"{err.filename}{f' -> {err.filename2}' if err.filename2 else ''}: {err.strerror}"
    return str(err) if isinstance(err, FileNotFoundError) else None


if __name__ == "__main__":
    sys.exit(main())
