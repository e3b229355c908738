"""RESULTS/ you can read: `quest aggregate` writes an index of its results folder (RESULTS/README.md), and links a
report's figures where they lie when the report is already inside that folder, never copying them beside
themselves (three folders of RESULTS/ were such copies)."""
import os
from pathlib import Path

import pytest

from common.files import FileError
from runners.commands import aggregate
from runners.results.index import render_index
from tests.test_aggregate import write_runs

ROOT = Path(__file__).resolve().parents[1]


def test_aggregate_indexes_its_folder_and_links_figures_in_place(tmp_path):
    runs, out = tmp_path / "runs", tmp_path / "R.md"
    write_runs(runs, [("standard", 0, {"mse": 2.0}, {}), ("quest", 0, {"mse": 1.0}, {})])
    study = tmp_path / "R" / "mechanism"
    study.mkdir(parents=True)
    (study / "rates.png").write_bytes(b"\x89PNG figure")
    (study / "README.md").write_text("# The mechanism study\n\nMade by `quest retrieval-report study runs/m`.\n")
    (study / "report.md").write_text("# Mechanism study\n\nQUEST succeeds in 97% of runs.\n\n![rates](rates.png)\n")
    assert aggregate.main([str(runs), "--report", str(study / "report.md"), "-o", str(out), "--no-plots"]) == 0
    assert "![rates](R/mechanism/rates.png)" in out.read_text()
    assert sorted(p.name for p in (tmp_path / "R").iterdir()) == ["README.md", "mechanism", "runs.csv"]  # no copy
    index = (tmp_path / "R" / "README.md").read_text()
    assert "### [The mechanism study](mechanism/)" in index
    assert "`quest retrieval-report study runs/m`" in index and "QUEST succeeds in 97% of runs." in index
    assert f"made by `quest aggregate {runs} --report {study / 'report.md'}`" in index
    assert "[runs.csv](runs.csv)" in index


@pytest.mark.parametrize("make, says", [
    (lambda page, outside: page.symlink_to(outside), "must lie inside"),
    (lambda page, outside: os.mkfifo(page), "is a FIFO"),
])
def test_the_index_reads_no_page_outside_its_folder_and_waits_on_none(tmp_path, make, says):
    """A study page that links out of the results folder is refused, not quoted into the index; a FIFO is refused
    at once, not waited on."""
    (tmp_path / "secret.md").write_text("# Not a result\n\nA line from outside the folder.\n")
    study = tmp_path / "R" / "study"
    study.mkdir(parents=True)
    make(study / "report.md", tmp_path / "secret.md")
    with pytest.raises(FileError, match=says):
        render_index(tmp_path / "R")


def test_the_project_results_folder_has_its_index():
    """RESULTS/README.md names every study folder of RESULTS/ (rerun `quest aggregate` when one is added)."""
    index = (ROOT / "RESULTS" / "README.md").read_text()
    folders = [p.name for p in (ROOT / "RESULTS").iterdir() if p.is_dir() and p.name != "records"]
    assert all(f"]({name}/)" in index for name in folders), folders
    assert render_index(ROOT / "RESULTS").count("### [") == len(folders)


def test_a_one_seed_demo_says_what_it_can_show_instead_of_an_empty_ranking(tmp_path):
    runs, out = tmp_path / "runs", tmp_path / "R.md"
    write_runs(runs, [("standard", 0, {"mse": 2.0}, {}), ("quest", 0, {"mse": 1.0}, {})])
    assert aggregate.main([str(runs), "-o", str(out), "--no-plots"]) == 0
    top = out.read_text().split("## Across domains")[0]
    assert "**One seed per variant: a demo, not a comparison.**" in top and "cannot show: which variant is better" in top
    across = out.read_text().split("## Across domains")[1].split("\n## ")[0]
    assert "| —" not in across and "no ranking and no verdict" in across
    write_runs(runs, [("standard", 1, {"mse": 2.1}, {}), ("quest", 1, {"mse": 1.1}, {})])  # two seeds: ranked
    assert aggregate.main([str(runs), "-o", str(out), "--no-plots"]) == 0
    assert "a demo, not a comparison" not in out.read_text()
