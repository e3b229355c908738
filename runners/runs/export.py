"""A sweep's results in a form small enough to commit (``quest archive``): each run's ``record.json`` with its
probe trajectory thinned, and the folder's launch log and tuned-protocol choices, in the same layout, so that
``quest aggregate`` and ``quest select`` read the copy as they read the original. Checkpoints, logs and caches
stay behind."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from common.records import Trajectory, read_records
from runners.runs.launches import LAUNCH_LOG
from runners.runs.rundir import in_progress
from runners.runs.selection import SELECTION_FILE

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
    leaves them) and every launch log and selection file to ``target``; returns how many records and other files
    were copied, how many records were left out because their run is still in progress (its record may be
    unfinished), and how many because they could not be read."""
    records, damaged = read_records(source)
    busy = {path for path, _ in records if in_progress(path.parent)}
    records = [(path, record) for path, record in records if path not in busy]
    for path, record in records:
        out = target / path.relative_to(source)
        out.parent.mkdir(parents=True, exist_ok=True)
        if record.trajectory is not None:
            record.trajectory = thin(record.trajectory)
        out.write_text(json.dumps(record.to_json(), separators=(",", ":"), sort_keys=True) + "\n")  # write_record's order
    others = [p for name in (LAUNCH_LOG, SELECTION_FILE) for p in source.rglob(name) if p.is_file()]  # not a FIFO
    for path in others:
        (target / path.relative_to(source)).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target / path.relative_to(source))
    return len(records), len(others), len(busy), len(damaged)
