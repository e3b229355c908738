"""Making a sweep's runs in worker processes (``run_all``) that the launching process starts and follows over
their pipes (``run_workers``). See ``runners.commands.sweep`` for the rules.

Local sweeps keep this loop rather than submitit's ``LocalExecutor`` (which ``slurm.py`` uses for clusters):
that executor starts a process per job at submission with no cap on how many run at once, pays the
Lightning import per run, hands results back as pickles read from its folder, and says nothing until a job
ends; here a fixed number of workers stream each outcome as JSON as it happens, and a worker killed
mid-run is replaced with its run recorded as failed."""
from __future__ import annotations

import json
import logging
import os
import select
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from contextlib import suppress
from pathlib import Path

from common.errors import ConfigError, DataError, Stopped, error_line
from common.records import RECORD_NAME
from common.schema import RunConfig
from runners.config import compose, run_directory
from runners.runs.rundir import claimed
from runners.sweeps.bookkeeping import note_outcome, run_outcome, settled
from runners.sweeps.progress import Progress

log = logging.getLogger(__name__)


def run_all(runs: list[list[str]], robustness: bool = False,
            report: Callable[[dict], None] | None = None, snapshots: Sequence[float] = ()) -> dict[str, int]:
    """Run each run that has no record and that no other process holds, and hand each outcome to
    ``report``; returns how many runs ended in each way. With ``robustness``, finished runs of domains
    with a ``robustness`` config section are then attacked (``quest robustness``) and the result lands
    in their record. With ``snapshots`` (fractions of training), each run keeps its weights there too and
    each finished run's snapshots are tested (``runners.runs.snapshot_tests``, attacked too with ``robustness``)."""
    counts = dict.fromkeys(("ok", "diverged", "failed", "invalid", "skipped", "busy"), 0)
    report = report or (lambda outcome: None)
    for index, args in enumerate(runs):
        try:
            outcome = _settle(index, args, robustness, report, snapshots)
        except Stopped as stop:
            if hasattr(stop, "outcome"):  # stopped while making a run (see _run)
                report(stop.outcome)
            raise
        recorded_before = outcome["wall_s"] is None and outcome["status"] not in ("invalid", "busy")
        counts["skipped" if recorded_before else outcome["status"]] += 1
        report(outcome)
    return counts


def _settle(index: int, args: list[str], robustness: bool, report: Callable[[dict], None],
            snapshots: Sequence[float] = ()) -> dict:
    try:
        cfg = compose([*args, "progress.style=none"])  # the sweep's own line is its progress
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
        outcome = _run(index, cfg, run_dir, robustness, snapshots)
        note_outcome(run_dir, outcome)
        return outcome


def _run(index: int, cfg: RunConfig, run_dir: Path, robustness: bool, snapshots: Sequence[float] = ()) -> dict:
    """Make a run whose lock this process holds, then attack it or test its snapshots as ``run_all`` says."""
    # imported here: Lightning is slow to import, and the launching process does without it
    from runners.runs.robust_accuracy import evaluate_run
    from runners.runs.snapshot_tests import evaluate_curve
    from runners.runs.training import run

    start = time.monotonic()
    try:
        record = run(cfg, lock=False, snapshots=snapshots)  # this process holds the lock
    except Stopped as stop:  # what became of the run, for the report on the way out
        stop.outcome = run_outcome(index, "stopped", stop.detail or str(stop), run_dir, time.monotonic() - start)
        raise
    except (ConfigError, DataError) as err:  # the user's input is wrong; no record to keep
        return run_outcome(index, "invalid", error_line(err), run_dir)
    except Exception as err:  # escaped the runner's record: still one failed run, not the end of the sweep
        log.error("%s: %s", run_dir, error_line(err), exc_info=True)
        return run_outcome(index, "failed", error_line(err), run_dir, time.monotonic() - start)
    if robustness and record.status == "ok" and "robustness" in cfg:
        evaluate_run(run_dir)
    if snapshots and record.status == "ok":
        evaluate_curve(run_dir, robustness)
    return run_outcome(index, record.status, record.error, run_dir, time.monotonic() - start)


def _spawn(cmd: list[str], env: dict, report_fd: int) -> subprocess.Popen:
    return subprocess.Popen(cmd, env=env, pass_fds=(report_fd,))


def run_workers(cmd: list[str], count: int, jobs: int, progress: Progress, threads: int | None = None) -> int:
    """Make ``jobs`` (runs, or chunks of them) in ``count`` worker processes, no more than there are jobs, each
    running ``cmd`` (a ``quest`` command line that takes ``--set`` and ``--report-fd``) with ``threads`` CPU threads
    (None: its share of the machine's cores), and feed ``progress`` what they report, then show its summary.
    Returns the worst exit status of the workers and the runs. A worker killed by a signal while making runs fails
    them (``_killed``) and is replaced; one killed between runs counts as status 1. Stopped here (SIGINT, SIGTERM),
    it passes SIGTERM on to the workers and follows them to their end, so that their stopped runs are heard of."""
    progress.workers = max(1, min(count, jobs))
    progress.show()
    threads = threads or max(1, (os.cpu_count() or 1) // progress.workers)
    cmd = [*cmd, "--set", f"threads={threads}"]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    workers: dict[int, subprocess.Popen] = {}  # the read end of each worker's pipe -> the worker

    def start() -> None:
        read, write = os.pipe()
        workers[read] = _spawn(cmd + ["--report-fd", str(write)], env, write)
        os.close(write)  # the worker holds the only write end: end of file on the pipe means it exited

    for _ in range(min(count, jobs)):
        start()
    partial, running = {}, {}  # each pipe's incomplete last line, and the runs its worker is making
    try:
        code = _follow(workers, partial, running, progress, start)
    except (Stopped, KeyboardInterrupt):
        for worker in workers.values():
            with suppress(ProcessLookupError):
                worker.send_signal(signal.SIGTERM)
        _follow(workers, partial, running, progress, start=None)
        raise
    progress.summary()
    return max(code, progress.code())


def report_to(fd: int, work: Callable[[Callable[[dict], None]], object]) -> int:
    """A worker's side of ``run_workers``: ``work(report)``, each outcome it reports sent down the pipe ``fd``
    as one JSON line, every word left to the launching process. Returns the worker's exit status."""
    with open(fd, "w", buffering=1) as pipe:
        try:
            work(lambda outcome: print(json.dumps(outcome), file=pipe))
        except Stopped as stop:  # reported down the pipe: the launcher says it once for all
            return stop.exit_code
    return 0


def _follow(workers: dict[int, subprocess.Popen], partial: dict[int, bytes], running: dict[int, dict[int, dict]],
            progress: Progress, start: Callable[[], None] | None) -> int:
    """Feed ``progress`` the JSON lines coming down the workers' pipes until every worker has exited, and
    return the worst exit status; ``start`` replaces a worker that a signal killed while making runs."""
    code = 0
    while workers:
        for fd in select.select(list(workers), [], [])[0]:
            chunk = os.read(fd, 1 << 16)
            if chunk:
                *lines, partial[fd] = (partial.get(fd, b"") + chunk).split(b"\n")
                for outcome in map(json.loads, lines):
                    if outcome["status"] == "running":
                        running.setdefault(fd, {})[outcome["index"]] = outcome
                    else:
                        running.get(fd, {}).pop(outcome["index"], None)
                        progress.update(outcome)
                continue
            os.close(fd)
            status, started = workers.pop(fd).wait(), running.pop(fd, {})
            if status < 0 and started and start is not None:
                for run in started.values():
                    progress.update(_killed(run, -status, progress.runs[run["index"]]))
                start()
            else:
                code = max(code, 1 if status < 0 else status)
    return code


def _killed(started: dict, signum: int, args: list[str]) -> dict:
    """The outcome of a run whose worker died of signal ``signum`` while making it: failed, and recorded so
    unless an earlier result is there to keep or another worker has taken the run up meanwhile."""
    from runners.runs.recording import record_killed  # Lightning is slow to import: only on this rare path

    error, run_dir = f"killed by signal {signum} ({signal.Signals(signum).name})", Path(started["run_dir"])
    outcome = run_outcome(started["index"], "failed", error, run_dir, 0.0)
    with claimed(run_dir) as mine:
        if mine:
            if not (run_dir / RECORD_NAME).exists():
                record_killed(compose(args), error)
            note_outcome(run_dir, outcome)
    return outcome
