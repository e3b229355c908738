"""One run: config -> domain plugin -> Lightning Trainer (fit, then test on the best checkpoint) -> record.

Failure policy. Everything that can be checked before training is checked before the run directory is
created: the optimiser and schedule names, the Lightning trainer settings (precision, accelerator
availability, devices), and the data and model the domain builds from the config. A problem there is the
user's (``ConfigError`` / ``DataError``: one line, exit 2) and leaves nothing behind; a ``DataError`` met
later (data read lazily) removes what the run built too. A run that fails while training is recorded as
``status: failed`` (traceback in ``error.log``, one per rank under DDP) and exits 1. On a full disk the
partial checkpoints are removed and the record says so, or stderr when even the record cannot be written.

A run is built beside its directory and takes its place only with its record (``runners.runs.rundir``).
SIGINT and SIGTERM raise ``Stopped``: the run is recorded as ``status: stopped`` with the signal and the step
it reached, unless an earlier result is there to keep, and the command exits 128 + the signal.
"""
from __future__ import annotations

import errno
import shutil
import sys
import time
import traceback
from collections.abc import Sequence
from contextlib import contextmanager, nullcontext
from pathlib import Path

import pytorch_lightning as pl
import torch
from pytorch_lightning.utilities.rank_zero import rank_zero_only

from common.callbacks import BestCheckpoint, DivergenceCallback, ProbeCallback, ProgressLines, Snapshots
from common.errors import ConfigError, DataError, Stopped
from common.probes import with_peaks
from common.records import RECORD_NAME, RunRecord
from common.registry import get_domain
from common.schema import RunConfig
from runners import console
from runners.config import compose, run_directory
from runners.runs import trackers
from runners.runs.recording import fresh_run_directory, new_record, read_log, remove, save_record, settle, write_text
from runners.runs.rundir import claimed, final_path, lock_path


def train(args: list[str]) -> RunRecord:
    """Run ``quest train`` with command-line style ``key=value`` arguments; returns the record."""
    return run(compose(args))


def run(cfg: RunConfig, *, lock: bool = True, wait: bool = False, snapshots: Sequence[float] = ()) -> RunRecord:
    """Train and test one run and return its record. Raises ``ConfigError``/``DataError`` for bad input,
    ``Stopped`` on SIGINT or SIGTERM. Once the input is checked the run's lock is taken (``runners.runs.rundir``;
    with ``wait``, once the process holding it lets go): ``lock=False`` is for a caller that holds it.
    ``snapshots``: fractions of training at which to keep the weights as well (``common.callbacks.Snapshots``,
    in ``snapshots/``; the record lists them), for learning curves (``runners.runs.snapshot_tests``)."""
    console.quiet()
    with torch_threads(cfg.threads), Stopped.on_signals():
        domain = get_domain(cfg.domain)
        pl.seed_everything(cfg.seed, workers=True, verbose=False)
        batch = check_settings(cfg)
        trackers.check(cfg)  # a tracker turned on can log (its package imports)
        record = new_record(cfg, domain, batch)
        start = time.perf_counter()
        datamodule, task = build_run(domain, per_device(cfg, batch))
        if cfg.compile.enabled:
            # Each run from a clean slate: a sweep worker's earlier runs would count against dynamo's recompile
            # limit, past which it runs the step eagerly without a word. Inductor's cache on disk is kept.
            torch._dynamo.reset()
            task.compile_training(mode=cfg.compile.mode)
        # A domain with several kinds of task (graph: values or classes) lets the task name its metric.
        record.primary_metric, record.mode = domain.primary_of(task)
        run_dir = run_directory(cfg)
        # DDP's other ranks follow rank 0, which holds the lock for them
        with claimed(run_dir, wait) if lock and rank_zero_only.rank == 0 else nullcontext(True) as mine:
            if not mine:
                raise ConfigError(f"{run_dir} is being run by another process (it holds {lock_path(run_dir)}); "
                                  "pass --wait to run it after that one")
            _build(cfg, datamodule, task, record, start, snapshots)
        return record


def _build(cfg: RunConfig, datamodule, task, record: RunRecord, start: float,
           snapshots: Sequence[float] = ()) -> None:
    """Fit and test in a fresh build directory, and put it in the run directory's place with its record
    (``start``: when the run began, for its wall time); the trackers are given the record at the end."""
    build_dir = fresh_run_directory(cfg)
    record.timing = {"build_s": round(time.perf_counter() - start, 3)}  # config, data and model, before fitting
    loggers = trackers.loggers(cfg, build_dir)
    try:
        writes = _fit_and_test(cfg, build_dir, datamodule, task, record, loggers, snapshots)
    except (ConfigError, DataError):
        remove(build_dir)  # the user's to fix, met only while training: leave nothing behind
        trackers.finish(loggers, None)
        raise
    except Stopped as stop:
        stop.detail = _keep_or_record_stopped(build_dir, record)
        trackers.finish(loggers, record)
        raise
    record.wall_time_s = round(time.perf_counter() - start, 3)
    if writes:
        save_record(build_dir, record)
    trackers.finish(loggers, record)


def _keep_or_record_stopped(build_dir: Path, record: RunRecord) -> str:
    """A stopped run's record takes the run directory when it holds no earlier result; else the earlier
    result stays and the stopped attempt is removed. Returns what happened, for the one line printed."""
    run_dir = final_path(build_dir)
    if rank_zero_only.rank != 0:
        return record.error
    if (run_dir / RECORD_NAME).exists():
        remove(build_dir)
        return f"{record.error}; the earlier result in {run_dir} is kept"
    save_record(build_dir, record)
    return f"{record.error}; recorded as stopped in {run_dir}"


def build_run(domain, cfg: RunConfig) -> tuple:
    """The datamodule and task the domain builds from ``cfg``."""
    try:
        return domain.build(cfg)
    except ValueError as err:  # models reject settings they cannot use (e.g. heads not dividing dim)
        raise ConfigError(f"domain {domain.name!r}: {_first_line(err)}") from None


@contextmanager
def torch_threads(count: int | None):
    """torch's intra-op threads at ``count`` (None: unchanged) inside the block, as before it afterwards, so
    the next run of a sweep in this process starts as this one did."""
    before = torch.get_num_threads()
    if count:
        torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def check_settings(cfg: RunConfig) -> dict[str, int] | None:
    """The settings the schema cannot check: Lightning's trainer. Returns
    how ``data.batch_size`` splits over the trainer's devices (``device_batch``); None for a domain
    without one."""
    try:  # Lightning validates precision, accelerator availability and devices as it builds a trainer
        trainer = pl.Trainer(**dict(cfg.trainer), logger=False, enable_checkpointing=False, enable_model_summary=False)
    except Exception as err:
        raise ConfigError(f"trainer settings: {_first_line(err)}") from None
    if getattr(getattr(cfg, "data", None), "batch_size", None) is None:
        return None
    return device_batch(cfg.data.batch_size, trainer.world_size, trainer.accumulate_grad_batches)


def per_device(cfg: RunConfig, batch: dict[str, int] | None) -> RunConfig:
    """``cfg`` as one device builds it: its data loads its share of the global batch (``device_batch``)."""
    if batch is None:
        return cfg
    return cfg.model_copy(update={"data": cfg.data.model_copy(update={"batch_size": batch["per_device"]})})


def device_batch(global_batch: int, world_size: int, accumulate: int) -> dict[str, int]:
    """``data.batch_size`` is the global batch: the samples behind one optimiser step, over all devices and
    accumulation steps, so a preset means the same recipe on 1 GPU or 64 (its learning rate goes with it).
    Each device loads ``global / (world_size × accumulate)`` samples per forward pass."""
    per_device, rest = divmod(global_batch, world_size * accumulate)
    if rest or not per_device:
        raise ConfigError(f"data.batch_size={global_batch} (the global batch) does not split over {world_size} "
                          f"device(s) × {accumulate} accumulation step(s); make it a multiple of "
                          f"{world_size * accumulate}")
    return {"global": global_batch, "per_device": per_device, "world_size": world_size, "accumulate": accumulate}


def run_trainer(cfg: RunConfig, build_dir: Path, loggers: list, monitor: str | None, mode: str,
                snapshots: Sequence[float] = (), **trainer) -> pl.Trainer:
    """The Lightning trainer of a run, with what it records by: the best checkpoint on ``monitor``, the attention
    probes, the divergence watch, the progress display and any ``snapshots`` (``trainer``: settings over
    ``cfg.trainer``, for ``quest bench --model``, which times this loop). The display is one rule for every
    domain (``progress.style``): ``auto`` is the bar on an interactive terminal and ``ProgressLines`` on a log
    file or a pipe, where each refresh of a bar would be a line of its own; ``trainer.enable_progress_bar=false``
    turns the bar off whatever the style."""
    checkpoint = BestCheckpoint(dirpath=build_dir / "checkpoints", filename="best", monitor=monitor, mode=mode,
                                save_last=True, enable_version_counter=False)
    style = cfg.progress.style  # one of common.schema.PROGRESS_STYLES, checked when the config was composed
    if style == "auto":
        style = "bar" if sys.stdout.isatty() else "lines"
    bar = style == "bar" and cfg.trainer.enable_progress_bar
    lines = [ProgressLines(cfg.progress.every_n_steps, monitor)] if style == "lines" else []
    return pl.Trainer(**{**dict(cfg.trainer), "enable_progress_bar": bar, **trainer}, default_root_dir=build_dir,
                      logger=loggers, enable_model_summary=False,
                      callbacks=[checkpoint, ProbeCallback(**dict(cfg.probes)), DivergenceCallback(**dict(cfg.divergence)), *lines,
                                 *([Snapshots(build_dir / "snapshots", snapshots)] if snapshots else [])])


def _one(trainer: pl.Trainer, kind: type):
    return next(callback for callback in trainer.callbacks if isinstance(callback, kind))


def _fit_and_test(cfg: RunConfig, build_dir: Path, datamodule, task, record: RunRecord, loggers: list,
                  snapshots: Sequence[float] = ()) -> bool:
    """Fill ``record`` from training and testing (a failure becomes ``status: failed``); returns whether
    this process writes the record (rank 0 only)."""
    trainer = None
    try:
        record.params = sum(p.numel() for p in task.parameters())
        trainer = run_trainer(cfg, build_dir, loggers, f"val/{record.primary_metric}", record.mode, snapshots)
        checkpoint, probes, watch = (_one(trainer, kind) for kind in (BestCheckpoint, ProbeCallback, DivergenceCallback))
        began = time.perf_counter()
        trainer.fit(task, datamodule=datamodule)
        timing = record.timing
        timing.fit_s, timing.checkpoint_s = round(time.perf_counter() - began, 3), round(checkpoint.save_s, 3)
        timing.steps = trainer.global_step
        record.hardware["world_size"] = trainer.world_size
        record.probes = with_peaks(probes.latest, probes.peak)
        record.trajectory = probes.trajectory
        if snapshots:
            record.snapshots = _one(trainer, Snapshots).saved
        record.split = getattr(datamodule, "split_info", None)  # SplitDataModule's; plugins may use their own
        if trainer.is_global_zero:  # other ranks write no record: they must not read a log rank 0 is writing
            read_log(record, build_dir / "metrics.csv", watch.losses)
        metrics = {}
        if task.divergence is None:
            kept = checkpoint.last_model_path if cfg.test_checkpoint == "last" else checkpoint.best_model_path
            began = time.perf_counter()
            results = trainer.test(task, datamodule=datamodule, ckpt_path=kept or None, verbose=False, weights_only=True)
            record.timing.test_s = round(time.perf_counter() - began, 3)
            metrics = {k: float(v) for k, v in (results[0] if results else {}).items()}
        settle(record, task, task.divergence, metrics)
    except (ConfigError, DataError):
        raise
    except Stopped as stop:
        step = trainer.global_step if trainer is not None else 0
        record.status, record.error = "stopped", f"stopped by {stop.name} at step {step}"
        record.stopped = {"signal": stop.name, "step": step}
        raise
    except Exception as err:  # a failed run is a record too, so a sweep carries on
        record.fail(f"{type(err).__name__}: {_first_line(err)}")
        if _no_space(err):
            shutil.rmtree(build_dir / "checkpoints", ignore_errors=True)  # partial checkpoints free the space
            # where the write failed, as the user knows it: under the run directory's name, elsewhere the run directory
            filename, where = getattr(err, "filename", None), final_path(build_dir)
            if filename and Path(filename).is_relative_to(build_dir):
                where /= Path(filename).relative_to(build_dir)
            record.error = f"no space left on {where}"
        rank = rank_zero_only.rank
        write_text(build_dir / ("error.log" if rank == 0 else f"error.rank{rank}.log"), traceback.format_exc())
    return trainer.is_global_zero if trainer is not None else rank_zero_only.rank == 0


def _no_space(err: BaseException) -> bool:
    """Whether ``err`` or any error it was raised from is a full disk (ENOSPC, or a quota: EDQUOT)."""
    while err is not None:
        if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        err = err.__cause__ or err.__context__
    return False


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


