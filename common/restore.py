"""A finished run back in memory (``common.checkpoint.run_config`` names its parts), for the commands that use one:
``quest robustness`` and the domains' ``quest imagenet`` and ``quest generate``."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from common.checkpoint import read_checkpoint
from common.errors import ConfigError
from common.registry import get_domain
from common.schema import RunConfig


@dataclass
class Restored:
    run_dir: Path
    checkpoint: Path
    cfg: RunConfig
    datamodule: Any
    task: Any


def restore(run_dir: Path, checkpoint: Path, cfg: RunConfig, device: str | None = None) -> Restored:
    """The run's datamodule and task with the checkpoint's weights, in eval mode, on ``device`` (default:
    the GPU when the run asked for an accelerator and there is one)."""
    datamodule, task = get_domain(cfg.domain).build(cfg)  # an older run's config lacking a key: refused when read
    try:
        task.load_state_dict(read_checkpoint(checkpoint, key="run")["state_dict"])
    except RuntimeError as err:  # missing, unexpected or reshaped tensors: weights of another model
        raise ConfigError(f"run: {checkpoint} does not hold this run's model "
                          f"({str(err).strip().splitlines()[-1].strip()})") from None
    if device is None:
        device = "cuda" if torch.cuda.is_available() and cfg.trainer.accelerator in ("auto", "gpu", "cuda") else "cpu"
    return Restored(run_dir, checkpoint, cfg, datamodule, task.to(device).eval())
