"""MkDocs hooks of the documentation site (docs/mkdocs.yml): the pages are the Markdown files of docs/ itself,
beside the config (MkDocs wants its docs_dir to be a child folder: ``assets/``, which holds the stylesheet), and three
reference pages are generated from the code at every build, so they cannot fall behind it: every `quest` command's
``--help`` (reference/cli.md), every config key of the schema, with its default, range and comment
(reference/config.md), and every key of a sweep file (reference/sweep.md). The examples the guides include
(``examples/``) are served beside the pages, so a guide's link to one works on the site and on GitHub alike."""
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


CODE_SPAN = re.compile(r"(`+)(?!`).+?(?<!`)\1(?!`)")  # `code` or ``code``: Markdown shows it as written
LITERAL = str.maketrans({"\\": "\\\\", "`": "\\`", "*": "\\*", "_": "\\_", "[": "\\[", "]": "\\]", "|": "\\|",
                         "&": "&amp;", "<": "&lt;", ">": "&gt;"})


def _escape(text: str) -> str:
    """A docstring's text for a page, shown as written: outside its code spans (which Markdown shows as they are,
    a ``|`` too, even in a table) each character Markdown or HTML would act on is escaped, so that a
    ``<placeholder>`` is not taken for an HTML tag and dropped ("Runs land in ///seed-."), ``*`` or ``_`` pairs
    do not turn into emphasis (``<class>/*.off ... <class>/*``), a regex keeps its backslashes (``\\d+\\.png``)
    and a ``|`` does not end a table cell."""
    out, at = [], 0
    for span in CODE_SPAN.finditer(text):
        out += [text[at:span.start()].translate(LITERAL), span.group()]
        at = span.end()
    return "".join([*out, text[at:].translate(LITERAL)])


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
        if isinstance(value, Model) and type(value).model_fields:
            nested.append((f"{prefix}{name}", value, field.description))
            continue
        default = "(required)" if field.is_required() and isinstance(section, type) else repr(value)
        rows.append(f"| `{prefix}{name}` | {_escape(type_name(field.annotation))} | {_escape(f'`{default}`')} | "
                    f"{_escape(_limits(field))} | {_escape(' '.join((field.description or '').split()))} |")
    out = rows + [""] if len(rows) > 2 else []
    for name, value, description in nested:
        out += [f"### `{name}`", "", *section_docs(value, description), *table(value, f"{name}.")]
    return out


def section_docs(value, description: str | None) -> list[str]:
    """A section's paragraphs: its class's docstring, then what the field that holds it says (a domain's own
    defaults, say), each as written."""
    docs = [" ".join((doc or "").split()) for doc in (type(value).__doc__, description)]
    return [line for doc in docs if doc for line in (_escape(doc), "")]


def config_page() -> str:
    import runners.config  # noqa: F401  (the project's domains)
    from common import schema
    from common.registry import domain_schema, package_domains

    lines = ["# Config keys", "",
             "Generated from the typed config at every build (`common/schema.py`, and each domain's "
             "`domains/<name>/config.py`): each section of a run's config, its keys, their types, defaults and "
             "allowed values. A run composes its domain's defaults, its preset (`configs/domain/<name>.yaml`), the "
             "variant (`attention=<name>`) and `key=value` overrides ([Run one domain](../guides/run.md)).", "",
             "## Every run", "", *table(schema.RunConfig, "", skip=("task",)),
             f"`task`: {_escape(' '.join((schema.RunConfig.model_fields['task'].description or '').split()))} Each "
             "domain's `task` section is under its name below.", ""]
    for name in sorted(package_domains()):
        config = domain_schema(name)[0]
        lines += [f"## {name}", "", _escape(" ".join((config.__doc__ or "").split())), ""]
        for section, field in config.model_fields.items():
            if section in schema.RunConfig.model_fields and field.default == schema.RunConfig.model_fields[section].default:
                continue  # the shared section, at the shared defaults: in the first table
            lines += [f"### `{section}`", "", *section_docs(field.default, field.description),
                      *table(field.default, f"{section}.")]
    return "\n".join(lines)


def sweep_page() -> str:
    from runners.sweeps import spec

    return "\n".join([
        "# Sweep file keys", "",
        "Generated from the typed sweep file at every build (`runners/sweeps/spec.py`): each key a file in "
        "`configs/sweep/` (or any path given to `quest sweep`) may hold, its type, default, allowed values and meaning. "
        "An unknown key, or a value of another kind, is one line naming the file and the key "
        "([Sweeps and clusters](../guides/sweeps.md)).", "",
        "## Top level", "", _escape(" ".join((spec.Sweep.__doc__ or "").split())), "",
        *table(spec.Sweep, "", skip=("select",)),
        "## `select`", "", *(f"{_escape(' '.join((doc or '').split()))}\n" for doc in (
            spec.Select.__doc__, spec.Sweep.model_fields["select"].description)), *table(spec.Select, "select.")])

