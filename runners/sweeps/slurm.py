"""A sweep as one SLURM job array, through submitit."""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from common.errors import ConfigError
from common.optional import require
from runners.sweeps.workers import run_all

if TYPE_CHECKING:
    from runners.sweeps.spec import Sweep

class SweepJob:
    """One run of a sweep as a SLURM array task. On preemption or timeout submitit requeues it
    (``checkpoint``); the requeued task restarts the run, as a local sweep would."""

    def __init__(self, robustness: bool = False, snapshots: list[float] = ()):
        self.robustness, self.snapshots = robustness, list(snapshots)

    def __call__(self, args: list[str]) -> dict[str, int]:
        return run_all([args], self.robustness, snapshots=self.snapshots)

    def checkpoint(self, args: list[str]):
        import submitit

        return submitit.helpers.DelayedSubmission(self, args)


def require_sbatch() -> None:
    """A ``ConfigError`` where SLURM's ``sbatch`` is not on PATH: asked for SLURM there, submitit would run the jobs
    on this machine, detached, after quest has exited."""
    if shutil.which("sbatch") is None:
        raise ConfigError("--launcher slurm needs SLURM's sbatch on PATH and there is none; nothing was submitted "
                          "(run the sweep here with --launcher local)")


def launch_slurm(runs: list[list[str]], spec: Sweep, folder: str | Path, cluster: str = "slurm"):
    """Submit the sweep as one job array through submitit (to SLURM, never run here in its place);
    ``cluster="debug"`` runs it in process."""
    submitit = require("submitit", extra="slurm")

    executor = submitit.AutoExecutor(folder=folder, cluster=cluster)
    executor.update_parameters(name="quest-sweep", **spec.slurm.model_dump(by_alias=True, exclude_none=True, exclude={"additional"}),
                               **{f"slurm_{k}": v for k, v in spec.slurm.additional.items()})
    return executor.map_array(SweepJob(spec.robustness, spec.snapshots), runs)


def submit_slurm(runs: list[list[str]], spec: Sweep, folder: Path) -> None:
    if not runs:
        print("sweep: nothing to submit, every run is recorded or invalid")
        return
    jobs = launch_slurm(runs, spec, folder)
    print(f"sweep: submitted {len(jobs)} runs as array job {jobs[0].job_id.split('_')[0]} (logs in {folder})")
