"""Learning curves from one run (``quest curve``, and sweeps with ``snapshots:``): each snapshot the run kept
(``common.callbacks.Snapshots``) restored and tested on the test split as the run's kept checkpoint was, and,
with ``robustness`` for a classifier whose config has a ``robustness`` section, attacked and corrupted as
``quest robustness`` does; stored in the record as ``curve``. A snapshot is the run's weights at that fraction
of training, with the learning rate not yet decayed as a run of that length would have decayed it."""
from __future__ import annotations

from pathlib import Path

import pytorch_lightning as pl

from common.checkpoint import restore, run_config
from common.errors import ConfigError
from common.files import inside
from common.perturbations import evaluate_robustness
from common.records import CurvePoint, read_record, write_record
from common.task import ClassificationTask
from runners.runs.training import torch_threads


def evaluate_curve(path: str | Path, robustness: bool = False) -> list[CurvePoint]:
    """Test every snapshot of the run at ``path``; writes and returns the record's ``curve``."""
    run_dir, _, cfg = run_config(path, key="run")
    record = read_record(run_dir)
    if not record.snapshots:
        raise ConfigError(f"{run_dir} kept no snapshots (a sweep keeps them with `snapshots:`)")
    files = [inside(run_dir / "snapshots", snapshot.file, "snapshot") for snapshot in record.snapshots]  # a record is data
    points = []
    with torch_threads(cfg.threads):
        for snapshot, file in zip(record.snapshots, files):
            datamodule, task = restore(file, cfg)
            trainer = pl.Trainer(accelerator="gpu" if next(task.parameters()).is_cuda else "cpu", devices=1,
                                 logger=False, enable_progress_bar=False, enable_model_summary=False)
            results = trainer.test(task, datamodule=datamodule, verbose=False)
            point = {"fraction": snapshot.fraction, "step": snapshot.step,
                     "metrics": {k: float(v) for k, v in (results[0] if results else {}).items()}}
            if robustness and hasattr(cfg, "robustness") and isinstance(task, ClassificationTask):
                point["robustness"] = evaluate_robustness(task, datamodule.test_dataloader(), cfg.robustness)
            points.append(point)
    record.curve = points
    write_record(run_dir, record)
    return record.curve
