"""A domain's own training step, timed (``quest bench --model``, ``docs/speed/models.md``): what each variant
costs inside the model, and what the training loop of ``quest train`` costs beside a bare PyTorch loop on the
same batches.

Everything is built as ``quest train`` builds it, then ``steps`` training batches are drawn once and kept in
memory, so data loading is not timed. The jobs are interleaved in rounds in one process
(``common.timing.interleaved_seconds``), the median round counting: ``bare_loop`` per variant (no Lightning, no
metrics, no logging: the model's cost, on which variants are compared), and for the baseline variant
``lightning_loop``, the run's own trainer (``runners.runs.training.run_trainer``), timed from its first timed
step to its last: its start and end (setup, the final checkpoint write) belong to the per-run fixed cost, which
``fixed_cost`` measures on a whole ``quest train`` process.
"""
from __future__ import annotations

import itertools
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import pytorch_lightning as pl
import torch
from pytorch_lightning.loggers import CSVLogger
from torch.utils.data import DataLoader

from common.records import find_records, read_record
from common.registry import get_domain
from common.schema import RunConfig
from common.timing import interleaved_seconds
from runners import console
from runners.config import compose
from runners.runs.training import run_trainer, torch_threads


def build(args: list[str], variant: str | None = None):
    """(config, datamodule, task) of the run ``args`` describe, seeded as ``quest train`` seeds it; with ``variant``,
    its attention, without a progress display."""
    cfg = compose([*args, f"attention={variant}", "progress.style=none"] if variant else args)
    pl.seed_everything(cfg.seed, workers=True, verbose=False)
    datamodule, task = get_domain(cfg.domain).build(cfg)
    return cfg, datamodule, task


def train_batches(datamodule, count: int) -> list:
    """The first ``count`` training batches (cycling through the loader if it holds fewer)."""
    datamodule.setup("fit")
    batches = []
    while len(batches) < count:
        before = len(batches)
        batches += itertools.islice(datamodule.train_dataloader(), count - before)
        if len(batches) == before:
            raise ValueError("the training loader yields no batches")
    return batches


def bare_step(cfg: RunConfig, task, augment: Callable = lambda batch: batch) -> Callable[[object], None]:
    """One step of a plain PyTorch loop: ``augment`` (a datamodule's augmentation on the device, part of the
    step), the task's forward (compiled, if the task is) and loss, backward, the config's gradient clipping, ``torch.optim.AdamW`` (the
    config's lr and weight decay on every parameter)."""
    task.train()
    optimizer = torch.optim.AdamW(task.parameters(), lr=cfg.optim.lr, weight_decay=cfg.optim.weight_decay)
    clip = cfg.trainer.gradient_clip_val

    forward = task.compiled_forward or task  # as ``Task.step`` trains: compiled where ``compile_training`` was called

    def step(batch) -> None:
        inputs, target = task.unpack(augment(batch))
        task.loss(forward(inputs), target, "train").backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(task.parameters(), clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def bare_loop(cfg: RunConfig, task, batches: list) -> Callable[[], None]:
    step = bare_step(cfg, task)

    def run() -> None:
        for batch in batches:
            step(batch)

    return run


class _Clock(pl.Callback):
    """The seconds from the start of training step ``skip`` to the end of the last one."""

    def __init__(self, skip: int):
        self.skip, self.start, self.seconds = skip, None, None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.skip:
            self.start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self.start is not None:
            self.seconds = time.perf_counter() - self.start


def lightning_loop(cfg: RunConfig, task, batches: list, skip: int, folder: Path) -> tuple[Callable[[], None], list]:
    """One fit of the run's Lightning trainer over ``skip`` + ``len(batches)`` steps (the first ``skip`` untimed),
    validation off; returns the job and the list each fit appends its timed seconds to."""
    timed: list[float] = []
    steps = skip + len(batches)
    # the untimed first steps reuse the timed batches, so every fit sees the same ones
    loader = DataLoader([batches[i % len(batches)] for i in range(steps)], batch_size=None, shuffle=False)

    def run() -> None:
        clock = _Clock(skip)
        trainer = run_trainer(cfg, folder, [CSVLogger(folder, name="", version="")], None, "min",
                              max_steps=steps, max_epochs=-1, limit_val_batches=0, enable_progress_bar=False,
                              num_sanity_val_steps=0)
        trainer.callbacks.append(clock)
        with warnings.catch_warnings():  # no validation and a reused folder, on purpose
            warnings.filterwarnings("ignore", message=".*(val_dataloader|exists and is not empty).*")
            trainer.fit(task, train_dataloaders=loader)
        timed.append(clock.seconds)

    return run, timed


def measure(args: list[str], variants: list[str], steps: int, rounds: int, baseline: str = "standard") -> dict:
    """Per variant, the bare loop's median seconds per step; for ``baseline`` also the Lightning loop's. Every
    variant's task is built from the same seed and trains on the same batches, at the run's ``threads``."""
    console.quiet()
    with torch_threads(compose(args).threads):
        tasks = {}
        for variant in variants:
            cfg, datamodule, task = build(args, variant)
            tasks[variant] = (cfg, task)
        batches = train_batches(datamodule, steps)
        jobs = {variant: bare_loop(cfg, task, batches) for variant, (cfg, task) in tasks.items()}
        with tempfile.TemporaryDirectory(prefix="quest-bench-") as folder:
            cfg, _ = tasks[baseline]
            *_, loop_task = build(args, baseline)
            loop, timed = lightning_loop(cfg, loop_task, batches, skip=2, folder=Path(folder))
            seconds = interleaved_seconds({**jobs, "loop": loop}, rounds, torch.device("cpu"))
        per_step = {variant: seconds[variant] / steps for variant in variants}
        loop_s = sorted(timed[1:])[len(timed[1:]) // 2] / steps  # the warm-up round's fit is not counted
        return {"config": args, "steps": steps, "rounds": rounds, "threads": torch.get_num_threads(),
                "params": sum(p.numel() for p in tasks[baseline][1].parameters()),
                "bare_ms": {v: 1e3 * s for v, s in per_step.items()},
                "ratio": {v: s / per_step[baseline] for v, s in per_step.items()},
                "loop_ms": 1e3 * loop_s, "loop_overhead": loop_s / per_step[baseline]}


def fixed_cost(args: list[str]) -> dict:
    """Where one ``quest train`` run's wall time goes, from a fresh process (its record's ``timing``), in the parts
    ``parts_s`` names; the fit less its checkpoint writes is training and validation, what grows with the run.
    ``fixed_share``: all but that, as a share of the process's wall time."""
    with tempfile.TemporaryDirectory(prefix="quest-fixed-") as folder:
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "runners.cli", "train", *args, f"output_dir={folder}",
                               "progress.style=none"], capture_output=True, text=True)
        wall = time.perf_counter() - start
        if done.returncode != 0:
            raise RuntimeError(f"quest train {' '.join(args)} exited {done.returncode}: {done.stderr.strip()[-300:]}")
        (record,) = [read_record(path) for path in find_records(folder)]
    timing = record.timing
    parts = {"start and imports": wall - record.wall_time_s, "build": timing.build_s,
             "fit (train + validate)": timing.fit_s - timing.checkpoint_s, "checkpoints": timing.checkpoint_s,
             "test": timing.test_s or 0.0}
    parts["record and exit"] = wall - sum(parts.values())
    return {"config": args, "wall_s": wall, "steps": timing.steps, "parts_s": parts,
            "fixed_share": 1 - parts["fit (train + validate)"] / wall}
