"""`quest sweep <file>`: expand a grid of domains × variants × seeds (× any config values) and run it.

Outcomes and exit status. A run ends ok, diverged or failed, each with a record; a run whose config or
data is wrong (``ConfigError`` or ``DataError``, from composing it or from the runner) is invalid and
leaves no record. The exit status is 0 when every run is ok or diverged, 1 when a run failed (or a
worker died), 2 when a run was invalid; the output ends with the failed and invalid runs and why.

Reruns. Running the sweep again skips the runs whose record says ok or diverged and retries the failed,
stopped and unreadable ones; ``--redo diverged`` reruns the diverged ones too, ``--redo all`` every run.
The launching process decides this once, before any run starts, and notes each run to redo in its lock
file ("redo"), under the lock; the record stays until the rerun replaces it (``runners.runs.rundir``), so a
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

The tuned protocol. A sweep file with a ``select:`` section (``runners.sweeps.tuning``) runs in stages: its
selection runs (round by round, where a choice at a grid's edge extends the grid), then, once the choice is
written to ``selection.json``, the confirmation: the sweep's own runs and each tuned variant at its choice. A
launch goes on from wherever the last one stopped; on SLURM each launch submits the current stage and returns,
and the next launch, after the array has finished, submits the next.

Locking. A run is claimed with the lock of ``runners.runs.rundir`` (``quest train`` takes the same one), held
for the whole run; the record is read after the lock is taken, so a run that another process finished and
released in between is not run again. A filesystem that refuses locks is a one-line error (exit 2) rather
than a sweep run unlocked, where every worker would run every run.
"""
from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path

from common.arguments import CommandParser
from common.errors import ConfigError, Stopped
from runners.commands import add_sweep_arguments
from runners.config import compose
from runners.results.document import write_results
from runners.runs.launches import log_launch
from runners.sweeps.bookkeeping import RERUN, keep_or_drop, plan
from runners.sweeps.progress import Progress
from runners.sweeps.slurm import require_sbatch, submit_slurm
from runners.sweeps.spec import Sweep, expand, load_sweep
from runners.sweeps.tuning import confirmation, tuning
from runners.sweeps.workers import report_to, run_all, run_workers


def stage_runs(spec: Sweep, args: argparse.Namespace, stage: str | None = None) -> tuple[str, list[list[str]]]:
    """The stage to make (``stage``, else the one the records on disk say is next) and its runs."""
    tuned = tuning(spec, args.output_dir, args.set)
    if tuned is None:
        return "confirm", expand(spec, args.output_dir, args.set)
    selection = tuned.choose() if stage != "select" else None
    if stage == "select" or selection is None:
        return "select", tuned.selection_runs()
    return "confirm", confirmation(spec, selection, args.output_dir, args.set)


def launch(spec: Sweep, args: argparse.Namespace, argv: list[str], stage: str, runs: list[list[str]]) -> int:
    """Make one stage's runs here or submit them to SLURM; returns the exit status."""
    out = Path(args.output_dir or spec.output_dir)
    robust = spec.model_copy(update={"robustness": spec.robustness and stage == "confirm",  # selection is not attacked
                                     "snapshots": spec.snapshots if stage == "confirm" else []})  # nor kept along the way
    if len(runs) and stage == "select":
        print(f"sweep: selection stage, {len(runs)} runs in {out / 'select'}")
    progress = Progress(runs)
    pending = [runs[run.index] for run in plan(runs, progress, lambda run_dir: keep_or_drop(run_dir, RERUN[args.redo]))]
    if args.launcher == "slurm":
        submit_slurm(pending, robust, out / "slurm")
        progress.problems()
        return progress.code()
    cmd = [sys.executable, "-m", "runners.cli", "sweep", args.sweep, f"--stage={stage}",
           *(["--output-dir", args.output_dir] if args.output_dir else []), *(f"--set={s}" for s in args.set)]
    started, code = time.time(), None
    try:
        with Stopped.on_signals():  # `kill` stops a background launch as Ctrl-C does, logged
            code = run_workers(cmd, args.workers, len(pending), progress, args.threads)
    except (Stopped, KeyboardInterrupt) as stop:
        raise Stopped(getattr(stop, "signum", signal.SIGINT), f"{len(progress.stopped)} run(s) recorded as stopped, "
                      "the finished ones kept; launch the sweep again to finish it") from None
    finally:  # a launch stopped by Ctrl-C or SIGTERM (to its process group) is logged too, with what it finished
        log_launch(out / "select" if stage == "select" else out, ["quest", "sweep", *argv], started,
                   progress.workers, progress.ran(), finished=code is not None, runs=pending)
    return code


def dry_run_check(runs: list[list[str]]) -> int:
    """Each run's config composed as its worker would compose it: every distinct problem named on stderr, in one
    line each, and exit 2 where any run is invalid, so that a misspelt key is found before anything runs."""
    problems: dict[str, int] = {}
    for args in runs:
        try:
            compose(args)
        except ConfigError as err:
            problems[str(err)] = problems.get(str(err), 0) + 1
    for problem, count in problems.items():
        print(f"sweep: {count} of {len(runs)} runs invalid: {problem}", file=sys.stderr)
    return 2 if problems else 0


def main(argv: list[str]) -> int:
    parser = CommandParser("quest sweep", __doc__)
    add_sweep_arguments(parser, "local worker processes")
    parser.add_argument("--launcher", choices=("local", "slurm"), default="local",
                        help="slurm: one job array through submitit, settings from the sweep's `slurm:` section")
    parser.add_argument("--dry-run", action="store_true", help="list the runs and exit")
    parser.add_argument("--aggregate", metavar="RESULTS_MD",
                        help="aggregate the sweep's runs into this file at the end")
    parser.add_argument("--stage", choices=("select", "confirm"), help=argparse.SUPPRESS)  # the workers' stage
    args = parser.parse_args(argv)
    if args.launcher == "slurm" and not args.dry_run:
        require_sbatch()
    spec = load_sweep(args.sweep)
    if args.report_fd is not None:  # a worker of a launch
        _, runs = stage_runs(spec, args, args.stage)
        robustness = spec.robustness and args.stage != "select"
        snapshots = spec.snapshots if args.stage != "select" else []
        return report_to(args.report_fd, lambda report: run_all(runs, robustness, report, snapshots))
    stage, runs = stage_runs(spec, args)
    if args.dry_run:
        print("\n".join(" ".join(r) for r in runs))
        if stage == "select":
            print("(the selection stage; the confirmation runs follow once every choice is made)")
        return dry_run_check(runs)
    code, before = 0, None
    while True:
        code = max(code, launch(spec, args, argv, stage, runs))
        if stage == "confirm" or args.launcher == "slurm" or code == 2:
            break
        before, (stage, runs) = runs, stage_runs(spec, args)
        if stage == "select" and runs == before:  # a run the choice needs left no record (see the failures above)
            print("sweep: the selection is incomplete; the confirmation waits for it", file=sys.stderr)
            return max(code, 1)
    if args.aggregate:
        done = write_results([args.output_dir or spec.output_dir], Path(args.aggregate))[0]
        print(f"sweep: {done} runs aggregated -> {args.aggregate}")
    return code
