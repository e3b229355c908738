"""A ``quest ensemble`` sweep's runs to make (``bookkeeping.plan``), cut into chunks and launched: each chunk's
runs are claimed under their locks and trained together by the ensemble trainer (``runners.runs.ensemble``),
which writes their run directories; this module turns its records into the sweep's outcomes."""
from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

from common.errors import ConfigError, DataError, error_line
from runners.runs.replayable import group_key
from runners.runs.rundir import claimed
from runners.sweeps.bookkeeping import Pending, note_outcome, run_outcome, settled


def chunks(pending: list[Pending], size: int) -> list[list[Pending]]:
    """The runs grouped by ``group_key`` (in sweep order), each group cut into the fewest chunks of at most
    ``size``, of equal sizes (give or take one), so that workers get even shares."""
    groups: dict[str, list[Pending]] = {}
    for run in pending:
        groups.setdefault(group_key(run.cfg), []).append(run)
    pieces = []
    for group in groups.values():
        parts = -(-len(group) // size)
        bounds = [len(group) * i // parts for i in range(parts + 1)]
        pieces += [group[a:b] for a, b in zip(bounds, bounds[1:])]
    return pieces


def run_chunks(pieces: list[list[Pending]], report: Callable[[dict], None]) -> None:
    """Train each chunk's runs that no other process holds and that are still to be made (``settled``, read
    under their locks), reporting each run as it starts and as it ends."""
    for piece in pieces:
        with ExitStack() as held:
            mine = [run for run in piece if held.enter_context(claimed(run.run_dir)) and settled(run.run_dir) is None]
            for run in mine:  # so the launcher knows them if this process dies
                report(run_outcome(run.index, "running", run_dir=run.run_dir))
            for outcome in train_chunk(mine) if mine else []:
                note_outcome(Path(outcome["run_dir"]), outcome)
                report(outcome)


def train_chunk(runs: list[Pending]) -> list[dict]:
    """Train the runs (of one group, each held under its lock) together; returns one sweep outcome per run,
    with the chunk's wall time shared out. Wrong input is an ``invalid`` outcome for the whole chunk."""
    from runners.runs.ensemble import train_ensemble  # Lightning: the launching process does without it

    start = time.perf_counter()
    try:
        records = train_ensemble([run.cfg for run in runs])
    except (ConfigError, DataError) as err:
        return [run_outcome(run.index, "invalid", error_line(err), run.run_dir) for run in runs]
    wall = (time.perf_counter() - start) / len(runs)
    return [run_outcome(run.index, record.status, record.error, run.run_dir, wall)
            for run, record in zip(runs, records)]
