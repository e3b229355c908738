"""Where a run's metrics go besides its record: Lightning's loggers, and what each experiment tracker is told
once the record is complete.

The CSV log is always written (the record reads its best validation value back from it), TensorBoard's with
``logging.tensorboard``, both in the run directory. MLflow (``logging.mlflow``) and Weights & Biases
(``logging.wandb``) are off by default and, when on, log offline: MLflow to a local file store
(``tracking_uri``, ``file:./mlruns``), W&B in offline mode under ``<dir>/wandb`` (``wandb sync`` uploads it
later; ``mode=online`` logs live). Their stores lie outside the run directory, which is built under another
name and renamed when the run ends (``runners.runs.rundir``). Each tracker run is named
``<domain>/<variant>/<run directory name>`` and tagged with the run directory, so that it and its record can be
matched. mlflow and wandb are imported only for a run that turns them on (``check``).
"""
from __future__ import annotations

import importlib
import json
import logging
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from pytorch_lightning.loggers import CSVLogger, Logger, MLFlowLogger, TensorBoardLogger, WandbLogger
from pytorch_lightning.utilities.rank_zero import rank_zero_only

from common.errors import ConfigError, error_line
from common.records import RunRecord
from common.schema import RunConfig
from runners.config import compose
from runners.runs.rundir import final_path

log = logging.getLogger(__name__)

TRACKERS = ("mlflow", "wandb")  # the sections of ``logging`` that turn a tracker on, each its package's name
INSTALL = "pip install 'quest-study[tracking]'"
# each tracker's name in messages, and the settings that say where it logs (none may be empty)
NAMED = {"mlflow": ("MLflow", ("tracking_uri", "experiment")), "wandb": ("W&B", ("project", "dir"))}
# the record, as each tracker stores it; not record.json: a store kept under an output directory must not hold
# records that ``quest aggregate`` would count twice
ARTIFACT = "quest-record.json"
# a record's status -> how the tracker run ends: MLflow's run status, W&B's exit code
MLFLOW_STATUS = {"ok": "FINISHED", "diverged": "FINISHED", "failed": "FAILED", "stopped": "KILLED"}


def enabled(cfg: RunConfig) -> list[str]:
    return [name for name in TRACKERS if getattr(cfg.logging, name).enabled]


def check(cfg: RunConfig) -> None:
    """A ``ConfigError`` for a tracker turned on that cannot log: its package missing or an empty name (the schema
    checks the rest). Imports the package (only that of a tracker turned on)."""
    for name in enabled(cfg):
        try:
            importlib.import_module(name)
        except ImportError as err:
            raise ConfigError(f"logging.{name}.enabled=true needs {name}, which cannot be imported "
                              f"({error_line(err)}); install it with {INSTALL}") from None
    for name in enabled(cfg):
        label, keys = NAMED[name]
        for key in keys:
            if not str(getattr(getattr(cfg.logging, name), key) or "").strip():
                raise ConfigError(f"logging.{name}.{key} is empty; name where {label} logs")


def mlflow_uri(uri: str) -> str:
    """``uri`` with a local file store's path made absolute (``file:./mlruns`` -> ``file:/abs/mlruns``), so
    that the run and the launch log name the same store whatever directory reads them later."""
    if ":" in uri and not uri.startswith("file:"):
        return uri  # a server, a database, Databricks
    path = uri.removeprefix("file://") if uri.startswith("file://") else uri.removeprefix("file:")
    return f"file:{Path(path).expanduser().resolve()}"


def wandb_root(cfg: RunConfig) -> Path:
    """The folder W&B writes its runs under (``<dir>/wandb/<mode>-run-*``)."""
    return Path(cfg.logging.wandb.dir).expanduser().resolve() / "wandb"


def sweep_destinations(runs: Iterable[Sequence[str]]) -> dict[str, str]:
    """Where the runs of a sweep (their ``quest train`` arguments) log, in words (MLflow: ``<tracking uri> /
    <experiment>``, W&B: ``<project> (<mode>, <folder>)``), each tracker's places joined by ``; `` (a grid may send
    runs to several); runs whose config does not compose are left out."""
    found: dict[str, dict[str, None]] = {}  # each tracker's places, in order, once each
    for args in runs:
        try:
            cfg = compose(list(args))
        except ConfigError:
            continue
        mlflow, wandb = cfg.logging.mlflow, cfg.logging.wandb
        if "mlflow" in enabled(cfg):
            found.setdefault("mlflow", {})[f"{mlflow_uri(mlflow.tracking_uri)} / {mlflow.experiment}"] = None
        if "wandb" in enabled(cfg):
            found.setdefault("wandb", {})[f"{wandb.project} ({wandb.mode}, {wandb_root(cfg)})"] = None
    return {name: "; ".join(places) for name, places in found.items()}


def csv_log(build_dir: Path) -> CSVLogger:
    """The run's ``metrics.csv`` (in ``build_dir``), which both trainers write and the record reads back."""
    return CSVLogger(build_dir, name="", version="")


def loggers(cfg: RunConfig, build_dir: Path) -> list[Logger]:
    """Lightning's loggers of the run built in ``build_dir``: CSV, TensorBoard, MLflow and W&B as ``cfg.logging``
    says (``check`` has checked the trackers)."""
    found: list[Logger] = [csv_log(build_dir)]
    if cfg.logging.tensorboard:
        found.append(TensorBoardLogger(build_dir, name="", version="tensorboard"))
    run_dir = final_path(build_dir)
    name, where = f"{cfg.domain}/{cfg.attention.variant}/{run_dir.name}", os.path.abspath(run_dir)
    if "mlflow" in enabled(cfg):
        uri = mlflow_uri(cfg.logging.mlflow.tracking_uri)
        if uri.startswith("file:"):  # MLflow 3 keeps its file store for those who ask for it
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        tags = {"quest.run_dir": where, "quest.domain": cfg.domain, "quest.variant": cfg.attention.variant,
                "quest.seed": str(cfg.seed), "quest.preset": cfg.preset}
        found.append(MLFlowLogger(experiment_name=cfg.logging.mlflow.experiment, run_name=name, tracking_uri=uri,
                                  tags=tags))
    if "wandb" in enabled(cfg):
        root = wandb_root(cfg).parent
        root.mkdir(parents=True, exist_ok=True)
        # mode passed to wandb.init: `offline=True` would set WANDB_MODE for every later run of the process
        wandb = WandbLogger(name=name, project=cfg.logging.wandb.project, save_dir=str(root),
                            mode=cfg.logging.wandb.mode, job_type="train", notes=where,
                            tags=[cfg.domain, cfg.attention.variant, run_dir.name])
        if getattr(wandb, "_wandb_init", {}).get("anonymous", False) is None:  # W&B warns of the setting, even unset
            del wandb._wandb_init["anonymous"]
        found.append(wandb)
    return found


def flat_config(config: dict, prefix: str = "") -> dict[str, object]:
    """The config as dotted keys (``optim.lr``), as the command line sets them; empty sections left out."""
    flat = {}
    for key, value in config.items():
        if isinstance(value, dict):
            flat.update(flat_config(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def numbers(record: RunRecord) -> dict[str, float]:
    """The record's numbers a tracker shows: its test metrics, best validation value and wall time."""
    found = {key: float(value) for key, value in record.metrics.items()}
    if record.best_val.value is not None:
        found["best_val"] = float(record.best_val.value)
    found["wall_time_s"] = float(record.wall_time_s)
    return found


def notes(record: RunRecord) -> dict[str, str]:
    """The record's words a tracker shows: status, primary metric and its direction, the error if any."""
    words = {"status": record.status, "primary_metric": record.primary_metric, "mode": record.mode}
    if record.error:
        words["error"] = record.error[:5000]
    return words


def finish(run_loggers: Sequence[Logger], record: RunRecord | None) -> None:
    """Give each tracker of ``run_loggers`` the completed ``record`` (config, headline numbers, the record) and
    end its run as the record's status says; ``record`` None (the run was given up as the user's to fix) ends
    any tracker run already begun as failed. Rank 0 only. A tracker that fails here is a warning: the run's
    record is what counts, and it is written."""
    if rank_zero_only.rank != 0:
        return
    data = None if record is None else json.loads(json.dumps(record.to_json(), sort_keys=True, default=float))
    for logger in run_loggers:
        kind = "mlflow" if isinstance(logger, MLFlowLogger) else "wandb" if isinstance(logger, WandbLogger) else None
        if kind is None:
            continue
        try:
            (_finish_mlflow if kind == "mlflow" else _finish_wandb)(logger, record, data)  # data: as record.json holds it
        except Exception as err:
            log.warning("%s could not log the run: %s", kind, error_line(err))


def _finish_mlflow(logger, record: RunRecord | None, data: dict | None) -> None:
    if record is None:
        if logger._initialized:  # else MLflow has no run to end
            logger.experiment.set_terminated(logger.run_id, "FAILED")
        return
    client, run_id = logger.experiment, logger.run_id  # begins the run if training never reached the logger
    try:
        logger.log_hyperparams(flat_config(record.config))  # in batches, overlong values cut, as Lightning does
        latest = client.get_run(run_id).data.metrics  # Lightning logged the test metrics: not again, unless changed
        for key, value in numbers(record).items():
            if latest.get(key) != value:  # at the last step it was logged at, so that it is the run's latest value
                steps = [metric.step for metric in client.get_metric_history(run_id, key)]
                client.log_metric(run_id, key, value, step=max(steps, default=0))
        for key, value in notes(record).items():
            client.set_tag(run_id, f"quest.{key}", value)
        client.log_dict(run_id, data, ARTIFACT)
    finally:
        client.set_terminated(run_id, MLFLOW_STATUS.get(record.status, "FAILED"))


def _finish_wandb(logger, record: RunRecord | None, data: dict | None) -> None:
    if record is None:
        if logger._experiment is not None:  # else W&B has no run to end
            logger.experiment.finish(exit_code=1)
        return
    run = logger.experiment
    try:
        run.config.update(flat_config(record.config), allow_val_change=True)
        run.summary.update({**numbers(record), **notes(record)})
        path = Path(run.dir) / ARTIFACT
        path.write_text(json.dumps(data, indent=2, sort_keys=True))
        run.save(str(path), base_path=run.dir, policy="now")
    finally:  # an unfinished W&B run would be taken up by the next run of the process (a sweep's worker)
        run.finish(exit_code=0 if MLFLOW_STATUS.get(record.status) == "FINISHED" else 1)
