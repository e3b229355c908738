"""What a sweep knows of each of its runs, kept on disk so that every worker and every launch agrees: the
record's status, and the note in the run's lock file (``runners.runs.rundir``) of a run to redo or of an
outcome that leaves no record. See ``runners.commands.sweep`` for the rules."""
from __future__ import annotations

import json
import logging
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

from common.errors import ConfigError, error_line
from common.files import FileError, read_text
from common.records import RECORD_NAME, RecordError, read_record
from common.schema import RunConfig
from runners.config import compose, run_directory
from runners.runs.rundir import claimed, lock_path
from runners.sweeps.progress import Progress

log = logging.getLogger(__name__)


# --redo -> the recorded statuses a rerun of the sweep runs again
RERUN = {None: {"failed", "stopped", "unreadable"}}
RERUN |= {"diverged": RERUN[None] | {"diverged"}, "all": RERUN[None] | {"diverged", "ok"}}


REDO = '"redo"'  # the lock-file note of a run this launch runs again (see keep_or_drop)
MAX_NOTE_BYTES = 1 << 16  # a note is a status and the first line of an error


def recorded_status(run_dir: Path) -> str | None:
    """The status in the run's record, None without a record; a broken record is 'unreadable' (rerun)."""
    if not (run_dir / RECORD_NAME).exists():
        return None
    try:
        return read_record(run_dir).status
    except RecordError as err:
        log.warning("%s; the run is made again", err)
        return "unreadable"


def run_outcome(index: int, status: str, error: str | None = None, run_dir: Path | None = None,
             wall_s: float | None = None) -> dict:
    """What a run of the sweep (its position in the expansion) came to; ``wall_s`` is None unless this
    process ran it. This is the JSON line a worker reports."""
    return {"index": index, "status": status, "error": error, "run_dir": str(run_dir) if run_dir else None,
            "wall_s": wall_s}


@dataclass
class Pending:
    """A run of the sweep still to be made: its place in the sweep, its config and its run directory."""

    index: int
    cfg: RunConfig
    run_dir: Path


def plan(runs: list[list[str]], progress: Progress, status_of: Callable[[Path], str | None]) -> list[Pending]:
    """Compose every run once and tell ``progress`` about the invalid ones and those whose record stays
    (``status_of`` a run directory: its record's status if it stays, None if the run is to be made, e.g.
    ``keep_or_drop``, which notes the runs to make again before any starts); returns the runs to make."""
    pending = []
    for index, args in enumerate(runs):
        try:
            cfg = compose(args)
        except ConfigError as err:
            progress.add(run_outcome(index, "invalid", error_line(err)))
            continue
        run_dir = run_directory(cfg)
        status = status_of(run_dir)
        if status is None:
            pending.append(Pending(index, cfg, run_dir))
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


def settled(run_dir: Path) -> tuple[str, str | None] | None:
    """How the run was settled before, None if it is to be made: noted for a redo by this launch (see
    ``keep_or_drop``), else its record's status (a stopped run is made again: a SLURM task requeued after
    preemption finds its run so), else the note in its lock file of an outcome that leaves no record
    (invalid, or failed outside the runner), written by a worker of this launch."""
    try:
        note = read_text(lock_path(run_dir), "lock note", MAX_NOTE_BYTES)
    except FileError:  # spoilt past reading (not UTF-8, too long): no outcome, as a note that is not a pair
        note = ""
    if note == REDO:
        return None
    status = recorded_status(run_dir)
    if status == "stopped":
        return None
    if status is not None:  # with its error: a worker that finds a run just made may report it before its maker does
        return status, read_record(run_dir).error if status == "failed" else None
    if not note.startswith("["):  # empty, or an old "host pid" lock
        return None
    with suppress(ValueError):  # JSON's errors and a list of another length: a note spoilt by hand is no outcome
        status, error = json.loads(note)
        if isinstance(status, str) and isinstance(error, str | None):
            return status, error
    return None


def note_outcome(run_dir: Path, outcome: dict) -> None:
    """After a run (its lock held): clear its note when it has a record, else note the outcome, so that the
    sweep's other workers do not try it again. Written through a second descriptor: closing it keeps the
    flock, which belongs to the first."""
    recorded = (run_dir / RECORD_NAME).exists()
    lock_path(run_dir).write_text("" if recorded else json.dumps([outcome["status"], outcome["error"]]))
