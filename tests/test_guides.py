"""The guides' code, run: the domain of docs/guides/add-a-domain.md (docs/examples/counting) through the contract tests
and `quest train`, its split hashes; `quest --help`; the documentation site built in strict mode (a broken link or
anchor fails), and no `python -m` in the commands it documents. The variant of docs/guides/add-a-variant.md is checked
by tests/test_attention.py, with the study's own variants."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

from common import registry
from common.attention import VARIANTS
from common.registry import domain_names, get_domain
from runners.cli import main as cli
from runners.commands import COMMANDS, GROUPS, docs
from tests.test_domains import check_contract, check_smoke_run

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "docs" / "examples"


@pytest.fixture
def counting(monkeypatch):
    """The guide's domain, found as a package under a folder on the path, as domains/ is (the guide's last step
    copies it there)."""
    monkeypatch.syspath_prepend(str(EXAMPLES))
    monkeypatch.setattr(registry, "_PACKAGES", [*registry._PACKAGES, "counting"])
    monkeypatch.setattr(registry, "package_domains", lambda: {"counting": "counting"})
    sys.modules.pop("counting", None)
    yield "counting"
    registry.unregister_domain("counting")
    for name in [m for m in sys.modules if m == "counting" or m.startswith("counting.")]:
        sys.modules.pop(name)


def test_the_guide_domain_passes_the_contract_and_trains(counting, tmp_path):
    assert "counting" in domain_names() and get_domain("counting").datasets == ("generated",)
    for variant in VARIANTS:
        check_contract("counting", variant, tmp_path / "cache")
    record = check_smoke_run("counting", tmp_path / "runs", tmp_path / "cache")
    assert record.split["source"] == "generated"


def split_hashes(split_seed: int) -> dict:
    from counting.config import Data
    from counting.data import CountingData

    data = Data(vocab=4, length=6, train_size=8, val_size=4, test_size=4, batch_size=4, split_seed=split_seed)
    return CountingData(data).split_info["hash"]


def test_a_generated_split_tells_val_from_test_and_follows_split_seed(counting):
    """Generated samples are numbered 0, 1, ... in every split: their hash covers the split and its seed."""
    get_domain("counting")
    first, again, other = split_hashes(0), split_hashes(0), split_hashes(1)
    assert first == again
    assert first["val"] != first["test"]
    assert all(first[split] != other[split] for split in first)


def test_quest_help_lists_every_command_in_groups(capsys):
    assert cli(["--help"]) == 0
    out = capsys.readouterr().out
    assert {name for _, names in GROUPS for name in names} == set(COMMANDS)
    for group, names in GROUPS:
        assert f"{group}:" in out and all(re.search(rf"^  {name} ", out, re.M) for name in names)
    for name in ("generate", "imagenet", "graph-bench", "gcn-reference", "language-bench", "speech-bench",
                 "retrieval-report", "retrieval-aniso"):
        assert re.search(rf"^  {name} .*\(\w+\)$", out, re.M), name
    assert cli(["no-such-command"]) == 2


def documented_commands() -> list[str]:
    """Every shell line in a fenced block or inline code span of the README and the docs' pages."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    text = "\n".join(page.read_text() for page in pages)
    return re.findall(r"```(?:bash|sh|console)\n(.*?)```", text, re.S) + re.findall(r"`([^`\n]+)`", text)


def test_the_docs_document_quest_commands_only():
    """One command line: the documented tools are `quest` subcommands (the README's test command aside)."""
    found = [line for block in documented_commands() for line in block.splitlines()
             if "python -m " in line and "python -m pytest" not in line and "python -m venv" not in line]
    assert not found, found


def test_the_docs_build_in_strict_mode(tmp_path):
    """CI's check of the site (the test extra brings MkDocs): `quest docs --build` (mkdocs build --strict)
    succeeds, so no page links to a page or an anchor that is not there, every snippet of docs/examples/ is found,
    and the generated reference pages (command line, config keys, API) build."""
    out = subprocess.run(docs.command(build=str(tmp_path / "site")), capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    assert (tmp_path / "site" / "index.html").is_file()
    assert (tmp_path / "site" / "reference" / "cli" / "index.html").is_file()
    # a docstring's <placeholder> is text on the page, not a tag the browser drops ("Runs land in ///seed-.")
    keys = (tmp_path / "site" / "reference" / "config" / "index.html").read_text()
    assert "&lt;output_dir&gt;/&lt;domain&gt;/&lt;variant&gt;/seed&lt;seed&gt;" in keys
    sweep_keys = (tmp_path / "site" / "reference" / "sweep" / "index.html").read_text()  # generated from the Sweep model
    assert all(f"<code>{key}</code>" in sweep_keys for key in ("domain_overrides", "select.use", "slurm.partition"))
    for page, models in (("config", config_models()), ("sweep", sweep_models())):
        shown = visible((tmp_path / "site" / "reference" / page / "index.html").read_text())
        lost = [doc for doc in key_docs(models) if as_shown(doc) not in shown]
        assert not lost, f"reference/{page}.md does not show these docstrings as written: {lost}"


def config_models() -> list:
    import runners.config  # noqa: F401  (the project's domains)
    from common import schema
    from common.registry import domain_schema, package_domains

    return [schema.RunConfig, *(domain_schema(name)[0] for name in sorted(package_domains()))]


def sweep_models() -> list:
    from runners.sweeps import spec

    return [spec.Sweep, spec.Select]


def key_docs(models: list) -> set[str]:
    """Every docstring the generated key pages show: each key's, each section's (its class's and its field's), each
    domain config's (the first model's, the run config's, is the page's own introduction)."""
    from common.typed import Model

    found, todo = set(), list(models)
    while todo:
        model = todo.pop()
        if model is not models[0]:
            found.add(model.__doc__ or "")
        for field in model.model_fields.values():
            found.add(field.description or "")
            default = field.get_default(call_default_factory=True)
            if isinstance(default, Model) and type(default).model_fields:
                todo.append(type(default))
    return {doc for doc in found if doc.strip()}


def as_shown(text: str) -> str:
    """A docstring as a reader sees it on the page: one space between words, code spans without their backticks."""
    return " ".join(text.replace("`", "").split())


def visible(page: str) -> str:
    """The text a browser shows of an HTML page: the tags gone, the entities decoded, one space between words."""
    import html

    return as_shown(html.unescape(re.sub(r"<[^>]+>", "", page)))
