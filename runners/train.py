"""One run: config -> domain plugin -> Lightning Trainer (fit, then test on the best checkpoint) -> record."""
from __future__ import annotations

import os
import platform
import shutil
import subprocess
import time
import traceback
import warnings
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pandas as pd
import pytorch_lightning as pl
import torch
from omegaconf import DictConfig, OmegaConf
from pytorch_lightning.callbacks import ModelCheckpoint
from pytorch_lightning.loggers import CSVLogger, TensorBoardLogger
from pytorch_lightning.utilities.rank_zero import rank_zero_only

from common.callbacks import ProbeCallback
from common.data import DataError
from common.records import RECORD_NAME, SCHEMA_VERSION, write_record
from common.registry import get_domain
from runners.config import build_config, compose, run_directory

PROJECT_ROOT = Path(__file__).resolve().parents[1]
# The run directory also holds config.yaml and checkpoints; Lightning's CSV logger warns about any neighbour.
warnings.filterwarnings("ignore", message="Experiment logs directory .* exists")
PACKAGES = ("torch", "pytorch-lightning", "torch-geometric", "torchaudio", "torchmetrics", "omegaconf", "open3d")


def train(args: list[str]) -> dict:
    """Run ``quest train`` with command-line style ``key=value`` arguments; returns the record."""
    return run(compose(args))


def run(cfg: DictConfig) -> dict:
    domain = get_domain(cfg.domain)
    run_dir = run_directory(cfg)
    rank_zero = rank_zero_only.rank == 0  # read from the launcher's environment (DDP children, SLURM tasks)
    if rank_zero and run_dir.exists() and not (run_dir / RECORD_NAME).exists():
        shutil.rmtree(run_dir)  # an interrupted earlier attempt: start clean
    run_dir.mkdir(parents=True, exist_ok=True)
    if rank_zero:
        (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg))
    threads = torch.get_num_threads()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    try:
        return _run(cfg, domain, run_dir)
    finally:
        torch.set_num_threads(threads)  # later runs of a sweep in this process start as this one did


def _run(cfg: DictConfig, domain, run_dir: Path) -> dict:
    pl.seed_everything(cfg.seed, workers=True, verbose=False)

    record = _new_record(cfg, domain)
    start, trainer, failure = time.perf_counter(), None, None
    try:
        datamodule, task = domain.build(build_config(cfg))
        record["params"] = sum(p.numel() for p in task.parameters())
        monitor = f"val/{domain.metric}"
        checkpoint = ModelCheckpoint(dirpath=run_dir / "checkpoints", filename="best", monitor=monitor,
                                     mode=domain.mode, save_last=True, enable_version_counter=False)
        probes = ProbeCallback(**cfg.probes)
        loggers = [CSVLogger(run_dir, name="", version="")]
        if cfg.logging.tensorboard:
            loggers.append(TensorBoardLogger(run_dir, name="", version="tensorboard"))
        trainer = pl.Trainer(**cfg.trainer, default_root_dir=run_dir, logger=loggers,
                             callbacks=[checkpoint, probes], enable_model_summary=False)
        trainer.fit(task, datamodule=datamodule)
        record["probes"] = probes.latest
        record["best_val"] = _best_validation(run_dir / "metrics.csv", monitor, domain.mode)
        if task.divergence is not None:
            record.update(status="diverged", divergence=task.divergence)
        else:
            best = checkpoint.best_model_path or None
            results = trainer.test(task, datamodule=datamodule, ckpt_path=best, verbose=False)
            record["metrics"] = {k: float(v) for k, v in (results[0] if results else {}).items()}
    except Exception as err:  # a failed run is a record too, so a sweep carries on
        failure = err
        record.update(status="failed", error=f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}")
        (run_dir / "error.log").write_text(traceback.format_exc())
    record["wall_time_s"] = round(time.perf_counter() - start, 3)
    if trainer is None or trainer.is_global_zero:
        write_record(run_dir, record)
    if isinstance(failure, DataError):  # bad input is the user's to fix: report it as such
        raise failure
    return record


def _new_record(cfg: DictConfig, domain) -> dict:
    return {
        "schema": SCHEMA_VERSION,
        "domain": cfg.domain,
        "dataset": str(cfg.get("data", {}).get("dataset", "default")),
        "variant": cfg.attention.variant,
        "seed": int(cfg.seed),
        "preset": cfg.preset,
        "status": "ok",
        "config": OmegaConf.to_container(cfg, resolve=True),
        "metrics": {},
        "primary_metric": domain.metric,
        "mode": domain.mode,
        "best_val": {"value": None, "epoch": None},
        "divergence": None,
        "error": None,
        "probes": {},
        "wall_time_s": 0.0,
        "params": 0,
        "hardware": _hardware(),
        "versions": _versions(),
        "git_commit": _git_commit(),
    }


def _best_validation(metrics_csv: Path, monitor: str, mode: str) -> dict:
    """Best validation value and its epoch, read back from the CSV log."""
    if not metrics_csv.exists():
        return {"value": None, "epoch": None}
    log = pd.read_csv(metrics_csv)
    if monitor not in log:
        return {"value": None, "epoch": None}
    rows = log.dropna(subset=[monitor])
    if rows.empty:
        return {"value": None, "epoch": None}
    best = rows[monitor].idxmin() if mode == "min" else rows[monitor].idxmax()
    return {"value": float(rows.loc[best, monitor]), "epoch": int(rows.loc[best, "epoch"])}


def _hardware() -> dict:
    info = {"platform": platform.platform(), "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads()}
    if torch.cuda.is_available():
        info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return info


def _versions() -> dict:
    found = {"python": platform.python_version()}
    for package in PACKAGES:
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            pass
    return found


def _git_commit() -> str | None:
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=PROJECT_ROOT, capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=PROJECT_ROOT,
                               capture_output=True, text=True).stdout.strip()
        return commit + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return None
