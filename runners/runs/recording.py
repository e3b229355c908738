"""A run's record (``common.records.RunRecord``) and the directory it is built in (``runners.runs.rundir``), which
both trainers (``runners.runs.training`` and ``runners.runs.ensemble``) fill and write through these functions."""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pandas as pd
from pytorch_lightning.utilities.rank_zero import rank_zero_only

from common.errors import ConfigError
from common.files import MAX_TRAINING_LOG_BYTES, read_table
from common.records import SCHEMA_VERSION, RunRecord, write_record
from common.registry import get_domain
from common.schema import RunConfig
from runners.config import as_dict, as_yaml, run_directory
from runners.runs.provenance import git_commit, hardware, versions
from runners.runs.rundir import build_path, final_path, publish


def new_record(cfg: RunConfig, domain, batch: dict[str, int] | None) -> RunRecord:
    """The record of a run of ``cfg`` as it starts: ``ok`` until it ends otherwise, nothing measured yet."""
    return RunRecord(
        schema=SCHEMA_VERSION,
        domain=cfg.domain,
        dataset=str(getattr(getattr(cfg, "data", None), "dataset", "default")),
        variant=cfg.attention.variant,
        seed=int(cfg.seed),
        preset=cfg.preset,
        status="ok",
        config=as_dict(cfg),
        metrics={},
        primary_metric=domain.metric,
        mode=domain.mode,
        best_val={"value": None, "epoch": None},
        divergence=None,
        error=None,
        probes={},
        wall_time_s=0.0,
        params=0,
        hardware=hardware(),
        versions=versions(),
        git_commit=git_commit(),
        batch=batch,
    )


def fresh_run_directory(cfg: RunConfig) -> Path:
    """The directory the run is built in (``runners.runs.rundir``), emptied of any earlier attempt by rank 0 (the
    launcher's environment says which rank this is); ``save_record`` puts it in the run directory's place.
    An output directory that cannot be written is the user's to fix."""
    run_dir = run_directory(cfg)
    build_dir = build_path(run_dir)
    try:
        if rank_zero_only.rank == 0:
            if build_dir.exists():
                shutil.rmtree(build_dir)
            build_dir.mkdir(parents=True)
            (build_dir / "config.yaml").write_text(as_yaml(cfg))
        else:
            build_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ConfigError(f"cannot write the run directory {run_dir}: {err.strerror or err}") from None
    return build_dir


def read_log(record: RunRecord, metrics_csv: Path, train_losses: dict[str, float]) -> None:
    """The record's fields read back from a run's CSV log: ``best_val``, the best value of the primary validation
    metric, its epoch, and which of the run's validations it was (``evaluation``, from 1, of ``evaluations``: a
    run whose best is its last was still improving when it stopped); and its ``losses``: ``train_losses``
    (``common.rules.LossWatch.losses``) with the validation loss of the last and of the best validation epoch
    (for learning-rate sensitivity)."""
    log = read_table(metrics_csv, "training log", MAX_TRAINING_LOG_BYTES) if metrics_csv.exists() else pd.DataFrame()
    monitor = f"val/{record.primary_metric}"
    best_val, losses = {"value": None, "epoch": None}, dict(train_losses)
    rows = log.dropna(subset=[monitor]) if monitor in log else log.iloc[:0]
    if not rows.empty:
        best = rows[monitor].idxmin() if record.mode == "min" else rows[monitor].idxmax()
        best_val = {"value": float(rows.loc[best, monitor]), "epoch": int(rows.loc[best, "epoch"]),
                    "evaluation": rows.index.get_loc(best) + 1, "evaluations": len(rows)}
    values = log["val/loss"].dropna() if "val/loss" in log else []
    if len(values):
        losses.update(val_final=float(values.iloc[-1]), val_best=float(values.min()))
    record.best_val, record.losses = best_val, losses


def settle(record: RunRecord, task, divergence: dict | None, metrics: dict[str, float]) -> None:
    """A trained run's outcome in its record: diverged (``divergence``), else its test ``metrics``; and what the
    task says of its metrics (``common.task.Task.directions``, ``baselines``, ``summary_metrics``)."""
    if divergence is not None:
        record.status, record.divergence = "diverged", divergence
    else:
        record.metrics = metrics
    record.directions, record.baselines = task.directions(), task.baselines()
    record.headline = task.summary_metrics(record.primary_metric)


def record_killed(cfg: RunConfig, error: str) -> None:
    """Record as failed, with ``error``, a run whose process was killed before it could (a native crash);
    what it had built becomes the run directory, as a failed run's does."""
    build_dir = build_path(run_directory(cfg))
    build_dir.mkdir(parents=True, exist_ok=True)
    (build_dir / "config.yaml").write_text(as_yaml(cfg))
    record = new_record(cfg, get_domain(cfg.domain), None)
    record.fail(error)
    save_record(build_dir, record)


def save_record(build_dir: Path, record: RunRecord) -> None:
    """Write the record into the build directory and put the run in its directory's place (``publish``).
    Where that fails the outcome is lost, so the run has failed: ``record`` says so and why, stderr too
    (where a person or scheduler looks), and the build directory is removed (its checkpoints may be what
    filled the disk), so the earlier result, if any, stays."""
    run_dir = final_path(build_dir)
    try:
        write_record(build_dir, record)
        publish(build_dir, run_dir)
    except OSError as err:
        remove(build_dir)
        lost = f"record not written to {run_dir}: {err.strerror or err}"
        record.fail(f"{record.error}; {lost}" if record.error else lost)
        print(f"quest: {record.error}", file=sys.stderr)


def write_text(path: Path, text: str) -> None:
    try:
        path.write_text(text)
    except OSError as err:
        print(f"quest: could not write {path}: {err.strerror or err}\n{text}", file=sys.stderr)


def remove(run_dir: Path) -> None:
    if rank_zero_only.rank == 0:
        shutil.rmtree(run_dir, ignore_errors=True)
