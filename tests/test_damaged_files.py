"""Every file the project reads back is data (common.files, docs/guides/failures.md "Files are data"): a damaged record of
each kind is skipped, counted and named by `quest aggregate`, `archive` and `select` (a sweep's resume:
tests/test_sweep.py); a damaged training log or launch log line leaves that part out with one warning; a plan,
anchors or notes file that is not what it should be, and a path the system refuses, are one line and exit 2 with
nothing written."""
import json
import logging
import os

import pytest
from conftest import DAMAGED, damage, exit_status, record_json
from conftest import make_record as record

from common.files import MAX_NESTING, FileError, parse_json, parse_yaml, read_text
from common.records import write_record
from runners.cli import main as cli


def write_runs(root):
    """standard and quest at seeds 0 and 1, one run directory each; returns quest seed 1's record file."""
    for variant, gain in (("standard", 0.0), ("quest", 0.5)):
        for seed in (0, 1):
            write_record(root / f"{variant}-{seed}", record(variant, seed, {"mse": 2.0 - gain + seed},
                                                            config={"optim": {"lr": 1e-3}}))
    return root / "quest-1" / "record.json"


def warnings_of(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.parametrize("kind", DAMAGED)
def test_aggregate_archive_and_select_skip_a_damaged_record_in_one_line(tmp_path, capsys, caplog, monkeypatch, kind):
    runs, out = tmp_path / "runs", tmp_path / "R.md"
    bad = write_runs(runs)
    reason = damage(bad, kind, monkeypatch)
    skipped = f"skipping {bad}: {reason}"
    with caplog.at_level(logging.WARNING):
        assert cli(["aggregate", str(runs), "-o", str(out), "--no-plots"]) == 0
        assert warnings_of(caplog) == [skipped]
        text = out.read_text()
        assert "3 run records aggregated, 1 skipped" in text and f"- `{bad}`: {reason}" in text
        assert capsys.readouterr().out.startswith("aggregate: 3 runs, 1 skipped")
        caplog.clear()
        assert cli(["archive", str(runs), str(tmp_path / "copy")]) == 0
        assert warnings_of(caplog) == [skipped]
        assert "archive: 3 records" in capsys.readouterr().out.splitlines()[0]
        assert sorted(p.parent.name for p in (tmp_path / "copy").rglob("record.json")) == [
            "quest-0", "standard-0", "standard-1"]
        caplog.clear()
        assert cli(["select", str(runs)]) == 0
        assert warnings_of(caplog) == [skipped]


def test_archive_counts_what_it_left_out(tmp_path, capsys):
    runs = tmp_path / "runs"
    write_runs(runs).write_text("[" * 1000)
    assert cli(["archive", str(runs), str(tmp_path / "copy")]) == 0
    assert "archive: 1 damaged records left out (each named above)" in capsys.readouterr().out


@pytest.mark.parametrize("trajectory, problem", [
    ({"step": [0, 25]}, "field 'trajectory' is not {'step': [integers], 'layers': {...}}"),
    ({"step": [0, 25], "layers": {"a": {"max_logit": [1.0]}}},
     "field 'trajectory' layer 'a' stat 'max_logit' is not 2 numbers, one per step"),
])
def test_a_record_whose_nested_fields_readers_cannot_read_is_skipped(tmp_path, caplog, trajectory, problem):
    runs, out = tmp_path / "runs", tmp_path / "R.md"
    bad = write_runs(runs)
    bad.write_text(json.dumps(record_json("quest", 1, {"mse": 1.0}, trajectory=trajectory)))
    with caplog.at_level(logging.WARNING):
        assert cli(["aggregate", str(runs), "-o", str(out), "--no-plots"]) == 0
    assert warnings_of(caplog) == [f"skipping {bad}: {problem}"]


@pytest.mark.parametrize("content", [b"", b"\x00\xff\xfe binary \x00", b"step,probe/max_logit\nzero,\x01\n"])
def test_a_damaged_training_log_leaves_its_run_out_of_the_plots_in_one_line(tmp_path, caplog, content):
    runs, out = tmp_path / "runs", tmp_path / "R.md"
    write_runs(runs)
    for run in runs.iterdir():
        (run / "metrics.csv").write_text("step,probe/max_logit\n0,1.0\n25,2.0\n")
    log = runs / "quest-1" / "metrics.csv"
    log.write_bytes(content)
    with caplog.at_level(logging.WARNING):
        assert cli(["aggregate", str(runs), "-o", str(out)]) == 0
    found = warnings_of(caplog)
    assert len(found) <= 1 and all(f"leaving a run out of the probe plots: {log}: not a readable CSV file" in w
                                   for w in found), found
    assert "4 run records aggregated, 0 skipped" in out.read_text()


def test_a_bad_line_of_the_launch_log_is_skipped_and_named(tmp_path, caplog):
    runs, out = tmp_path / "runs", tmp_path / "R.md"
    write_runs(runs)
    launch = {"command": "quest sweep x", "started": "2025-01-01T00:00:00", "wall_s": 60.0, "finished": True,
              "workers": 1, "ran": {"ok": 4}, "hardware": {"cpus": 2, "platform": "Linux"}, "git_commit": None}
    lines = [json.dumps(launch), '{"command": "half a li', json.dumps({**launch, "hardware": []}), "[" * 500 + "]" * 500]
    (runs / "launches.jsonl").write_text("\n".join(lines) + "\n")
    with caplog.at_level(logging.WARNING):
        assert cli(["aggregate", str(runs), "-o", str(out), "--no-plots"]) == 0
    log = runs / "launches.jsonl"
    assert warnings_of(caplog) == [
        f"skipping a launch: {log} line 2: not valid JSON (Unterminated string starting at: line 1 column 13)",
        f"skipping a launch: {log} line 3: hardware expects mapping",
        f"skipping a launch: {log} line 4: nested more than {MAX_NESTING} deep"]
    assert "How these runs were made (1 sweep launch, 1.0 min of wall time in all)" in out.read_text()  # as its launch line


PLAN = """```yaml
protocol: tuned
seeds: [0, 1]
recipe_seeds: [0, 1]
alpha: 0.05
hypotheses:
  - {id: H1, claim: quest beats standard, domain: a, metric: mse, variant: quest, against: standard}
```
"""


@pytest.mark.parametrize("option, name, content, problem", [
    ("--confirm", "plan.md", PLAN.replace("0.05", "lots"), "alpha must be a number between 0 and 1, got 'lots'"),
    ("--confirm", "plan.md", PLAN.replace("0.05", "-3"), "alpha must be a number between 0 and 1, got -3"),
    ("--confirm", "plan.md", PLAN.replace("seeds: [0, 1]\nrecipe", "seeds: {first: 0, count: 1000000000000}\nrecipe"),
     "seeds must be a list of 1 to 10000 seeds from 0 to 4294967295"),
    ("--confirm", "plan.md", PLAN.replace("[0, 1]", "[-1]"), "seeds must be a list of 1 to 10000 seeds"),
    ("--confirm", "plan.md", PLAN.replace("id: H1", "id: [H1]"), "hypothesis ['H1']: against, claim, domain, id, metric"),
    ("--confirm", "plan.md", PLAN.encode("utf-16"), "not UTF-8 text (byte 0xff at offset 0)"),
    ("--confirm", "plan.md", PLAN.replace("protocol: tuned", "protocol: &a [*a]"),
     "the plan is not valid YAML (holds a YAML alias (*a); aliases are refused)"),
    ("--notes", "notes.md", "## a / d / study\n\ncaf\xe9".encode("latin-1"), "not UTF-8 text (byte 0xe9 at offset 21)"),
    ("--anchors", "anchors.yaml", "experiment: e\npaper: p\n", "the anchors are a YAML list of mappings"),
    ("--anchors", "anchors.yaml", "- [a list]\n", "the anchors are a YAML list of mappings"),
    ("--anchors", "anchors.yaml", "a: &a [x, x]\nb: &b [*a, *a]\nc: [*b, *b]\n", "holds a YAML alias (*a)"),
    ("--anchors", "anchors.yaml", "- {experiment: e, paper: p, nearest: n, agreement: a, measured: [x]}\n",
     "anchor 'e': measured is {table: <domain/dataset/preset>, metrics: [names], variants: [names] (optional)}"),
    ("--anchors", "anchors.yaml", "- {experiment: e, paper: p, nearest: n, agreement: a}\n",
     "anchor 'e': needs one of measured or see"),
    ("--anchors", "anchors.yaml", "- {experiment: e, paper: 58, nearest: n, agreement: a, see: s}\n",
     "anchor 'e': paper expects str"),
])
def test_a_broken_plan_anchors_or_notes_file_is_one_line_and_writes_nothing(tmp_path, capsys, option, name, content,
                                                                           problem):
    runs, out = tmp_path / "runs", tmp_path / "R.md"
    write_runs(runs)
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    assert cli(["aggregate", str(runs), option, str(path), "-o", str(out), "--no-plots"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"quest: error: {path}: ") and problem in err and err.count("\n") == 1, err
    assert not out.exists() and not (tmp_path / "R").exists()


def test_paths_the_system_refuses_are_one_line(tmp_path, capsys, monkeypatch):
    runs, a_file = tmp_path / "runs", tmp_path / "a-file"
    write_runs(runs)
    a_file.write_text("")
    notes = tmp_path / "notes.md"
    notes.write_text("")
    cases = {  # arguments -> what stderr says after "quest: error: "
        ("aggregate", str(runs), "-o", str(a_file / "R.md"), "--no-plots"): f"{a_file / 'R'}: Not a directory",
        ("select", str(runs), "--json", str(a_file / "s.json")): f"{a_file / 's.json'}: Not a directory",
        ("archive", str(runs), str(a_file)): f"quest archive: error: {a_file} is a file; the copy goes into a folder",
        ("aggregate", str(runs), "--notes", str(tmp_path / ("n" * 300))): "File name too long",
        ("aggregate", str(runs), "--notes", str(notes)): f"{notes}: cannot be read (Permission denied)",
    }
    damage(notes, "unreadable", monkeypatch)
    for args, problem in cases.items():
        assert exit_status(list(args)) == 2, args
        err = capsys.readouterr().err
        assert problem in err and err.count("\n") == 1, (args, err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "notes.md", "runs"]


def test_a_fifo_as_a_data_file_is_refused_at_once(tmp_path, capsys):
    fifo = tmp_path / "series.csv"
    os.mkfifo(fifo)
    args = ["train", "domain=timeseries", "preset=smoke", "data.dataset=csv", f"data.root={fifo}",
            f"output_dir={tmp_path}/runs", f"cache_dir={tmp_path}/cache", "trainer.enable_progress_bar=false"]
    assert cli(args) == 2  # a reader that opened it would wait for a writer that never comes
    err = capsys.readouterr().err
    assert f"{fifo} is a FIFO; data is read from files and folders" in err and err.count("\n") == 1, err
    assert not (tmp_path / "runs").exists()


def test_the_readers_hold_their_limits(tmp_path):
    deep = "[" * (MAX_NESTING + 1) + "]" * (MAX_NESTING + 1)
    for parse in (parse_json, parse_yaml):
        assert parse("[" * MAX_NESTING + "]" * MAX_NESTING, "x") is not None
        with pytest.raises(FileError, match=f"x: nested more than {MAX_NESTING} deep"):
            parse(deep, "x")
    with pytest.raises(FileError, match="holds an integer of more than 100 digits"):
        parse_yaml("seed: " + "9" * 101, "x")
    assert parse_yaml("day: 2024-01-01", "x") == {"day": "2024-01-01"}  # dates stay strings: OmegaConf takes none
    with pytest.raises(FileError, match="holds a value of type bytes"):
        parse_yaml("b: !!binary aGk=", "x")
    big = tmp_path / "big.md"
    big.write_text("x" * 11)
    with pytest.raises(FileError, match=f"{big}: is 11 bytes; a notes file is at most 10"):
        read_text(big, "notes file", 10)
    with pytest.raises(FileError, match=f"{tmp_path}: is a folder, not a regular file"):
        read_text(tmp_path, "notes file", 10)
    with pytest.raises(FileError, match="no such notes file"):
        read_text(tmp_path / "missing.md", "notes file", 10)
