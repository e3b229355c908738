"""Nothing outside what a command was given: a path read from a file stays inside the folder it belongs to
(``common.files.inside``), a borrowed selection sets only numbers the sweep does not set itself, no output is left
half-written by a signal or a full disk (``common.files.write_atomic``), and SLURM is asked for only where it is."""
import errno
import json
import logging
import os
import signal
from pathlib import Path

import pytest
from conftest import make_record
from test_sweep import write_spec

from common.files import FileError, inside, write_atomic
from common.records import Snapshot, read_record, write_record
from runners.cli import main as cli
from runners.config import as_yaml, compose


def write_runs(root):
    for variant, seed in (("standard", 0), ("standard", 1), ("quest", 0), ("quest", 1)):
        write_record(root / f"{variant}-{seed}", make_record(variant, seed, {"mse": 0.1 + 0.01 * seed}))
    return root


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


# --- the rule ---------------------------------------------------------------------------------------------------

def test_inside_takes_a_name_within_the_folder_and_refuses_every_way_out(tmp_path):
    (tmp_path / "runs" / "sub").mkdir(parents=True)
    (tmp_path / "secret").write_text("key")
    (tmp_path / "runs" / "out").symlink_to(tmp_path / "secret")
    (tmp_path / "runs" / "loop").symlink_to(tmp_path / "runs" / "loop")
    assert inside(tmp_path / "runs", "sub/a.png", "figure") == tmp_path / "runs" / "sub" / "a.png"
    for name in ("../secret", "/etc/passwd", "sub/../../secret", "out"):
        with pytest.raises(FileError, match=r"a figure must lie inside .*runs; it names a path outside it"):
            inside(tmp_path / "runs", name, "figure")
    with pytest.raises(FileError, match="cannot be resolved"):
        inside(tmp_path / "runs", "loop", "figure")


# --- paths read from files ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("link", ["../secret.png", "/etc/passwd", "linked.png"])
def test_a_report_figure_outside_the_reports_folder_is_refused_and_nothing_is_written(tmp_path, capsys, link):
    study = tmp_path / "study"
    study.mkdir()
    (tmp_path / "secret.png").write_text("not for RESULTS/")
    (study / "linked.png").symlink_to(tmp_path / "secret.png")
    (study / "report.md").write_text(f"# A study\n\n![figure]({link})\n")
    out = tmp_path / "out" / "RESULTS.md"
    out.parent.mkdir()
    assert cli(["aggregate", "--report", str(study / "report.md"), "-o", str(out)]) == 2
    assert "report's figure must lie inside" in one_line_error(capsys)
    assert list(out.parent.iterdir()) == []  # not even RESULTS/


def test_a_report_figure_inside_its_folder_is_copied(tmp_path, capsys):
    study = tmp_path / "study"
    (study / "figures").mkdir(parents=True)
    (study / "figures" / "a.png").write_bytes(b"\x89PNG")
    (study / "report.md").write_text("# A study\n\n![figure](figures/a.png)\n")
    out = tmp_path / "RESULTS.md"
    assert cli(["aggregate", "--report", str(study / "report.md"), "-o", str(out)]) == 0
    assert (tmp_path / "RESULTS" / "a-study" / "a.png").read_bytes() == b"\x89PNG"
    assert "![figure](RESULTS/a-study/a.png)" in out.read_text()


@pytest.mark.parametrize("name", ["launches.jsonl", "selection.json", "record.json"])
def test_archive_leaves_out_a_file_that_links_out_of_the_runs_folder(tmp_path, capsys, caplog, name):
    runs = write_runs(tmp_path / "runs")
    (runs / "launches.jsonl").write_text("")
    secret = tmp_path / "secret.json"
    secret.write_text(json.dumps(make_record("quest", 9, {"mse": 0.0}).to_json()))
    (runs / "linked").mkdir()
    (runs / "linked" / name).symlink_to(secret)
    with caplog.at_level(logging.WARNING):
        assert cli(["archive", str(runs), str(tmp_path / "copy")]) == 0
    assert not (tmp_path / "copy" / "linked").exists()
    assert f"leaving out {runs / 'linked' / name}: " in caplog.text and "names a path outside it" in caplog.text
    assert (tmp_path / "copy" / "launches.jsonl").is_file()  # the folder's own launch log is archived
    assert len(list((tmp_path / "copy").rglob("record.json"))) == 4


def test_curve_refuses_a_snapshot_the_record_places_outside_the_run(tmp_path, capsys):
    run = tmp_path / "run"
    record = make_record("quest", 0, {"mse": 0.1})
    record.snapshots = [Snapshot(fraction=1.0, step=10, file="../../elsewhere.ckpt")]
    write_record(run, record)
    (run / "config.yaml").write_text(as_yaml(compose(["domain=timeseries", "preset=smoke"])))
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / "best.ckpt").write_bytes(b"")
    assert cli(["curve", str(run)]) == 2
    assert "a snapshot must lie inside" in one_line_error(capsys)
    assert read_record(run).curve is None


# --- borrowed selections ------------------------------------------------------------------------------------------

@pytest.fixture
def borrowed(tmp_path, toy_domain):
    """A sweep that takes its choices from another folder's selection.json, written here by hand."""
    def sweep_with(chosen: dict, keys=("optim.lr",)) -> str:
        source = tmp_path / "other"
        source.mkdir(exist_ok=True)
        (source / "selection.json").write_text(json.dumps({
            "keys": list(keys), "seeds": [100], "recipe_seeds": [], "confirm_seeds": [0], "variants": ["quest"],
            "recipe": {"toy": {"optim.lr": 1e-3}}, "chosen": {"toy": {"quest": chosen}}}))
        return write_spec(tmp_path, select={"use": str(source), "recipe": False})
    return sweep_with


@pytest.mark.parametrize("chosen, keys, problem", [
    ({"output_dir": 1.0}, ["output_dir"], "a selection may not set output_dir: the sweep sets it"),
    ({"seed": 7.0}, ["seed"], "a selection may not set seed: the sweep sets it"),
    ({"data.name": 1.0}, ["data.name"], "data.name is not a number in the toy runs' config"),
    ({"optim.lr": 1e-3, "trainer.max_epochs": 9.0}, ["optim.lr"], "the choice for toy/quest sets optim.lr, trainer.max_epochs"),
])
def test_a_borrowed_selection_sets_only_numbers_the_sweep_does_not_set(tmp_path, capsys, borrowed, chosen, keys, problem):
    assert cli(["sweep", borrowed(chosen, keys), "--dry-run"]) == 2
    assert problem in one_line_error(capsys)
    assert not (tmp_path / "runs").exists()


def test_a_borrowed_selection_of_the_learning_rate_is_taken(tmp_path, capsys, borrowed):
    assert cli(["sweep", borrowed({"optim.lr": 2e-3}), "--dry-run"]) == 0
    assert "optim.lr=0.002" in capsys.readouterr().out


# --- outputs written whole ----------------------------------------------------------------------------------------

def test_write_atomic_leaves_the_earlier_file_and_no_temporary_file_on_a_full_disk(tmp_path, monkeypatch):
    path = tmp_path / "out.md"
    path.write_text("earlier")

    def full(*_):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    with pytest.raises(OSError, match="No space left on device") as caught:
        write_atomic(path, "new")
    assert caught.value.filename == str(path)
    assert path.read_text() == "earlier" and os.listdir(tmp_path) == ["out.md"]


def full_disk(monkeypatch):
    real = os.replace

    def replace(source, target):
        if str(target).endswith(("runs.csv", ".json", "record.json")):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(source, target)

    monkeypatch.setattr(os, "replace", replace)


def leftovers(folder) -> list[str]:
    return [p.name for p in folder.rglob(".*.tmp")]


def test_a_full_disk_during_aggregate_select_and_archive_is_one_line_and_keeps_the_earlier_files(tmp_path, capsys, monkeypatch):
    runs = write_runs(tmp_path / "runs")
    out = tmp_path / "R.md"
    assert cli(["aggregate", str(runs), "-o", str(out), "--no-plots"]) == 0
    assert cli(["select", str(runs), "--json", str(tmp_path / "ranked.json")]) == 0
    assert cli(["archive", str(runs), str(tmp_path / "copy")]) == 0
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    capsys.readouterr()
    full_disk(monkeypatch)
    for args in (["aggregate", str(runs), "-o", str(out), "--no-plots"],
                 ["select", str(runs), "--json", str(tmp_path / "ranked.json")],
                 ["archive", str(runs), str(tmp_path / "copy")]):
        assert cli(args) == 2
        assert "No space left on device" in one_line_error(capsys)
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_while_aggregate_writes_keeps_the_earlier_csv_whole(tmp_path, capsys, monkeypatch, signum):
    runs = write_runs(tmp_path / "runs")
    out = tmp_path / "R.md"
    assert cli(["aggregate", str(runs), "-o", str(out), "--no-plots"]) == 0
    csv = (tmp_path / "R" / "runs.csv").read_bytes()
    write_record(runs / "quest-2", make_record("quest", 2, {"mse": 0.5}))  # the next aggregate has more to write
    real = os.replace

    def interrupted(source, target):
        if str(target).endswith("runs.csv"):
            os.kill(os.getpid(), signum)  # the handler raises at once, here, half-way through the write phase
        return real(source, target)

    monkeypatch.setattr(os, "replace", interrupted)
    assert cli(["aggregate", str(runs), "-o", str(out), "--no-plots"]) == 128 + signum
    assert capsys.readouterr().err.strip() == f"quest: stopped by {signal.Signals(signum).name}"
    assert (tmp_path / "R" / "runs.csv").read_bytes() == csv and leftovers(tmp_path) == []


# --- SLURM ---------------------------------------------------------------------------------------------------------

def test_launcher_slurm_without_sbatch_is_one_line_and_runs_nothing(tmp_path, capsys, monkeypatch, toy_domain):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert cli(["sweep", write_spec(tmp_path), "--launcher", "slurm"]) == 2
    assert "--launcher slurm needs SLURM's sbatch on PATH" in one_line_error(capsys)
    assert not (tmp_path / "runs").exists()


# --- every YAML, JSON and CSV file read through common.files --------------------------------------------------------

DIRECT_READS = ("pd.read_csv(", "pandas.read_csv(", "OmegaConf.load(", "yaml.load(", "yaml.safe_load(", "json.load(",
                "csv.reader(", "csv.DictReader(", "np.loadtxt(", "np.genfromtxt(")


def test_no_yaml_json_or_csv_file_is_read_but_through_common_files():
    root = Path(__file__).resolve().parents[1]
    found = [f"{path.relative_to(root)}:{number}: {line.strip()}"
             for package in ("common", "domains", "runners") for path in sorted((root / package).rglob("*.py"))
             if path != root / "common" / "files.py"
             for number, line in enumerate(path.read_text().splitlines(), 1) if any(read in line for read in DIRECT_READS)]
    assert found == []


def test_a_presets_file_is_read_within_limits(tmp_path, monkeypatch):
    from common import registry

    fifo = tmp_path / "presets.yaml"
    os.mkfifo(fifo)
    with pytest.raises(FileError, match="is a FIFO, not a regular file"):
        registry._read(fifo)
    (tmp_path / "big.yaml").write_text("presets: {}\n" + "#" * (5 << 20))
    with pytest.raises(FileError, match="a presets file is at most"):
        registry._read(tmp_path / "big.yaml")
