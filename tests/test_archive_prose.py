"""The run counts the hand-written readings state are the archive's: each "the N runs its plan registers" in
RESULTS/notes.md and "N runs in ..." beside a plan in README.md is counted from the records under RESULTS/records."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PLAN_RECORDS = {"preregistration-2.md": ROOT / "RESULTS" / "records" / "confirm2",
                "preregistration-3.md": ROOT / "RESULTS" / "records" / "confirm3"}  # each plan's archived runs


def archived(folder: Path) -> int:
    """The plan's runs: every record under its folder but the selection stage's."""
    return sum("select" not in path.relative_to(folder).parts for path in folder.rglob("record.json"))


@pytest.mark.parametrize("plan, folder", PLAN_RECORDS.items())
def test_the_run_counts_in_the_prose_are_the_records(plan, folder):
    count = archived(folder)
    notes = (ROOT / "RESULTS" / "notes.md").read_text()
    stated = re.findall(rf"`RESULTS/{re.escape(plan)}`\) is complete: the ([\d,]+) runs its plan registers", notes)
    readme = re.findall(rf"`RESULTS/{re.escape(plan)}`: ([\d,]+) runs", (ROOT / "README.md").read_text())
    assert stated and readme, f"the notes and the README no longer state {plan}'s run count where this test reads it"
    assert {int(n.replace(",", "")) for n in stated + readme} == {count}
