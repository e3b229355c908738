"""The failure policy of `quest train` (README, "When things go wrong"): exit 0 for ok and diverged runs,
1 for a run that failed while training, 2 for input the user must fix, which leaves no run directory;
a full disk is named in the record; a finite blow-up is divergence; the console carries no known noise."""
import errno
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from conftest import ToyTask, exit_status
from pytorch_lightning.plugins.io import TorchCheckpointIO

from common.records import read_record
from runners.cli import main as cli
from runners.config import compose, run_directory
from runners.runs import recording as record_module
from runners.runs import training as train_module


def test_ok_and_diverged_exit_0_and_a_run_time_failure_exits_1(toy_domain, run_args, monkeypatch, capsys):
    assert cli(["train", "domain=toy", *run_args]) == 0
    assert cli(["train", "domain=toy", "task.nan_after=2", *run_args]) == 0
    assert "diverged: toy/quest" in capsys.readouterr().out

    def broken(self, *args):
        raise RuntimeError("the loss exploded in an unexpected way")

    monkeypatch.setattr(ToyTask, "loss", broken)
    assert cli(["train", "domain=toy", "seed=1", *run_args]) == 1
    record = read_record(run_directory(compose(["domain=toy", "seed=1", *run_args])))
    assert record.status == "failed" and "unexpected way" in record.error


@pytest.mark.parametrize("override, message", [
    ("optim.name=foo", "unknown optim.name='foo'; choose from adamw, adam, sgd"),
    ("optim.schedule=linear", "unknown optim.schedule='linear'"),
    ("trainer.precision=bogus", "trainer settings: Precision 'bogus' is invalid"),
])
def test_input_errors_exit_2_before_any_run_directory(toy_domain, run_args, tmp_path, capsys, override, message):
    assert cli(["train", "domain=toy", override, *run_args]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
    assert not (tmp_path / "runs").exists()  # no failed record to surface later in a table


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_asking_for_a_missing_gpu_is_an_input_error(toy_domain, run_args, capsys):
    assert cli(["train", "domain=toy", "trainer.accelerator=gpu", *run_args]) == 2
    assert "trainer settings:" in capsys.readouterr().err


def test_bad_data_and_model_settings_are_named_in_one_line(tmp_path, capsys):
    csv = tmp_path / "series.csv"
    csv.write_text("date,load,temp\n" + "".join(f"2020-01-{d:02d},{d},{'inf' if d == 7 else d}\n" for d in range(1, 29)))
    common = ["domain=timeseries", "preset=smoke", "data.dataset=csv", f"data.root={csv}", f"output_dir={tmp_path}/runs"]
    assert cli(["train", *common]) == 2
    err = capsys.readouterr().err
    assert f"{csv}: column 'temp' holds inf at line 8" in err and err.count("\n") == 1, err
    assert cli(["train", "domain=vision", "preset=smoke", "data.split=[0.5,0.5,0.5]", f"output_dir={tmp_path}/runs",
                f"cache_dir={tmp_path}/cache"]) == 2
    assert "data.split must be three train/val/test fractions >= 0 that sum to 1" in capsys.readouterr().err
    assert cli(["train", "domain=vision", "preset=smoke", "model.heads=3", f"output_dir={tmp_path}/runs",
                f"cache_dir={tmp_path}/cache"]) == 2  # a model setting the network cannot use
    assert "domain 'vision': dim 16 is not divisible by num_heads 3" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


def test_an_output_dir_that_cannot_be_written_is_named(toy_domain, tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert cli(["train", "domain=toy", f"output_dir={blocker}", "trainer.enable_progress_bar=false"]) == 2
    err = capsys.readouterr().err
    assert f"cannot write the run directory {blocker}/toy/quest/" in err and "Not a directory" in err
    assert err.count("\n") == 1


def test_a_full_disk_mid_run_removes_partial_checkpoints_and_says_so(toy_domain, run_args, monkeypatch, capsys):
    def full_disk(self, checkpoint, path, storage_options=None):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as f:
            f.write(b"half a checkpoint")
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(TorchCheckpointIO, "save_checkpoint", full_disk)
    assert cli(["train", "domain=toy", *run_args]) == 1
    run_dir = run_directory(compose(["domain=toy", *run_args]))
    record = read_record(run_dir)
    assert record.status == "failed" and record.error.startswith(f"no space left on {run_dir}/checkpoints/")
    assert not (run_dir / "checkpoints").exists() and (run_dir / "error.log").exists()

    def no_record(*args):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(record_module, "write_record", no_record)
    assert cli(["train", "domain=toy", "seed=3", *run_args]) == 1
    err = capsys.readouterr().err
    assert err.startswith("quest: no space left on ") and "; record not written to " in err, err


def test_a_crashing_rank_keeps_its_own_error_log(toy_domain, run_args, monkeypatch):
    monkeypatch.setattr(ToyTask, "loss", lambda self, *args: 1 / 0)
    monkeypatch.setattr(record_module.rank_zero_only, "rank", 1)
    record = train_module.run(compose(["domain=toy", *run_args]))
    run_dir = run_directory(compose(["domain=toy", *run_args]))
    assert record.status == "failed" and (run_dir / "error.rank1.log").exists()
    assert not (run_dir / "error.log").exists()  # rank 0's name stays free for rank 0's traceback


def test_a_finite_blow_up_is_divergence(run_args):
    # The example the issue came with: a huge learning rate drove the loss to 3e24 and the run said ok.
    record = train_module.train(["domain=retrieval", "attention=standard", "preset=smoke", "optim.lr=1e4", *run_args])
    assert record.status == "diverged" and "past bound" in record.divergence.reason


def test_the_console_carries_no_known_noise(tmp_path):
    out = subprocess.run([sys.executable, "-m", "runners.cli", "train", "domain=retrieval", "preset=smoke",
                          f"output_dir={tmp_path}", "trainer.enable_progress_bar=false"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    noise = ("GPU available", "TPU available", "litlogger", "LeafSpec", "does not have many workers",
             "Loading `train_dataloader`", "Restoring states", "`Trainer.fit` stopped")
    assert not [line for line in (out.stdout + out.stderr).splitlines() if any(n in line for n in noise)]
    # a pipe: one progress line (4 steps, fewer than progress.every_n_steps), then the summary and the record's path
    lines = out.stdout.splitlines()
    assert len(lines) == 3 and lines[0].startswith("step 4/4 · loss ") and lines[1].startswith("ok: retrieval/quest")
    assert lines[2].endswith("record.json")


@pytest.mark.parametrize("override, message", [
    ("optim.betas=[0.9,0.99", "config key 'optim.betas': cannot read '[0.9,0.99'"),
    ("optim.lr=-0.01", "config key 'optim.lr' must be > 0, got -0.01"),
    ("data.n=[1]", "config key 'data.n' (command line) expects int like 64, got [1]"),
    ("seed=-1", "config key 'seed' must be >= 0, got -1"),
    ("seed=4294967296", "config key 'seed' must be <= 4294967295, got 4294967296"),
    ("optim.betas=[2,3]", "config key 'optim.betas' must be < 1, got [2, 3]"),
    ("threads=-2", "config key 'threads' must be >= 1, got -2"),
    ("seed=abc", "config key 'seed' (command line) expects int like 0, got 'abc'"),
    ("attention.qk_gain_init", "override 'attention.qk_gain_init' is not of the form key=value"),
])
def test_malformed_and_out_of_range_values_exit_2_in_one_line(toy_domain, run_args, tmp_path, capsys, override,
                                                              message):
    assert cli(["train", "domain=toy", override, *run_args]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("domain, override, message", [
    ("vision", "data.batch_size=-16", "config key 'data.batch_size' must be >= 1, got -16"),
    ("vision", "model.heads=0", "config key 'model.heads' must be >= 1, got 0"),
    ("vision", "model.depth=0", "config key 'model.depth' must be >= 1, got 0"),
    ("language", "data.context=0", "config key 'data.context' must be >= 1, got 0"),
    ("vision", "data.split_seed=-1", "config key 'data.split_seed' must be >= 0, got -1"),
    ("vision", "robustness.eps=[0.1,-0.1]", "config key 'robustness.eps' must be > 0, got [0.1, -0.1]"),
    ("vision", "robustness.severities=[6]", "config key 'robustness.severities' must be <= 5, got [6]"),
])
def test_ranges_hold_for_every_domain_that_has_the_key(tmp_path, capsys, domain, override, message):
    assert cli(["train", f"domain={domain}", "preset=smoke", override, f"output_dir={tmp_path}/runs"]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("args, message", [
    (["sweep", "x.yaml", "--workers", "0"], "quest sweep: error: argument --workers: must be a whole number >= 1, got '0'"),
    (["bench", "--shapes", "a,b"], "quest bench: error: argument --shapes: must be 4 whole numbers >= 1 separated by "
                                   "commas (batch,heads,tokens,head_dim), got 'a,b'"),
    (["feed", "domain=toy", "--batches", "0"], "quest feed: error: argument --batches: must be a whole number >= 1"),
    (["generate", "run", "--seed", "4294967296"], "quest generate: error: argument --seed: must be a whole number "
                                                  "from 0 to 4294967295"),
    (["generate", "run", "--temperature", "nan"], "quest generate: error: argument --temperature: must be a finite number"),
])
def test_a_command_argument_out_of_its_range_is_one_line_without_the_usage_block(tmp_path, capsys, args, message):
    assert exit_status(args) == 2
    out, err = capsys.readouterr()
    assert err.startswith(message) and err.count("\n") == 1 and not out, err


def test_a_diverged_run_prints_no_third_party_warning(toy_domain, run_args, capsys):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert cli(["train", "domain=toy", "task.nan_after=0", *run_args]) == 0
    assert not [str(w.message) for w in caught], [str(w.message) for w in caught]
    assert "diverged at step 0 (non-finite training loss)" in capsys.readouterr().out


def test_types_come_from_the_schema_not_the_preset_and_a_path_is_a_string():
    # vision's smoke preset sets limit_train_batches to 3; the schema's 1.0 says a fraction is fine too
    cfg = compose(["domain=vision", "preset=smoke", "trainer.limit_train_batches=0.5", "output_dir=/tmp/runs/hash #1",
                   "cache_dir=2024", "data.split=[0.8,0.1,0.1]", "optim.name='sgd'"])
    assert cfg.trainer.limit_train_batches == 0.5
    assert cfg.output_dir == "/tmp/runs/hash #1" and cfg.cache_dir == Path("2024")  # YAML would cut at ' #', make 2024 an int
    assert list(cfg.data.split) == [0.8, 0.1, 0.1] and cfg.optim.name == "sgd"


def test_a_record_that_cannot_be_written_leaves_no_temp_file_and_names_the_run(toy_domain, run_args, monkeypatch,
                                                                               capsys):
    replace = os.replace

    def full_disk(source, target):  # the record's temporary file is written, and then the disk is full
        if str(target).endswith("record.json"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return replace(source, target)

    monkeypatch.setattr(os, "replace", full_disk)
    assert cli(["train", "domain=toy", *run_args]) == 1  # the training was fine, but its outcome is lost
    run_dir = run_directory(compose(["domain=toy", *run_args]))
    err = capsys.readouterr().err
    assert err == f"quest: record not written to {run_dir}: No space left on device\n", err
    assert [p.name for p in run_dir.parent.iterdir()] == [f".{run_dir.name}.lock"]  # no temp record, no half run
