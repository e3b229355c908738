"""`quest robustness <run dir or checkpoint> [key=value ...]`: robust accuracy of a finished classifier run.

Rebuilds the run's domain from its resolved ``config.yaml``, loads ``checkpoints/best.ckpt`` (or the
checkpoint given), evaluates the test split with ``common.robustness.evaluate_robustness`` under the
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

import torch
from omegaconf import OmegaConf

from common.attention import get_variant
from common.records import read_record, write_record
from common.registry import discover, get_domain
from common.robustness import evaluate_robustness
from common.task import ClassificationTask
from runners.config import ConfigError, apply_override, build_config, parse_overrides
from runners.train import torch_threads

ELLIPTICAL_NOTE = ("elliptical variants compute their attention metric without gradient: white-box attacks "
                   "treat it as a constant, so these numbers may overstate robustness (gradient masking)")


def locate(path: str | Path) -> tuple[Path, Path]:
    """(run directory, checkpoint) from a run directory or a checkpoint file inside one."""
    path = Path(path)
    if path.is_file():
        run_dir = path.parent.parent if path.parent.name == "checkpoints" else path.parent
        return run_dir, path
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: no such run directory or checkpoint")
    checkpoint = path / "checkpoints" / "best.ckpt"
    if not checkpoint.exists():
        raise FileNotFoundError(f"{checkpoint}: the run has no best checkpoint (did it finish?)")
    return path, checkpoint


def load_run(cfg, checkpoint: Path):
    """The run's datamodule and task, built from its config, with the checkpoint's weights, in eval mode, on
    the GPU when the run asked for an accelerator and there is one."""
    discover("domains")
    datamodule, task = get_domain(cfg.domain).build(build_config(cfg))
    task.load_state_dict(torch.load(checkpoint, map_location="cpu", weights_only=False)["state_dict"])
    use_gpu = torch.cuda.is_available() and cfg.trainer.accelerator in ("auto", "gpu", "cuda")
    return datamodule, task.to("cuda" if use_gpu else "cpu").eval()


def load_config(run_dir: Path, overrides: list[str]):
    config_path = run_dir / "config.yaml"
    if not config_path.exists():
        raise FileNotFoundError(f"{config_path}: not a run directory (no resolved config)")
    cfg = OmegaConf.load(config_path)
    if "robustness" not in cfg:
        raise ConfigError(f"domain {cfg.domain!r} has no robustness section: robustness evaluation does not apply")
    groups, dotted = parse_overrides(overrides)
    if groups:
        raise ConfigError(f"{', '.join(groups)} cannot change for an existing run")
    for key, value in dotted:  # lists and mappings arrive as OmegaConf containers
        apply_override(cfg, key, value, "command line")
    return cfg


def evaluate_run(path: str | Path, overrides: list[str] = ()) -> dict[str, float]:
    """Evaluate one run and write the result into its record; returns the result."""
    run_dir, checkpoint = locate(path)
    record = read_record(run_dir)
    cfg = load_config(run_dir, list(overrides))
    with torch_threads(cfg.get("threads")):  # the run's own setting: a sweep worker's share of the cores
        datamodule, task = load_run(cfg, checkpoint)
        if not isinstance(task, ClassificationTask):
            raise ConfigError(f"domain {cfg.domain!r} is not a classifier: robustness evaluation does not apply")
        datamodule.setup("test")
        results = evaluate_robustness(task, datamodule.test_dataloader(), cfg.robustness)
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
        variant = OmegaConf.load(locate(path)[0] / "config.yaml").attention.variant
        print(f"{path}: " + " ".join(f"{k}={v:.4g}" for k, v in results.items()))
        if get_variant(variant).elliptical:
            print(f"  note: {ELLIPTICAL_NOTE}")
    return 0
