"""`quest sweep <file>`: expand a grid of domains × variants × seeds (× any config values) and run it.

Resumable and safe to run twice at once: a run with a record is skipped; a run is claimed through an
exclusive lock file in its directory, and a lock whose process is gone (a sweep killed with SIGKILL)
is taken over, so running the same command again finishes the grid. ``--workers N`` starts N local
worker processes that share the grid through those locks, each with its share of CPU threads.
"""
from __future__ import annotations

import argparse
import itertools
import os
import socket
import subprocess
import sys
from pathlib import Path

from omegaconf import OmegaConf

from common.attention import VARIANTS
from common.data import DataError
from common.records import RECORD_NAME
from common.registry import domain_names
from runners.config import CONFIG_DIR, ConfigError, compose, run_directory

SWEEP_KEYS = {"domains", "variants", "seeds", "preset", "output_dir", "overrides", "domain_overrides", "grid", "slurm",
              "robustness"}
# sweep YAML `slurm:` keys -> submitit AutoExecutor parameters
SLURM_KEYS = {"partition": "slurm_partition", "time_min": "timeout_min", "gpus_per_task": "gpus_per_node",
              "cpus_per_task": "cpus_per_task", "mem_gb": "mem_gb", "array_parallelism": "slurm_array_parallelism",
              "nodes": "nodes", "tasks_per_node": "tasks_per_node"}


def load_sweep(path: str | Path) -> dict:
    path = Path(path)
    if not path.exists() and (CONFIG_DIR / "sweep" / f"{path}.yaml").exists():
        path = CONFIG_DIR / "sweep" / f"{path}.yaml"
    if not path.exists():
        raise FileNotFoundError(f"sweep file {path} does not exist")
    spec = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    unknown = set(spec) - SWEEP_KEYS
    if unknown:
        raise ConfigError(f"{path}: unknown sweep key(s) {', '.join(sorted(unknown))}; valid: {', '.join(sorted(SWEEP_KEYS))}")
    return spec


def expand(spec: dict, output_dir: str | None = None, extra: list[str] = ()) -> list[list[str]]:
    """Every run of the sweep as ``quest train`` arguments, seed by seed: a sweep stopped early has
    covered every domain and variant at the first seeds rather than a few domains at all seeds."""
    domains = spec.get("domains", "all")
    domains = domain_names() if domains == "all" else list(domains)
    variants = spec.get("variants", "all")
    variants = list(VARIANTS) if variants == "all" else list(variants)
    grid = spec.get("grid") or {}
    combos = [dict(zip(grid, values)) for values in itertools.product(*grid.values())] or [{}]
    out = output_dir or spec.get("output_dir", "runs")
    runs = []
    for seed, domain, combo, variant in itertools.product(spec.get("seeds", [0]), domains, combos, variants):
        args = [f"domain={domain}", f"attention={variant}", f"seed={seed}", f"output_dir={out}"]
        if "preset" in spec:
            args.append(f"preset={spec['preset']}")
        args += list(spec.get("overrides") or [])
        args += list((spec.get("domain_overrides") or {}).get(domain, []))
        args += [f"{k}={v}" for k, v in combo.items()] + list(extra)
        runs.append(args)
    return runs


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def claim(run_dir: Path) -> bool:
    """Take the run's lock, or a stale one left by a dead process on this host."""
    run_dir.mkdir(parents=True, exist_ok=True)
    lock = run_dir.parent / f".{run_dir.name}.lock"  # beside the run dir: the runner wipes that dir
    me = f"{socket.gethostname()} {os.getpid()}"
    try:
        fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        try:
            host, pid = lock.read_text().split()
        except (OSError, ValueError):
            return False  # being written by its owner right now
        if host != socket.gethostname() or _alive(int(pid)):
            return False
        lock.unlink(missing_ok=True)  # its owner is dead; whoever recreates it first wins
        return claim(run_dir)
    with os.fdopen(fd, "w") as f:
        f.write(me)
    return True


def release(run_dir: Path) -> None:
    (run_dir.parent / f".{run_dir.name}.lock").unlink(missing_ok=True)


def run_all(runs: list[list[str]], robustness: bool = False) -> dict[str, int]:
    """Run each not-yet-recorded run this process can claim; a failed run is recorded and skipped.
    With ``robustness``, finished runs of domains with a ``robustness`` config section are then
    attacked (``quest robustness``) and the result lands in their record."""
    from runners.robustness import evaluate_run
    from runners.train import run

    counts = {"ok": 0, "diverged": 0, "failed": 0, "skipped": 0, "busy": 0}
    for args in runs:
        try:
            cfg = compose(args)
        except ConfigError as err:
            print(f"sweep: invalid run {' '.join(args)}: {err}", file=sys.stderr)
            counts["failed"] += 1
            continue
        run_dir = run_directory(cfg)
        if (run_dir / RECORD_NAME).exists():
            counts["skipped"] += 1
            continue
        if not claim(run_dir):
            counts["busy"] += 1
            continue
        try:
            status = run(cfg)["status"]
            if robustness and status == "ok" and "robustness" in cfg:
                evaluate_run(run_dir)
        except DataError as err:
            print(f"sweep: {cfg.domain}/{cfg.attention.variant} seed {cfg.seed}: {err}", file=sys.stderr)
            status = "failed"
        finally:
            release(run_dir)
        counts[status] += 1
        print(f"sweep: {status:8s} {cfg.domain}/{cfg.attention.variant} seed {cfg.seed} -> {run_dir}", flush=True)
    return counts


class SweepJob:
    """One run of a sweep as a SLURM array task. On preemption or timeout submitit requeues it
    (``checkpoint``); the requeued task restarts the run, as a local sweep would."""

    def __init__(self, robustness: bool = False):
        self.robustness = robustness

    def __call__(self, args: list[str]) -> dict[str, int]:
        return run_all([args], self.robustness)

    def checkpoint(self, args: list[str]):
        import submitit

        return submitit.helpers.DelayedSubmission(self, args)


def launch_slurm(runs: list[list[str]], spec: dict, folder: str | Path, cluster: str | None = None):
    """Submit the sweep as one job array through submitit; ``cluster="debug"`` runs it in process."""
    import submitit

    settings = dict(spec.get("slurm") or {})
    extra = settings.pop("additional", {}) or {}
    unknown = set(settings) - set(SLURM_KEYS)
    if unknown:
        raise ConfigError(f"unknown slurm key(s) {', '.join(sorted(unknown))}; valid: additional, {', '.join(SLURM_KEYS)}")
    executor = submitit.AutoExecutor(folder=folder, cluster=cluster)
    executor.update_parameters(name="quest-sweep", **{SLURM_KEYS[k]: v for k, v in settings.items()},
                               **{f"slurm_{k}": v for k, v in extra.items()})
    return executor.map_array(SweepJob(bool(spec.get("robustness"))), runs)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="quest sweep", description=__doc__)
    parser.add_argument("sweep", help="a sweep YAML, or the name of one in configs/sweep/")
    parser.add_argument("--workers", type=int, default=1, help="local worker processes")
    parser.add_argument("--launcher", choices=("local", "slurm"), default="local",
                        help="slurm: one job array through submitit, settings from the sweep's `slurm:` section")
    parser.add_argument("--output-dir", help="override the sweep's output_dir")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="an override for every run")
    parser.add_argument("--dry-run", action="store_true", help="list the runs and exit")
    parser.add_argument("--aggregate", metavar="RESULTS_MD", help="aggregate the sweep's runs into this file at the end")
    args = parser.parse_args(argv)
    spec = load_sweep(args.sweep)
    runs = expand(spec, args.output_dir, args.set)
    if args.dry_run:
        print("\n".join(" ".join(r) for r in runs))
        return 0
    if args.launcher == "slurm":
        folder = Path(args.output_dir or spec.get("output_dir", "runs")) / "slurm"
        jobs = launch_slurm(runs, spec, folder)
        print(f"sweep: submitted {len(jobs)} runs as array job {jobs[0].job_id.split('_')[0]} (logs in {folder})")
        return 0
    if args.workers > 1:
        threads = max(1, (os.cpu_count() or 1) // args.workers)
        cmd = [sys.executable, "-m", "runners.cli", "sweep", args.sweep, "--set", f"threads={threads}"]
        cmd += (["--output-dir", args.output_dir] if args.output_dir else []) + [f"--set={s}" for s in args.set]
        env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
        workers = [subprocess.Popen(cmd, env=env) for _ in range(args.workers)]
        code = max(w.wait() for w in workers)
    else:
        counts = run_all(runs, bool(spec.get("robustness")))
        print("sweep: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
        code = 0
    if args.aggregate:
        from runners.aggregate import main as aggregate

        code = max(code, aggregate([args.output_dir or spec.get("output_dir", "runs"), "-o", args.aggregate]))
    return code
