"""What the ensemble trainer (``runners.runs.ensemble``) runs, and which runs it trains together. Kept apart from
the trainer so that a sweep can plan its chunks without importing Lightning."""
from __future__ import annotations

from common.errors import ConfigError
from common.schema import RunConfig
from runners.config import as_dict, config_hash, holder

PER_MEMBER = ("seed", "optim.lr", "optim.weight_decay")  # what the runs trained together may differ in


def group_key(cfg: RunConfig) -> str:
    """Equal for runs that may train together: configs equal but for ``PER_MEMBER``."""
    plain = as_dict(cfg)
    for key in PER_MEMBER:
        section, leaf = holder(plain, key)
        section[leaf] = 0
    return config_hash(plain)


def check_replayable(cfg: RunConfig) -> None:
    """A ``ConfigError`` naming the settings of ``cfg`` that the ensemble trainer does not replay."""
    trainer, problems = cfg.trainer, []
    if cfg.optim.name != "adamw":
        problems.append(f"optim.name={cfg.optim.name}")
    if trainer.max_steps not in (-1, None):
        problems.append(f"trainer.max_steps={trainer.max_steps}")
    problems += [f"trainer.{k}={getattr(trainer, k)}" for k in ("limit_train_batches", "limit_val_batches", "limit_test_batches")
                 if getattr(trainer, k) != 1.0]
    if str(trainer.precision) not in ("32-true", "32"):
        problems.append(f"trainer.precision={trainer.precision}")
    if trainer.accelerator != "cpu" or trainer.devices != 1 or trainer.num_nodes != 1:
        problems.append("a device other than one CPU")
    problems += [f"optim.{key}={getattr(cfg.optim, key)}" for key, off in (("min_lr", None), ("independent_weight_decay", False),
                                                                 ("z_loss", 0.0)) if getattr(cfg.optim, key) != off]
    if cfg.test_checkpoint != "best":  # it keeps each run's best weights, not its last
        problems.append(f"test_checkpoint={cfg.test_checkpoint}")
    if cfg.compile.enabled:  # the ensemble's vmapped step is not compiled; an eager run would answer for it
        problems.append("compile.enabled=true")
    if getattr(cfg.task, "perturbations", None):
        problems.append("task.perturbations")
    if problems:
        raise ConfigError(f"the ensemble trainer does not replay {', '.join(problems)}; run it with quest sweep")
