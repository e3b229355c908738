"""`quest robustness <run dir or checkpoint> [key=value ...]`: robust accuracy of a finished classifier run.

Rebuilds the run from its resolved ``config.yaml`` with its best checkpoint (else its last, or the
checkpoint given; ``runners.restore``), evaluates the test split with ``common.robustness.evaluate_robustness`` under the
config's ``robustness`` section, and stores the result in the run's record as ``robustness``.
Overrides such as ``robustness.eps=[0.1]`` or ``robustness.max_samples=100`` apply to this evaluation
only (they are saved beside the result as ``robustness_config``).

Applies to classification domains whose config has a ``robustness`` section (vision; point clouds and
speech with ``input_range: null`` and no image corruptions); regression and dense-prediction domains
have no such section and are refused.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from common.attention import get_variant
from common.checkpoint import run_config
from common.records import read_record, write_record
from common.robustness import evaluate_robustness
from common.task import ClassificationTask
from runners.config import ConfigError, apply_override, parse_overrides
from runners.restore import restore
from runners.train import normalization, torch_threads

ELLIPTICAL_NOTE = ("elliptical variants compute their attention metric without gradient: white-box attacks "
                   "treat it as a constant, so these numbers may overstate robustness (gradient masking)")


def load_config(path: str | Path, overrides: list[str]) -> tuple[Path, Path, DictConfig]:
    """The run at ``path`` (``common.checkpoint.run_config``) with this evaluation's ``overrides`` applied."""
    run_dir, checkpoint, cfg = run_config(path, key="run")
    if "robustness" not in cfg:
        raise ConfigError(f"domain {cfg.domain!r} has no robustness section: robustness evaluation does not apply")
    groups, dotted = parse_overrides(overrides)
    if groups:
        raise ConfigError(f"{', '.join(groups)} cannot change for an existing run")
    for key, value in dotted:  # lists and mappings arrive as OmegaConf containers
        apply_override(cfg, key, value, "command line")
    return run_dir, checkpoint, cfg


def evaluate_run(path: str | Path, overrides: list[str] = ()) -> dict[str, float]:
    """Evaluate one run and write the result into its record; returns the result."""
    run_dir, checkpoint, cfg = load_config(path, list(overrides))
    record = read_record(run_dir)
    with torch_threads(cfg.get("threads")), normalization(cfg):  # the run's own settings (threads: a worker's share)
        run = restore(run_dir, checkpoint, cfg)
        if not isinstance(run.task, ClassificationTask):
            raise ConfigError(f"domain {cfg.domain!r} is not a classifier: robustness evaluation does not apply")
        run.datamodule.setup("test")
        results = evaluate_robustness(run.task, run.datamodule.test_dataloader(), cfg.robustness)
    record["robustness"] = results
    record["robustness_config"] = OmegaConf.to_container(cfg.robustness, resolve=True)
    write_record(run_dir, record)
    return results


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="quest robustness", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("args", nargs="+", metavar="RUN | KEY=VALUE",
                        help="run directories or checkpoint files, and config overrides for this evaluation")
    args = parser.parse_args(argv).args
    overrides = [a for a in args if "=" in a and not Path(a).exists()]
    runs = [a for a in args if a not in overrides]
    if not runs:
        parser.error("no run directory or checkpoint given")
    for path in runs:
        results = evaluate_run(path, overrides)
        variant = run_config(path, key="run")[2].attention.variant
        print(f"{path}: " + " ".join(f"{k}={v:.4g}" for k, v in results.items()))
        if get_variant(variant).elliptical:
            print(f"  note: {ELLIPTICAL_NOTE}")
    return 0
