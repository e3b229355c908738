"""A sweep's results in a form small enough to commit (``quest archive``): each run's ``record.json`` with its
probe trajectory thinned, and the folder's launch log and tuned-protocol choices, in the same layout, so that
``quest aggregate`` and ``quest select`` read the copy as they read the original. Checkpoints, logs and caches
stay behind."""
from __future__ import annotations

import json
import logging
from pathlib import Path

from common.files import FileError, MiB, inside, read_bytes, write_atomic
from common.records import Trajectory, read_records
from runners.runs.launches import LAUNCH_LOG
from runners.runs.rundir import in_progress
from runners.runs.selection import SELECTION_FILE

log = logging.getLogger(__name__)
MAX_OTHER_BYTES = 16 * MiB  # a launch log or a selection file, as their readers take them
KEPT_PROBES = 17  # probe steps kept per run: the first (the initial sharpness), the last and those evenly between


def thin(trajectory: Trajectory, keep: int = KEPT_PROBES) -> Trajectory:
    """``trajectory`` (``common.callbacks.ProbeCallback``) at ``keep`` of its steps, the first and last included."""
    steps = trajectory.step
    if len(steps) <= keep:
        return trajectory
    picked = sorted({round(i * (len(steps) - 1) / (keep - 1)) for i in range(keep)})
    return Trajectory(step=[steps[i] for i in picked],
                      layers={name: {stat: [values[i] for i in picked] for stat, values in stats.items()}
                              for name, stats in trajectory.layers.items()})


def archive(source: Path, target: Path) -> tuple[int, int, int, int]:
    """Copy the records under ``source`` (damaged or malformed ones are left out with a warning, as aggregation
    leaves them) and every launch log and selection file to ``target``, each written whole; returns how many
    records and other files were copied, how many records were left out because their run is still in progress
    (its record may be unfinished), and how many because they could not be read or lie outside ``source``."""
    records, damaged = read_records(source)
    busy = {path for path, _ in records if in_progress(path.parent)}
    outside = [path for path, _ in records if not _confined(source, path, "record")]
    records = [(path, record) for path, record in records if path not in busy and path not in outside]
    for path, record in records:
        out = target / path.relative_to(source)
        out.parent.mkdir(parents=True, exist_ok=True)
        if record.trajectory is not None:
            record.trajectory = thin(record.trajectory)
        write_atomic(out, json.dumps(record.to_json(), separators=(",", ":"), sort_keys=True) + "\n")  # write_record's order
    others = [p for name, what in ((LAUNCH_LOG, "launch log"), (SELECTION_FILE, "selection file"))
              for p in source.rglob(name) if p.is_file() and _confined(source, p, what)]  # not a FIFO
    for path in others:
        (target / path.relative_to(source)).parent.mkdir(parents=True, exist_ok=True)
        write_atomic(target / path.relative_to(source), read_bytes(path, "file to archive", MAX_OTHER_BYTES))
    return len(records), len(others), len(busy), len(damaged) + len(outside)


def _confined(source: Path, path: Path, what: str) -> bool:
    """Whether ``path``, found under ``source``, is a file of it and not a link out of it (``inside``); one
    that is not is named in a warning and left out of the archive, which is meant to be committed."""
    try:
        inside(source, str(path.relative_to(source)), what)
    except FileError as err:
        log.warning("leaving out %s", err)
        return False
    return True
