"""Inputs as they come at scale or carelessly made (issue 72): `quest select` linear in the number of records,
names that are not UTF-8, arguments out of range, `quest docs --build` into a folder it did not make, a record
that is a symlink loop. Each is read, refused or reported in one line, never a traceback."""
import json
import sys
from pathlib import Path

from common.records import RECORD_NAME, RunRecord
from runners.runs.selection import candidates
from tests.conftest import record_json

VARIANTS = ("standard", "quest", "qknorm", "qknorm_hs", "qknorm_ds", "qnorm", "knorm", "sphere")
RATES = (1e-4, 3e-4, 1e-3, 3e-3, 1e-2)


def grid_json(index: int) -> dict:
    """Run ``index`` of a grid of 8 variants x 5 learning rates x as many seeds as it takes, as its record file
    holds it, with a config of a real run's size (80 settings)."""
    variant, lr, seed = VARIANTS[index % 8], RATES[index // 8 % 5], index // 40
    config = {"seed": seed, "optim": {"lr": lr, "name": "adamw"}, "attention": {"variant": variant},
              **{f"section{s}": {f"key{k}": k * s for k in range(10)} for s in range(8)}}
    score = 0.5 + RATES.index(lr) / 100 + (index * 7919 % 100) / 10_000
    return record_json(variant, seed, {"acc": score}, config=config, best_val={"value": score, "epoch": 3},
                       primary_metric="acc", mode="max")


def write_grid(folder: str | Path, runs: int) -> None:
    """``runs`` records of the grid (``grid_json``) under ``folder``, one run folder each, as ``write_record``
    writes them: what `quest select` was measured on (docs/speed.md)."""
    for index in range(runs):
        run = Path(folder) / f"run{index}"
        run.mkdir(parents=True)
        (run / RECORD_NAME).write_text(json.dumps(grid_json(index), indent=2, sort_keys=True))


def calls(function, *args) -> int:
    """How many functions (Python's and C's) ``function(*args)`` calls: its work, which no machine's speed moves."""
    count = 0

    def profile(frame, event, arg):
        nonlocal count
        count += event in ("call", "c_call")

    sys.setprofile(profile)
    try:
        function(*args)
    finally:
        sys.setprofile(None)
    return count


def test_select_works_in_time_linear_in_the_runs():
    small, large = ([RunRecord(**grid_json(i)) for i in range(runs)] for runs in (80, 160))
    assert calls(candidates, large) < 2.5 * calls(candidates, small)  # comparing every run with every other: 4x
    ranked = candidates(large)
    assert len(ranked) == 40 and ranked[0]["settings"]["optim.lr"] == 1e-2  # the scores rise with the rate
    assert {row["runs"] for row in ranked} == {4}
    del large[0].config["section1"]["key3"]  # an older run, from before the key existed: None there
    assert "section1.key3" in candidates(large)[0]["settings"]
