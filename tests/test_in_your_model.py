"""Every ``python`` block of docs/guides/in-your-model.md runs as written, each in a fresh namespace, so the page and the
code cannot drift apart. Blocks that use transformers are skipped without the hf extra."""
import importlib.util
import re
from pathlib import Path

import pytest

PAGE = Path(__file__).resolve().parents[1] / "docs" / "guides" / "in-your-model.md"
SNIPPETS = re.findall(r"^```python\n(.*?)^```", PAGE.read_text(), re.MULTILINE | re.DOTALL)


def test_the_page_has_its_snippets():
    assert len(SNIPPETS) == 6


@pytest.mark.parametrize("code", SNIPPETS, ids=[f"block{i + 1}" for i in range(len(SNIPPETS))])
def test_a_snippet_runs(code):
    if "transformers" in code and importlib.util.find_spec("transformers") is None:
        pytest.skip("the hf extra is not installed")
    exec(compile(code, str(PAGE), "exec"), {"__name__": "__snippet__"})
