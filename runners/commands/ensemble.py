"""`quest ensemble <sweep>`: the runs of a sweep file, trained many at a time (``runners.runs.ensemble``).

The runs of a sweep whose configs differ only in seed, learning rate and weight decay are trained together,
at most ``--members`` at once, by one vectorised step; each gets the run directory and record that ``quest
train`` gives it. Reruns, locks, workers and progress are ``quest sweep``'s: ok and diverged records are kept,
failed runs are rerun (``--redo`` as there), the launching process notes the runs to redo and then follows
``--workers`` worker processes that share the chunks through the run locks (every run of a chunk is held
under its lock while the chunk trains), with one progress line for the whole sweep. The record's
``wall_time_s`` is the chunk's wall time shared out over its runs.
"""
from __future__ import annotations

import sys

from common.arguments import CommandParser, positive_int
from runners.commands import add_sweep_arguments
from runners.sweeps.bookkeeping import RERUN, keep_or_drop, plan, recorded_status
from runners.sweeps.ensemble import chunks, run_chunks
from runners.sweeps.progress import Progress
from runners.sweeps.spec import expand, load_sweep
from runners.sweeps.workers import report_to, run_workers


def main(argv: list[str]) -> int:
    parser = CommandParser("quest ensemble", __doc__)
    add_sweep_arguments(parser, "processes sharing the chunks and the CPU threads")
    parser.add_argument("--members", type=positive_int, default=128, help="most runs trained together (default 128)")
    parser.add_argument("--dry-run", action="store_true", help="list the chunks and exit")
    args = parser.parse_args(argv)
    runs = expand(load_sweep(args.sweep), args.output_dir, args.set)
    progress = Progress(runs)
    if args.report_fd is not None:  # a worker: every run is a candidate, its lock and notes decide
        pieces = chunks(plan(runs, progress, lambda run_dir: None), args.members)
        return report_to(args.report_fd, lambda report: run_chunks(pieces, report))
    if args.dry_run:
        for piece in chunks(plan(runs, progress, recorded_status), args.members):
            cfg = piece[0].cfg
            print(f"{len(piece)} runs: {cfg.domain}/{cfg.attention.variant} ({cfg.preset}) "
                  f"seeds {sorted({m.cfg.seed for m in piece})}")
        return progress.code()
    pieces = chunks(plan(runs, progress, lambda run_dir: keep_or_drop(run_dir, RERUN[args.redo])), args.members)
    cmd = [sys.executable, "-m", "runners.cli", "ensemble", args.sweep, "--members", str(args.members),
           *(["--output-dir", args.output_dir] if args.output_dir else []), *(f"--set={s}" for s in args.set)]
    return run_workers(cmd, args.workers, len(pieces), progress, args.threads)
