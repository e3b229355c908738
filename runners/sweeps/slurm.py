"""A sweep as one SLURM job array, through submitit."""
from __future__ import annotations

from pathlib import Path

from common.errors import ConfigError
from common.optional import require
from runners.sweeps.workers import run_all

# sweep YAML `slurm:` keys -> submitit AutoExecutor parameters
SLURM_KEYS = {"partition": "slurm_partition", "time_min": "timeout_min", "gpus_per_task": "gpus_per_node",
              "cpus_per_task": "cpus_per_task", "mem_gb": "mem_gb", "array_parallelism": "slurm_array_parallelism",
              "nodes": "nodes", "tasks_per_node": "tasks_per_node"}


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


def launch_slurm(runs: list[list[str]], spec: dict, folder: str | Path, cluster: str | None = None):
    """Submit the sweep as one job array through submitit; ``cluster="debug"`` runs it in process."""
    submitit = require("submitit", extra="slurm")

    settings = dict(spec.get("slurm") or {})
    extra = settings.pop("additional", {}) or {}
    unknown = set(settings) - set(SLURM_KEYS)
    if unknown:
        raise ConfigError(f"unknown slurm key(s) {', '.join(sorted(unknown))}; "
                          f"valid: additional, {', '.join(SLURM_KEYS)}")
    executor = submitit.AutoExecutor(folder=folder, cluster=cluster)
    executor.update_parameters(name="quest-sweep", **{SLURM_KEYS[k]: v for k, v in settings.items()},
                               **{f"slurm_{k}": v for k, v in extra.items()})
    return executor.map_array(SweepJob(bool(spec.get("robustness")), spec.get("snapshots") or []), runs)


def submit_slurm(runs: list[list[str]], spec: dict, folder: Path) -> None:
    if not runs:
        print("sweep: nothing to submit, every run is recorded or invalid")
        return
    jobs = launch_slurm(runs, spec, folder)
    print(f"sweep: submitted {len(jobs)} runs as array job {jobs[0].job_id.split('_')[0]} (logs in {folder})")
