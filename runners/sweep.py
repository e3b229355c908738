"""`quest sweep <file>`: expand a grid of domains × variants × seeds (× any config values) and run it.

Outcomes and exit status. A run ends ok, diverged or failed, each with a record; a run whose config or
data is wrong (``ConfigError`` or ``DataError``, from composing it or from the runner) is invalid and
leaves no record. The exit status is 0 when every run is ok or diverged, 1 when a run failed (or a
worker died), 2 when a run was invalid; the output ends with the failed and invalid runs and why.

Reruns. Running the sweep again skips the runs whose record says ok or diverged and retries the failed,
stopped and unreadable ones; ``--redo diverged`` reruns the diverged ones too, ``--redo all`` every run.
The launching process decides this once, before any run starts, and notes each run to redo in its lock
file ("redo"), under the lock; the record stays until the rerun replaces it (``runners.rundir``), so a
stopped or killed rerun loses nothing. A worker runs a run only when it has no record, a stopped one, or
is noted for a redo, and clears the note when it has run it, so a run one worker has just redone is not
redone again by the next; an outcome that leaves no record (invalid, or an error that escaped the runner)
is noted in the lock file instead for the rest of the sweep, and the next launch, which resets the notes,
tries it again.

Workers and progress. The runs are made in worker processes (``quest sweep`` again, ``--workers N`` of
them, each with its share of CPU threads) that share the grid through the run locks, so that a run that
crashes the interpreter (a native library's segfault) takes down only its worker: its run is recorded
as failed, killed by that signal, and a new worker takes the dead one's place. Each worker reports over a
pipe to the launching process, one JSON line per run when it starts one and when it settles it; a pipe
rather than polling the records, because an invalid run leaves no record to poll. The launching process
alone prints: the failure line of each failed or invalid run (stderr), one progress line for the whole
sweep whenever the counts change (``12/56 done · 0 diverged · 1 failed · eta 4 min``, the eta being the
mean time of the runs finished so far × the runs left / workers), and a final summary. Stopped by SIGINT
or SIGTERM, it passes SIGTERM on to its workers, which record their runs as stopped, logs the launch and
exits 130 or 143. ``--launcher slurm`` submits the runs left to do as one job array (``SweepJob``) and
returns.

Locking. A run is claimed with the lock of ``runners.rundir`` (``quest train`` takes the same one), held
for the whole run; the record is read after the lock is taken, so a run that another process finished and
released in between is not run again. A filesystem that refuses locks is a one-line error (exit 2) rather
than a sweep run unlocked, where every worker would run every run.
"""
from __future__ import annotations

import argparse
import itertools
import json
import logging
import math
import os
import select
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import suppress
from datetime import datetime
from pathlib import Path
from statistics import fmean

from omegaconf import DictConfig, OmegaConf

from common.attention import VARIANTS
from common.errors import ConfigError, DataError, Stopped, error_line
from common.records import RECORD_NAME, RecordError, read_record
from common.registry import domain_names
from runners.config import CONFIG_DIR, compose, refuse_interpolation, run_directory
from runners.rundir import claimed, lock_path

log = logging.getLogger(__name__)

SWEEP_KEYS = {"domains", "variants", "ablations", "seeds", "preset", "output_dir", "overrides", "domain_overrides", "grid",
              "slurm", "robustness"}
# sweep YAML `slurm:` keys -> submitit AutoExecutor parameters
SLURM_KEYS = {"partition": "slurm_partition", "time_min": "timeout_min", "gpus_per_task": "gpus_per_node",
              "cpus_per_task": "cpus_per_task", "mem_gb": "mem_gb", "array_parallelism": "slurm_array_parallelism",
              "nodes": "nodes", "tasks_per_node": "tasks_per_node"}
# --redo -> the recorded statuses a rerun of the sweep runs again
RERUN = {None: {"failed", "stopped", "unreadable"}}
RERUN |= {"diverged": RERUN[None] | {"diverged"}, "all": RERUN[None] | {"diverged", "ok"}}
REDO = '"redo"'  # the lock-file note of a run this launch runs again (see keep_or_drop)
PROBLEMS = ("failed", "invalid")
LAUNCH_LOG = "launches.jsonl"  # one line per launch of a sweep into its output_dir (``log_launch``)


def load_sweep(path: str | Path) -> dict:
    """The sweep file at ``path`` (or named in ``configs/sweep/``), checked key by key: anything it cannot
    mean is a one-line ``ConfigError`` naming the file and the key. Its values are data (no ``${...}``)."""
    path = Path(path)
    if not path.exists() and (CONFIG_DIR / "sweep" / f"{path}.yaml").exists():
        path = CONFIG_DIR / "sweep" / f"{path}.yaml"
    if not path.is_file():
        raise ConfigError(f"sweep file {path} does not exist")
    try:
        loaded = OmegaConf.load(path)
    except Exception as err:
        raise ConfigError(f"{path}: not valid YAML ({str(err).splitlines()[0]})") from None
    if not isinstance(loaded, DictConfig) or not loaded:
        raise ConfigError(f"{path}: a sweep file is a mapping of sweep keys ({', '.join(sorted(SWEEP_KEYS))}); "
                          f"this one is {'empty' if not loaded else 'a list'}")
    spec = OmegaConf.to_container(loaded, resolve=False)
    for key, value in spec.items():
        refuse_interpolation(value, f"{path}: {key}")
    unknown = set(spec) - SWEEP_KEYS
    if unknown:
        raise ConfigError(f"{path}: unknown sweep key(s) {', '.join(sorted(unknown))}; "
                          f"valid: {', '.join(sorted(SWEEP_KEYS))}")
    for key, value in spec.items():
        problem = SWEEP_CHECKS[key](value)
        if problem:
            raise ConfigError(f"{path}: {key}: {problem}, got {value!r}")
    return spec


def _names(value) -> str | None:
    if value == "all":
        return None
    return _strings(value)


def _strings(value) -> str | None:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        return "must be a non-empty list of names" + (" or all" if value != "all" else "")
    return None


def _overrides(value) -> str | None:
    if not isinstance(value, list) or not all(isinstance(v, str) and "=" in v for v in value):
        return "must be a list of key=value strings"
    return None


SWEEP_CHECKS: dict[str, Callable] = {  # each key's check: what is wrong with its value, or None
    "domains": _names,
    "variants": _names,
    "ablations": lambda v: None if v is None else _strings(v),
    "seeds": lambda v: None if isinstance(v, list) and v and all(isinstance(s, int) and not isinstance(s, bool) and s >= 0
                                                                  for s in v) else "must be a non-empty list of seeds >= 0",
    "preset": lambda v: None if isinstance(v, str) and v else "must be a preset name",
    "output_dir": lambda v: None if isinstance(v, str) and v else "must be a folder",
    "overrides": lambda v: None if v is None else _overrides(v),
    "domain_overrides": lambda v: None if v is None or (isinstance(v, dict) and not any(map(_overrides, v.values())))
    else "must map domain names to lists of key=value strings",
    "grid": lambda v: None if v is None or (isinstance(v, dict) and all(isinstance(x, list) and x for x in v.values()))
    else "must map config keys to non-empty lists of values",
    "slurm": lambda v: None if v is None or isinstance(v, dict) else "must be a mapping of slurm settings",
    "robustness": lambda v: None if isinstance(v, bool) else "must be true or false",
}


def expand(spec: dict, output_dir: str | None = None, extra: list[str] = ()) -> list[list[str]]:
    """Every run of the sweep as ``quest train`` arguments, seed by seed: a sweep stopped early has
    covered every domain and variant at the first seeds rather than a few domains at all seeds."""
    domains = spec.get("domains", "all")
    domains = domain_names() if domains == "all" else list(domains)
    variants = spec.get("variants", "all")
    variants = (list(VARIANTS) if variants == "all" else list(variants)) + list(spec.get("ablations") or [])
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


def recorded_status(run_dir: Path) -> str | None:
    """The status in the run's record, None without a record; a broken record is 'unreadable' (rerun)."""
    if not (run_dir / RECORD_NAME).exists():
        return None
    try:
        return read_record(run_dir)["status"]
    except RecordError as err:
        log.warning("%s; the run is made again", err)
        return "unreadable"


def run_outcome(index: int, status: str, error: str | None = None, run_dir: Path | None = None,
             wall_s: float | None = None) -> dict:
    """What a run of the sweep (its position in the expansion) came to; ``wall_s`` is None unless this
    process ran it. This is the JSON line a worker reports."""
    return {"index": index, "status": status, "error": error, "run_dir": str(run_dir) if run_dir else None,
            "wall_s": wall_s}


def prepare(runs: list[list[str]], redo: str | None, progress: Progress) -> list[list[str]]:
    """Before any run starts: tell ``progress`` about the invalid runs and the records the sweep keeps,
    and note the runs it makes again (``RERUN``), each under its run's lock. Returns the runs to do."""
    pending = []
    for index, args in enumerate(runs):
        try:
            run_dir = run_directory(compose(args))
        except ConfigError as err:
            progress.add(run_outcome(index, "invalid", error_line(err)))
            continue
        status = keep_or_drop(run_dir, RERUN[redo])
        if status is None:
            pending.append(args)
        else:
            progress.add(run_outcome(index, status, run_dir=run_dir))
    return pending


def keep_or_drop(run_dir: Path, rerun: set[str]) -> str | None:
    """The status of the run's record if it stays; None if there is none, if the run is to be made again
    (noted in its lock file, which forgets the notes of earlier launches: see ``settled``), or if another
    process holds the run."""
    with claimed(run_dir) as mine:
        if not mine:
            return None
        status = recorded_status(run_dir)
        redo = status in rerun
        lock_path(run_dir).write_text(REDO if redo else "")
        return None if redo else status


def run_all(runs: list[list[str]], robustness: bool = False,
            report: Callable[[dict], None] | None = None) -> dict[str, int]:
    """Run each run that has no record and that no other process holds, and hand each outcome to
    ``report``; returns how many runs ended in each way. With ``robustness``, finished runs of domains
    with a ``robustness`` config section are then attacked (``quest robustness``) and the result lands
    in their record."""
    counts = dict.fromkeys(("ok", "diverged", "failed", "invalid", "skipped", "busy"), 0)
    report = report or (lambda outcome: None)
    for index, args in enumerate(runs):
        try:
            outcome = _settle(index, args, robustness, report)
        except Stopped as stop:
            if hasattr(stop, "outcome"):  # stopped while making a run (see _run)
                report(stop.outcome)
            raise
        recorded_before = outcome["wall_s"] is None and outcome["status"] not in ("invalid", "busy")
        counts["skipped" if recorded_before else outcome["status"]] += 1
        report(outcome)
    return counts


def _settle(index: int, args: list[str], robustness: bool, report: Callable[[dict], None]) -> dict:
    try:
        cfg = compose(args)
    except ConfigError as err:
        return run_outcome(index, "invalid", error_line(err))
    run_dir = run_directory(cfg)
    with claimed(run_dir) as mine:
        if not mine:
            return run_outcome(index, "busy", run_dir=run_dir)
        before = settled(run_dir)  # read under the lock: another process may have just finished it
        if before:
            return run_outcome(index, *before, run_dir)
        report(run_outcome(index, "running", run_dir=run_dir))  # so the launcher knows it if this process dies
        outcome = _run(index, cfg, run_dir, robustness)
        note_outcome(run_dir, outcome)
        return outcome


def settled(run_dir: Path) -> tuple[str, str | None] | None:
    """How the run was settled before, None if it is to be made: noted for a redo by this launch (see
    ``keep_or_drop``), else its record's status (a stopped run is made again: a SLURM task requeued after
    preemption finds its run so), else the note in its lock file of an outcome that leaves no record
    (invalid, or failed outside the runner), written by a worker of this launch."""
    note = lock_path(run_dir).read_text()
    if note == REDO:
        return None
    status = recorded_status(run_dir)
    if status == "stopped":
        return None
    if status is not None:
        return status, None
    return tuple(json.loads(note)) if note.startswith("[") else None  # else empty, or an old "host pid" lock


def note_outcome(run_dir: Path, outcome: dict) -> None:
    """After a run (its lock held): clear its note when it has a record, else note the outcome, so that the
    sweep's other workers do not try it again. Written through a second descriptor: closing it keeps the
    flock, which belongs to the first."""
    recorded = (run_dir / RECORD_NAME).exists()
    lock_path(run_dir).write_text("" if recorded else json.dumps([outcome["status"], outcome["error"]]))


def _run(index: int, cfg: DictConfig, run_dir: Path, robustness: bool) -> dict:
    """Run a run whose lock this process holds (and, with ``robustness``, attack it if it is a classifier)."""
    from runners.robustness import evaluate_run  # imported here: Lightning is slow to import and --dry-run
    from runners.train import run  # and the parent of workers do without it

    start = time.monotonic()
    try:
        record = run(cfg, lock=False)  # this process holds the lock
    except Stopped as stop:  # what became of the run, for the report on the way out
        stop.outcome = run_outcome(index, "stopped", stop.detail or str(stop), run_dir, time.monotonic() - start)
        raise
    except (ConfigError, DataError) as err:  # the user's input is wrong; no record to keep
        return run_outcome(index, "invalid", error_line(err), run_dir)
    except Exception as err:  # escaped the runner's record: still one failed run, not the end of the sweep
        log.error("%s: %s", run_dir, error_line(err), exc_info=True)
        return run_outcome(index, "failed", error_line(err), run_dir, time.monotonic() - start)
    if robustness and record["status"] == "ok" and "robustness" in cfg:
        evaluate_run(run_dir)
    return run_outcome(index, record["status"], record["error"], run_dir, time.monotonic() - start)


class Progress:
    """The one progress line of a sweep, fed the outcomes of its runs from this process or its workers."""

    def __init__(self, runs: list[list[str]], workers: int = 1):
        self.runs, self.workers = runs, workers
        self.outcomes: dict[int, dict] = {}
        self.stopped: set[int] = set()  # runs stopped by a signal: not done, made again by the next launch
        self.shown: int | None = None

    def add(self, outcome: dict) -> None:
        """Note a run's outcome; the first word on a run stands (workers that find it held by another process
        or already recorded add nothing, nor does a run's start). A failed or invalid run is reported at once."""
        if outcome["status"] == "stopped":
            self.stopped.add(outcome["index"])
        if outcome["status"] in ("busy", "running", "stopped") or outcome["index"] in self.outcomes:
            return
        self.outcomes[outcome["index"]] = outcome
        if outcome["status"] in PROBLEMS:
            print(f"sweep: {self.describe(outcome)}", file=sys.stderr, flush=True)

    def update(self, outcome: dict) -> None:
        self.add(outcome)
        self.show()

    def count(self, status: str) -> int:
        return sum(o["status"] == status for o in self.outcomes.values())

    def line(self) -> str:
        done, total = len(self.outcomes), len(self.runs)
        walls = [o["wall_s"] for o in self.outcomes.values() if o["wall_s"] is not None]
        eta = f"{math.ceil(fmean(walls) * (total - done) / self.workers / 60)} min" if walls else "–"
        counts = [f"{done}/{total} done", f"{self.count('diverged')} diverged", f"{self.count('failed')} failed"]
        counts += [f"{self.count('invalid')} invalid"] if self.count("invalid") else []
        return " · ".join(counts + [f"eta {eta}"])

    def show(self) -> None:
        """Print the progress line if a run has been settled since the last one (outcomes only grow)."""
        if len(self.outcomes) != self.shown:
            self.shown = len(self.outcomes)
            print(f"sweep: {self.line()}", flush=True)

    def describe(self, outcome: dict) -> str:
        given = dict(arg.partition("=")[::2] for arg in self.runs[outcome["index"]])  # the last one wins, as in compose
        run = f"{given['domain']}/{given['attention']} seed {given['seed']}"
        where = f" -> {outcome['run_dir']}" if outcome["status"] == "failed" else ""
        return f"{outcome['status']} {run}: {outcome['error']}{where}"

    def problems(self) -> None:
        """List the failed and invalid runs, with why, on stderr."""
        problems = [o for _, o in sorted(self.outcomes.items()) if o["status"] in PROBLEMS]
        if problems:
            print(f"sweep: {len(problems)} run(s) failed or invalid:", file=sys.stderr)
            print("\n".join(f"  {self.describe(o)}" for o in problems), file=sys.stderr, flush=True)

    def summary(self) -> None:
        print(f"sweep: finished, {len(self.outcomes)}/{len(self.runs)} done: "
              + " · ".join(f"{self.count(s)} {s}" for s in ("ok", "diverged", *PROBLEMS)), flush=True)
        self.problems()

    def code(self) -> int:
        return 2 if self.count("invalid") else 1 if self.count("failed") else 0


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
        raise ConfigError(f"unknown slurm key(s) {', '.join(sorted(unknown))}; "
                          f"valid: additional, {', '.join(SLURM_KEYS)}")
    executor = submitit.AutoExecutor(folder=folder, cluster=cluster)
    executor.update_parameters(name="quest-sweep", **{SLURM_KEYS[k]: v for k, v in settings.items()},
                               **{f"slurm_{k}": v for k, v in extra.items()})
    return executor.map_array(SweepJob(bool(spec.get("robustness"))), runs)


def _spawn(cmd: list[str], env: dict, report_fd: int) -> subprocess.Popen:
    return subprocess.Popen(cmd, env=env, pass_fds=(report_fd,))


def run_workers(args: argparse.Namespace, count: int, progress: Progress) -> int:
    """Run the sweep in ``count`` worker processes, feeding ``progress`` with what they report until all
    have exited; returns the worst exit status among them. A worker killed by a signal while making a run
    fails that run (``_killed``) and is replaced; one killed between runs is not, and counts as status 1.
    Stopped here (SIGINT, SIGTERM), it passes SIGTERM on to the workers and follows them to their end, so
    that what they report of their stopped runs is heard."""
    threads = max(1, (os.cpu_count() or 1) // count)
    cmd = [sys.executable, "-m", "runners.cli", "sweep", args.sweep, "--set", f"threads={threads}"]
    cmd += (["--output-dir", args.output_dir] if args.output_dir else []) + [f"--set={s}" for s in args.set]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    workers: dict[int, subprocess.Popen] = {}  # the read end of each worker's pipe -> the worker

    def start() -> None:
        read, write = os.pipe()
        workers[read] = _spawn(cmd + ["--report-fd", str(write)], env, write)
        os.close(write)  # the worker holds the only write end: end of file on the pipe means it exited

    for _ in range(count):
        start()
    partial, running = {}, {}  # each pipe's incomplete last line, and the run its worker is making
    try:
        return _follow(workers, partial, running, progress, start)
    except (Stopped, KeyboardInterrupt):
        for worker in workers.values():
            with suppress(ProcessLookupError):
                worker.send_signal(signal.SIGTERM)
        _follow(workers, partial, running, progress, start=None)
        raise


def _follow(workers: dict[int, subprocess.Popen], partial: dict[int, bytes], running: dict[int, dict],
            progress: Progress, start: Callable[[], None] | None) -> int:
    """Feed ``progress`` the JSON lines coming down the workers' pipes until every worker has exited, and
    return the worst exit status; ``start`` replaces a worker that a signal killed while making a run."""
    code = 0
    while workers:
        for fd in select.select(list(workers), [], [])[0]:
            chunk = os.read(fd, 1 << 16)
            if chunk:
                *lines, partial[fd] = (partial.get(fd, b"") + chunk).split(b"\n")
                for outcome in map(json.loads, lines):
                    if outcome["status"] == "running":
                        running[fd] = outcome
                    else:
                        running.pop(fd, None)
                        progress.update(outcome)
                continue
            os.close(fd)
            status, started = workers.pop(fd).wait(), running.pop(fd, None)
            if status < 0 and started is not None and start is not None:
                progress.update(_killed(started, -status, progress.runs[started["index"]]))
                start()
            else:
                code = max(code, 1 if status < 0 else status)
    return code


def _killed(started: dict, signum: int, args: list[str]) -> dict:
    """The outcome of a run whose worker died of signal ``signum`` while making it: failed, and recorded so
    unless an earlier result is there to keep or another worker has taken the run up meanwhile."""
    from runners.train import record_killed  # Lightning is slow to import: only on this rare path

    error, run_dir = f"killed by signal {signum} ({signal.Signals(signum).name})", Path(started["run_dir"])
    outcome = run_outcome(started["index"], "failed", error, run_dir, 0.0)
    with claimed(run_dir) as mine:
        if mine:
            if not (run_dir / RECORD_NAME).exists():
                record_killed(compose(args), error)
            note_outcome(run_dir, outcome)
    return outcome


def positive_int(text: str) -> int:
    """An argparse type: a count of at least 1."""
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, got {text!r}")
    return int(text)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="quest sweep", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sweep", help="a sweep YAML, or the name of one in configs/sweep/")
    parser.add_argument("--workers", type=positive_int, default=1, help="local worker processes")
    parser.add_argument("--launcher", choices=("local", "slurm"), default="local",
                        help="slurm: one job array through submitit, settings from the sweep's `slurm:` section")
    parser.add_argument("--output-dir", help="override the sweep's output_dir")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="an override for every run")
    parser.add_argument("--redo", choices=("diverged", "all"),
                        help="also rerun the diverged runs, or every run (failed runs are always rerun)")
    parser.add_argument("--dry-run", action="store_true", help="list the runs and exit")
    parser.add_argument("--aggregate", metavar="RESULTS_MD",
                        help="aggregate the sweep's runs into this file at the end")
    parser.add_argument("--report-fd", type=int, help=argparse.SUPPRESS)  # set for the workers of a sweep
    return parser


def submit_slurm(runs: list[list[str]], spec: dict, folder: Path) -> None:
    if not runs:
        print("sweep: nothing to submit, every run is recorded or invalid")
        return
    jobs = launch_slurm(runs, spec, folder)
    print(f"sweep: submitted {len(jobs)} runs as array job {jobs[0].job_id.split('_')[0]} (logs in {folder})")


def run_local(args: argparse.Namespace, pending: int, progress: Progress) -> int:
    """Make the runs left in ``--workers`` processes (no more than there are runs); prints the progress and
    the summary. Returns the exit status."""
    progress.workers = max(1, min(args.workers, pending))
    progress.show()
    code = run_workers(args, progress.workers, progress) if pending else 0
    progress.summary()
    return max(code, progress.code())


def log_launch(folder: Path, argv: list[str], started: float, progress: Progress, finished: bool = True) -> None:
    """Append this launch to ``<output_dir>/launches.jsonl``: the command, when it started, its wall time, its
    workers, what became of the runs it ran, whether it finished or was stopped, the machine and the commit,
    so that results aggregated from the folder can say how they were made (a sweep finished over several
    launches has several lines)."""
    from runners.train import git_commit, hardware  # Lightning is slow to import: not for --dry-run

    # this launch's outcomes: not those recorded before it (no wall time), but its invalid runs (none either)
    ran = [o for o in progress.outcomes.values() if o["wall_s"] is not None or o["status"] == "invalid"]
    entry = {"command": shlex.join(["quest", "sweep", *argv]),
             "started": datetime.fromtimestamp(started).isoformat(timespec="seconds"),
             "wall_s": round(time.time() - started, 1), "finished": finished, "workers": progress.workers,
             "ran": {**{status: sum(o["status"] == status for o in ran) for status in ("ok", "diverged", *PROBLEMS)},
                     "stopped": len(progress.stopped)},
             "hardware": hardware(), "git_commit": git_commit()}
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / LAUNCH_LOG, "a") as log_file:
        log_file.write(json.dumps(entry) + "\n")


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    spec = load_sweep(args.sweep)
    runs = expand(spec, args.output_dir, args.set)
    robustness = bool(spec.get("robustness"))
    if args.report_fd is not None:  # a worker: run, and leave every word to the launching process
        with open(args.report_fd, "w", buffering=1) as pipe:
            try:
                run_all(runs, robustness, report=lambda outcome: print(json.dumps(outcome), file=pipe))
            except Stopped as stop:  # reported down the pipe: the launcher says it once for all
                return stop.exit_code
        return 0
    if args.dry_run:
        print("\n".join(" ".join(r) for r in runs))
        return 0
    progress = Progress(runs)
    pending = prepare(runs, args.redo, progress)
    if args.launcher == "slurm":
        submit_slurm(pending, spec, Path(args.output_dir or spec.get("output_dir", "runs")) / "slurm")
        progress.problems()
        return progress.code()
    started, code = time.time(), None
    try:
        with Stopped.on_signals():  # `kill` stops a background launch as Ctrl-C does, logged
            code = run_local(args, len(pending), progress)
    except (Stopped, KeyboardInterrupt) as stop:
        stopped = Stopped(getattr(stop, "signum", signal.SIGINT), f"{len(progress.stopped)} run(s) recorded as "
                          "stopped, the finished ones kept; launch the sweep again to finish it")
        raise stopped from None
    finally:  # a launch stopped by Ctrl-C or SIGTERM (to its process group) is logged too, with what it finished
        log_launch(Path(args.output_dir or spec.get("output_dir", "runs")), argv, started, progress,
                   finished=code is not None)
    if args.aggregate:
        from runners.aggregate import main as aggregate

        code = max(code, aggregate([args.output_dir or spec.get("output_dir", "runs"), "-o", args.aggregate]))
    return code
