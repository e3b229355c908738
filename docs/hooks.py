"""MkDocs hooks of the documentation site (docs/mkdocs.yml): the pages are the Markdown files of docs/ itself,
beside the config (MkDocs wants its docs_dir to be a child folder: ``assets/``, which holds the stylesheet), and two
reference pages are generated from the code at every build, so they cannot fall behind it: every `quest` command's
``--help`` (reference/cli.md) and every config key of the schema, with its default, range and comment
(reference/config.md)."""
from __future__ import annotations

import contextlib
import importlib
import io
import re
import typing
from pathlib import Path

from mkdocs.structure.files import File

DOCS = Path(__file__).resolve().parent
SKIP = {"assets", "examples"}  # folders of docs/ that hold no pages


def on_config(config):
    snippets = config.mdx_configs.setdefault("pymdownx.snippets", {})
    snippets["base_path"] = [str(DOCS)]  # `--8<-- "examples/..."` from wherever mkdocs runs
    return config


def on_files(files, config):
    for path in sorted(DOCS.rglob("*.md")):
        relative = path.relative_to(DOCS)
        if relative.parts[0] not in SKIP:
            files.append(File(relative.as_posix(), str(DOCS), config.site_dir, config.use_directory_urls))
    for path in sorted((DOCS / "examples").rglob("*")):  # the guides' code, linked where they include it
        if path.is_file() and "__pycache__" not in path.parts:
            files.append(File(path.relative_to(DOCS).as_posix(), str(DOCS), config.site_dir, config.use_directory_urls))
    files.append(File.generated(config, "reference/cli.md", content=cli_page()))
    files.append(File.generated(config, "reference/config.md", content=config_page()))
    files.append(File.generated(config, "reference/sweep.md", content=sweep_page()))
    return files


def _help(main) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        main(["--help"])
    return out.getvalue().rstrip()


def cli_page() -> str:
    from runners import cli
    from runners.commands import COMMANDS, GROUPS

    lines = ["# Command line", "", "Generated from the code at every build: `quest --help`, then each command's "
             "`--help`. Exit status: 0 ok (a diverged run is a result), 1 a run failed, 2 the input is wrong, "
             "128 + N stopped by signal N ([When things go wrong](../guides/failures.md)).", "",
             "```text", cli.overview(), "```", ""]
    import runners.config  # noqa: F401  (the project's domains)
    from common.registry import domain_names, get_domain

    sections = [(group, [(name, f"runners.commands.{COMMANDS[name]}") for name in names]) for group, names in GROUPS]
    sections.append(("from the domains", [(name, module) for domain in domain_names()
                                          for name, module in get_domain(domain).commands.items()]))
    for group, commands in sections:
        lines += [f"## {group.capitalize()}", ""]
        for name, module in commands:
            try:
                text = _help(importlib.import_module(module).main)
            except Exception as err:  # noqa: BLE001  (an optional extra missing where the site is built)
                text = f"(help not available here: {type(err).__name__}: {err})"
            lines += [f"### `quest {name}`", "", "```text", text, "```", ""]
    return "\n".join(lines)


def _escape(text: str) -> str:
    """A docstring's text for a table cell: ``|`` escaped, and ``<placeholder>`` outside code spans as text, which a
    browser would otherwise take for an HTML tag and drop ("Runs land in ///seed-.")."""
    parts = re.split(r"(`[^`]*`)", text.replace("|", "\\|"))
    return "".join(part if part.startswith("`") else part.replace("<", "&lt;").replace(">", "&gt;") for part in parts)


def _limits(field) -> str:
    """A field's range (``>= 1``) in words, wherever its type holds it (``int | None`` too)."""
    words = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}
    annotation = field.annotation
    items = list(field.metadata)
    for option in typing.get_args(annotation) if typing.get_origin(annotation) is not typing.Literal else ():
        items += list(getattr(option, "__metadata__", ()))
    found = [f"{words[name]} {getattr(item, name)}" for item in items for name in words
             if getattr(item, name, None) is not None]
    return ", ".join(found)


def table(section, prefix: str, skip: tuple = ()) -> list[str]:
    """A section's keys (``section``: its model, or a default of it) as a table, then each nested section's."""
    from common.typed import Model
    from runners.config import type_name

    rows = ["| key | type | default | allowed | what |", "|---|---|---|---|---|"]
    nested = []
    cls = section if isinstance(section, type) else type(section)
    for name, field in cls.model_fields.items():
        value = field.get_default(call_default_factory=True) if isinstance(section, type) else getattr(section, name)
        if name in skip:
            continue
        if isinstance(value, Model) and value.model_fields:
            nested.append((f"{prefix}{name}", value))
            continue
        default = "(required)" if field.is_required() and isinstance(section, type) else repr(value)
        rows.append(f"| `{prefix}{name}` | {_escape(type_name(field.annotation))} | {_escape(f'`{default}`')} | "
                    f"{_escape(_limits(field))} | {_escape(' '.join((field.description or '').split()))} |")
    out = rows + [""] if len(rows) > 2 else []
    for name, value in nested:
        out += [f"### `{name}`", "", _escape(" ".join((type(value).__doc__ or "").split())), "", *table(value, f"{name}.")]
    return out


def config_page() -> str:
    import runners.config  # noqa: F401  (the project's domains)
    from common import schema
    from common.registry import domain_schema, package_domains

    lines = ["# Config keys", "",
             "Generated from the typed config at every build (`common/schema.py`, and each domain's "
             "`domains/<name>/config.py`): each section of a run's config, its keys, their types, defaults and "
             "allowed values. A run composes its domain's defaults, its preset (`configs/domain/<name>.yaml`), the "
             "variant (`attention=<name>`) and `key=value` overrides ([Run one domain](../guides/run.md)).", "",
             "## Every run", "", *table(schema.RunConfig, "", skip=("task",))]
    for name in sorted(package_domains()):
        config = domain_schema(name)[0]
        lines += [f"## {name}", "", _escape(" ".join((config.__doc__ or "").split())), ""]
        for section, field in config.model_fields.items():
            if section in schema.RunConfig.model_fields and field.default == schema.RunConfig.model_fields[section].default:
                continue  # the shared section, at the shared defaults: in the first table
            doc = " ".join((type(field.default).__doc__ or "").split())
            lines += [f"### `{section}`", "", _escape(doc), "", *table(field.default, f"{section}.")]
    return "\n".join(lines)


def sweep_page() -> str:
    from runners.sweeps import spec

    return "\n".join([
        "# Sweep file keys", "",
        "Generated from the typed sweep file at every build (`runners/sweeps/spec.py`): each key a file in "
        "`configs/sweep/` (or any path given to `quest sweep`) may hold, its type, default, allowed values and meaning. "
        "An unknown key, or a value of another kind, is one line naming the file and the key "
        "([Sweeps and clusters](../guides/sweeps.md)).", "",
        "## Top level", "", *table(spec.Sweep, "", skip=("select",)),
        "## `select`", "", _escape(" ".join((spec.Select.__doc__ or "").split())), "", *table(spec.Select, "select.")])

