"""Robust accuracy of a finished classifier run, stored in its record (``quest robustness``, and sweeps with
``robustness: true``): the run rebuilt from its ``config.yaml`` and checkpoint (``common.checkpoint.restore``), its test
split evaluated by ``common.perturbations.evaluate_robustness`` under the config's ``robustness`` section."""
from __future__ import annotations

from pathlib import Path

from common.checkpoint import restore, run_config
from common.errors import ConfigError
from common.perturbations import evaluate_robustness
from common.records import read_record, write_record
from common.task import ClassificationTask
from runners.config import parse_overrides, with_overrides
from runners.runs.training import torch_threads


def evaluate_run(path: str | Path, overrides: list[str] = ()) -> dict[str, float]:
    """Evaluate one run (``common.checkpoint.run_config``), with this evaluation's ``overrides`` applied, and write
    the result into its record; returns the result."""
    run_dir, checkpoint, cfg = run_config(path, key="run")
    if not hasattr(cfg, "robustness"):
        raise ConfigError(f"domain {cfg.domain!r} has no robustness section: robustness evaluation does not apply")
    groups, dotted = parse_overrides(list(overrides))
    if groups:
        raise ConfigError(f"{', '.join(groups)} cannot change for an existing run")
    cfg = with_overrides(cfg, dotted)
    record = read_record(run_dir)
    with torch_threads(cfg.threads):  # a sweep worker's share of the threads
        datamodule, task = restore(checkpoint, cfg)
        if not isinstance(task, ClassificationTask):
            raise ConfigError(f"domain {cfg.domain!r} is not a classifier: robustness evaluation does not apply")
        datamodule.setup("test")
        results = evaluate_robustness(task, datamodule.test_dataloader(), cfg.robustness)
    record.robustness = results
    record.robustness_config = cfg.robustness.model_dump(mode="json")
    write_record(run_dir, record)
    return results
