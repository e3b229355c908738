"""MkDocs hooks of the documentation site (docs/mkdocs.yml): the pages are the Markdown files of docs/ itself,
beside the config (MkDocs wants its docs_dir to be a child folder: ``assets/``, which holds the stylesheet), and two
reference pages are generated from the code at every build, so they cannot fall behind it: every `quest` command's
``--help`` (reference/cli.md) and every config key of the schema, with its default, range and comment
(reference/config.md)."""
from __future__ import annotations

import ast
import contextlib
import dataclasses
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
    files.append(File.generated(config, "reference/cli.md", content=cli_page()))
    files.append(File.generated(config, "reference/config.md", content=config_page()))
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
             "128 + N stopped by signal N ([When things go wrong](../failures.md)).", "",
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


def _comments(source: str) -> dict[tuple[str, str], str]:
    """(class, field) -> the comment on the field's line, or in the lines just above it."""
    tree, rows = ast.parse(source), source.splitlines()
    found = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    line = rows[item.lineno - 1]
                    above, row = [], item.lineno - 2
                    while row >= 0 and rows[row].strip().startswith("#"):
                        above.insert(0, rows[row].strip().lstrip("# "))
                        row -= 1
                    text = line.split("  # ", 1)[1] if "  # " in line else " ".join(above)
                    found[(node.name, item.target.id)] = text.strip()
    return found


def _escape(text: str) -> str:
    return text.replace("|", "\\|")


def _type(hint) -> str:
    return re.sub(r"\b(typing|builtins)\.", "", str(hint)).replace("<class '", "").replace("'>", "")


def config_page() -> str:
    from common import schema

    comments = _comments(Path(schema.__file__).read_text())
    lines = ["# Config keys", "",
             "Generated from `common/schema.py` at every build: each section of a run's config, its keys, their "
             "types, defaults and allowed values. A run composes the schema's defaults, then "
             "`configs/domain/<name>.yaml`, its preset, the variant (`attention=<name>`) and `key=value` overrides "
             "([Run one domain](../guides/run.md)). The domains' own sections (`data`, `model`, `task`, "
             "`robustness`) take their keys from each domain's file; the ranges of the keys several share are in "
             "the last tables.", ""]

    def table(cls, prefix: str) -> list[str]:
        rows = ["| key | type | default | allowed | what |", "|---|---|---|---|---|"]
        nested = []
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            kind = hints[f.name]
            if dataclasses.is_dataclass(kind):
                nested.append((f"{prefix}{f.name}", kind))
                continue
            default = f.default if f.default is not dataclasses.MISSING else (
                f.default_factory() if f.default_factory is not dataclasses.MISSING else "(required)")
            bounds = ", ".join(f"{schema.BOUNDS[k][0]} {v}" for k, v in f.metadata.get("bounds", {}).items())
            choices = ", ".join(f.metadata.get("choices", ()))
            rows.append(f"| `{prefix}{f.name}` | `{_escape(_type(kind))}` | `{default!r}` | {_escape(bounds or choices)} "
                        f"| {_escape(comments.get((cls.__name__, f.name), ''))} |")
        out = rows + [""]
        for name, kind in nested:
            doc = " ".join((kind.__doc__ or "").split())
            out = [*out, f"## `{name}`", "", _escape(doc), "", *table(kind, f"{name}.")]
        return out

    lines += ["## Top level", "", *table(schema.RunConfig, "")]
    for name, cls in schema.DOMAIN_SECTIONS.items():
        lines += [f"## `{name}` (the domains' own section: shared keys)", "", " ".join((cls.__doc__ or "").split()),
                  "", *table(cls, f"{name}.")]
    return "\n".join(lines)
