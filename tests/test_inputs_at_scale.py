"""Inputs as they come at scale or carelessly made (issue 72): `quest select` linear in the number of records,
names that are not UTF-8, arguments out of range, `quest docs --build` into a folder it did not make, a record
that is a symlink loop. Each is read, refused or reported in one line, never a traceback."""
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from common.records import RECORD_NAME, RunRecord, read_records
from runners.cli import main as cli
from runners.commands import docs
from runners.runs.launches import read_launches
from runners.runs.selection import candidates
from tests.conftest import exit_status, record_json

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


NOT_UTF8 = os.fsdecode(b"\xff\xfe")  # a name's bytes that are not UTF-8, as Python holds them: surrogates
ESCAPED = "\\udcff\\udcfe"  # as the console prints them


def test_an_output_named_in_bytes_that_are_not_utf8_is_written_and_named(tmp_path, capsys):
    runs = tmp_path / f"runs{NOT_UTF8}"
    write_grid(runs, 2)
    output = tmp_path / f"out{NOT_UTF8}.md"
    assert cli(["aggregate", str(runs), "-o", str(output)]) == 0
    assert f"2 runs, 0 skipped, 0 reports -> {tmp_path}/out{ESCAPED}.md" in capsys.readouterr().out
    assert output.is_file()


def test_a_sweep_file_named_in_bytes_that_are_not_utf8_is_read_and_named(toy_domain, tmp_path, capsys):
    from tests.test_sweep import write_spec  # imported here: write_grid is imported outside pytest (docs/speed.md)

    spec = Path(write_spec(tmp_path)).rename(tmp_path / f"sweep{NOT_UTF8}.yaml")
    assert cli(["sweep", str(spec), "--dry-run"]) == 0
    assert "domain=toy" in capsys.readouterr().out
    spec.write_text("domains: [toy]\nvariants: [quest]\nseeds: [0]\ncolour: red\n")
    assert cli(["sweep", str(spec), "--dry-run"]) == 2
    assert f"sweep{ESCAPED}.yaml" in capsys.readouterr().err


def test_a_sweep_into_a_folder_named_in_bytes_that_are_not_utf8_refuses_its_runs_in_one_line(toy_domain, tmp_path,
                                                                                              capsys):
    from tests.test_sweep import write_spec

    output = tmp_path / f"runs{NOT_UTF8}"
    assert cli(["sweep", write_spec(tmp_path), "--output-dir", str(output)]) == 2
    out, err = capsys.readouterr()
    assert "sweep: invalid toy/quest seed 0: ConfigError: config key 'output_dir': cannot read" in out + err
    assert "Traceback" not in err
    (launch,) = read_launches(output)
    assert f"runs{ESCAPED}" in launch.command


@pytest.fixture
def mkdocs(monkeypatch):
    """The command lines `quest docs` would run: none is run."""
    ran = []
    monkeypatch.setattr(docs.subprocess, "run", lambda cmd, **_: ran.append(cmd) or subprocess.CompletedProcess(cmd, 0))
    return ran


@pytest.mark.parametrize("addr, problem", [
    ("127.0.0.1:99999", "argument --addr: the port must be a whole number from 1 to 65535, got '99999'"),
    ("127.0.0.1:http", "argument --addr: the port must be a whole number from 1 to 65535, got 'http'"),
    ("8000", "argument --addr: must be HOST:PORT, got '8000'"),
])
def test_quest_docs_refuses_an_address_out_of_range_in_one_line(mkdocs, addr, problem, capsys):
    assert exit_status(["docs", "--addr", addr]) == 2
    assert capsys.readouterr().err == f"quest docs: error: {problem}\n" and mkdocs == []


def test_quest_docs_refuses_a_port_in_use_before_mkdocs_starts(mkdocs, capsys):
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        addr = f"127.0.0.1:{server.getsockname()[1]}"
        assert exit_status(["docs", "--addr", addr]) == 2
    assert f"cannot serve on {addr} (Address already in use)" in capsys.readouterr().err and mkdocs == []
    assert exit_status(["docs", "--addr", addr]) == 0 and mkdocs[0][-2:] == ["-a", addr]  # closed: free again


def test_quest_docs_builds_only_into_a_folder_of_its_own(mkdocs, tmp_path, capsys):
    runs = tmp_path / "runs"
    write_grid(runs, 1)
    assert exit_status(["docs", "--build", str(runs)]) == 2
    assert "holds files that quest docs did not build" in capsys.readouterr().err
    assert mkdocs == [] and [p.name for p in runs.iterdir()] == ["run0"]  # nothing deleted, nothing added
    site = tmp_path / "site"
    assert exit_status(["docs", "--build", str(site)]) == 0  # new
    (site / "index.html").write_text("built")  # as mkdocs leaves it
    assert exit_status(["docs", "--build", str(site)]) == 0  # its own: built again
    assert len(mkdocs) == 2 and mkdocs[1][-1] == str(site.resolve())


NO_DEVICE = "argument --device: 'cuda' asks for a CUDA GPU that torch does not find here (none found): give cpu or auto"


@pytest.mark.parametrize("command, args, problem", [
    (["generate", "runs/language/quest/seed0"], ["--device", "nonsense"],
     "argument --device: must be auto, cpu, cuda or cuda:N, got 'nonsense'"),
    (["generate", "runs/language/quest/seed0"], ["--device", "cuda"], NO_DEVICE),
    (["generate", "runs/language/quest/seed0"], ["--max-new-tokens", "99999999999999999999"],
     "argument --max-new-tokens: must be a whole number from 0 to 100000, got '99999999999999999999'"),
    (["bench"], ["--device", "nonsense"], "argument --device: must be auto, cpu, cuda or cuda:N, got 'nonsense'"),
    (["bench"], ["--device", "cuda"], NO_DEVICE),
    (["bench"], ["--shapes", "100000,100000,100,100"],
     "argument --shapes: '100000,100000,100,100' is 100,000,000,000,000 elements a tensor; at most 2,147,483,648"),
])
def test_generate_and_bench_refuse_a_device_a_length_or_a_shape_they_cannot_use_in_one_line(command, args, problem,
                                                                                           monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # a machine without a GPU
    assert exit_status([*command, *args]) == 2
    assert capsys.readouterr().err == f"quest {command[0]}: error: {problem}\n"


def test_a_record_that_is_a_symlink_loop_is_skipped_and_named(tmp_path, caplog, capsys):
    write_grid(tmp_path / "runs", 2)
    loop = tmp_path / "runs" / "run1" / RECORD_NAME
    loop.unlink()
    loop.symlink_to(RECORD_NAME)  # record.json -> record.json
    good, bad = read_records(tmp_path / "runs")
    assert len(good) == 1 and [(err.path, err.reason) for err in bad] == [
        (str(loop), "cannot be read (Too many levels of symbolic links)")]
    assert f"skipping {loop}: cannot be read (Too many levels of symbolic links)" in caplog.text
    assert cli(["aggregate", str(tmp_path / "runs"), "-o", str(tmp_path / "RESULTS.md")]) == 0
    assert "1 runs, 1 skipped" in capsys.readouterr().out
