import errno
import multiprocessing
import os
import sys
import threading
from pathlib import Path
from typing import Literal

import pytest
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torchmetrics import MeanSquaredError

from common.records import SCHEMA_VERSION, RunRecord
from common.registry import register_domain, unregister_domain
from common.schema import Positive, RunConfig, Trainer
from common.task import Task
from common.typed import Model
from runners.cli import main as cli
from runners.sweeps import workers

# The tests use tiny tensors, for which one thread beats the overhead of several.
torch.set_num_threads(1)


@pytest.fixture
def run_args(tmp_path):
    """Arguments that keep a test run's outputs and caches inside its temporary directory."""
    return [f"output_dir={tmp_path / 'runs'}", f"cache_dir={tmp_path / 'cache'}", "trainer.enable_progress_bar=false"]


class ToyData(pl.LightningDataModule):
    def __init__(self, data):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        x = torch.randn(data.n, 4, 8, generator=g)
        self.data = TensorDataset(x, x.sum((1, 2)))

    def train_dataloader(self):
        return DataLoader(self.data, 16)

    val_dataloader = test_dataloader = train_dataloader


class ToyNet(nn.Module):
    def __init__(self, attn_layer):
        super().__init__()
        self.attn = attn_layer(8, 2)
        self.head = nn.Linear(8, 1)

    def forward(self, x):
        return self.head(self.attn(x)[0].mean(1)).squeeze(-1)


class ToyTask(Task):
    def __init__(self, net: nn.Module, optim, nan_after: int):
        super().__init__(net, optim, {"mse": MeanSquaredError()})
        self.nan_after = nan_after

    def loss(self, pred, target, stage):
        loss = F.mse_loss(pred, target)
        if stage == "train" and 0 <= self.nan_after <= self.global_step:
            loss = loss * float("nan")
        return loss


class ToyDataConfig(Model):
    dataset: Literal["random"] = "random"
    n: Positive = 64


class ToyTaskConfig(Model):
    nan_after: int = -1
    """Training steps before the loss turns NaN (a diverging run); negative: never."""


class ToyConfig(RunConfig):
    data: ToyDataConfig = ToyDataConfig()
    task: ToyTaskConfig = ToyTaskConfig()
    trainer: Trainer = Trainer(max_epochs=2)


@pytest.fixture
def toy_domain():
    """A domain registered from the test itself: the plugin contract, no project file touched."""

    @register_domain("toy", metric="mse", mode="min", config=ToyConfig,
                     presets=Path(__file__).with_name("toy.yaml"))
    def build(cfg):
        return ToyData(cfg.data), ToyTask(ToyNet(cfg.attn_layer), cfg.optim, **dict(cfg.task))

    yield "toy"
    unregister_domain("toy")


class CreatesAFile:
    """Unpickled, this would run ``open(path, "w")``: the proof that a loader ran code from a file."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return open, (self.path, "w")


def _refuse_reading(path, monkeypatch):
    """``path`` as a file its reader may not open (``chmod 000`` does not bite the root the tests run as): denied
    while it is this file, so that a rerun's new record reads."""
    inode, real = path.stat().st_ino, os.open

    def opened(file, flags, *args, **kwargs):
        if os.fspath(file) == str(path) and os.stat(file).st_ino == inode:
            raise PermissionError(errno.EACCES, "Permission denied", str(file))
        return real(file, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", opened)


def _replace(path, make):
    path.unlink()
    make(path)


# The ways a record file (or any file read back) comes damaged, each with what its reader says (common.files):
# kind -> (damage(path, monkeypatch), reason).
DAMAGED = {
    "nested": (lambda path, _: path.write_text("[" * 100_000 + "]" * 100_000), "nested more than 32 deep"),
    "huge integer": (lambda path, _: path.write_text('{"seed": 1' + "0" * 5000 + "}"),
                     "holds an integer of more than 100 digits"),
    "unreadable": (_refuse_reading, "cannot be read (Permission denied)"),
    "FIFO": (lambda path, _: _replace(path, os.mkfifo), "is a FIFO, not a regular file"),
    "link to /dev/zero": (lambda path, _: _replace(path, lambda p: p.symlink_to("/dev/zero")),
                          "is a character device, not a regular file"),
}


def exit_status(args: list[str]) -> int:
    """``quest <args>``'s exit status, argparse's own included (it exits the process where ``cli`` returns)."""
    try:
        return cli(args)
    except SystemExit as stop:
        return stop.code


def damage(path, kind, monkeypatch) -> str:
    """Damage the file at ``path`` as ``kind`` (``DAMAGED``) says; returns the reason its reader gives."""
    make, reason = DAMAGED[kind]
    make(path, monkeypatch)
    return reason


# which way the metrics of the test records are better, as a task's ``directions()`` would say
DIRECTIONS = {"mse": "min", "mae": "min", "loss": "min", "acc": "max", "macc": "max", "success": "max", "miou": "max"}


def record_json(variant, seed, metrics, domain="a", dataset="d", status="ok", **fields) -> dict:
    """A record of one run as its file holds it, valid unless ``fields`` make it otherwise (for the tests of
    files written broken); ``metrics`` without the ``test/`` prefix."""
    fields.setdefault("directions", {k: DIRECTIONS[k] for k in metrics if k in DIRECTIONS})
    return {
        "schema": SCHEMA_VERSION, "domain": domain, "dataset": dataset, "variant": variant, "seed": seed,
        "preset": "study", "status": status, "config": {}, "metrics": {f"test/{k}": v for k, v in metrics.items()},
        "primary_metric": "mse", "mode": "min", "best_val": {"value": None, "epoch": None},
        "divergence": {"step": 5, "reason": "non-finite loss"} if status == "diverged" else None, "error": None,
        "probes": {"max_logit": 1.0}, "wall_time_s": 1.0, "params": 10, "hardware": {}, "versions": {},
        "git_commit": None, **fields,
    }


def make_record(variant, seed, metrics, **fields) -> RunRecord:
    """A valid record of one run (``record_json``'s)."""
    return RunRecord(**record_json(variant, seed, metrics, **fields))


FORK = multiprocessing.get_context("fork")  # forked processes keep the toy domain and the fake runner


class Forked:
    """A process forked from the test process, with the toy domain and the fake runner, that the sweep
    waits for as for a worker started with `python -m runners.cli`."""

    def __init__(self, target):
        sys.stdout.flush()
        sys.stderr.flush()
        self.process = FORK.Process(target=target)
        self.process.start()

    def wait(self):
        self.process.join()
        return self.process.exitcode

    def send_signal(self, signum):
        os.kill(self.process.pid, signum)


def forked_worker(cmd, env, report_fd):
    """The worker's own code (``quest sweep`` or ``quest ensemble`` with --report-fd), forked."""
    argv = cmd[cmd.index("runners.cli") + 1:]
    return Forked(lambda: sys.exit(cli(argv)))


class Threaded:
    """A worker (``quest sweep`` or ``quest ensemble`` with --report-fd) in a thread of the test process, for the sweeps that train
    for real: a forked child of a process whose torch has run its thread pools can hang in them. A thread
    cannot be signalled: it finishes its runs."""

    def __init__(self, cmd, env, report_fd):
        argv = cmd[cmd.index("runners.cli") + 1:cmd.index("--report-fd")]
        report = os.dup(report_fd)  # the launcher closes its copy of the pipe's write end at once
        self.codes = []
        self.thread = threading.Thread(target=lambda: self.codes.append(cli([*argv, "--report-fd", str(report)])))
        self.thread.start()

    def wait(self):
        self.thread.join()
        return self.codes[0]

    def send_signal(self, signum):
        pass


@pytest.fixture
def threaded_workers(monkeypatch):
    """Sweeps make their runs in workers: threads here, so that they run the test's toy domain and fakes
    (the tests about worker processes fork them instead)."""
    monkeypatch.setattr(workers, "_spawn", Threaded)
