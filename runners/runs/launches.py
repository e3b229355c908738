"""The launch log of an output directory (``launches.jsonl``): one line per sweep launch into it, so that
results aggregated from the folder can say how they were made."""
from __future__ import annotations

import logging
import shlex
import time
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

from pydantic import ValidationError

from common.files import FileError, MiB, parse_json, read_text
from common.typed import Model, first_problem

log = logging.getLogger(__name__)

LAUNCH_LOG = "launches.jsonl"  # one line per launch of a sweep into its output_dir (``log_launch``)


class Machine(Model):
    """Where a launch ran (``runners.runs.provenance.hardware``)."""

    platform: str
    cpus: int | None
    """``os.cpu_count()``: None where the system does not say."""
    cpu: str = "?"
    """The CPU model."""
    torch_threads: int | None = None
    gpus: list[str] = []


class Launch(Model):
    """One launch of a sweep into an output directory: a line of its launch log."""

    command: str
    """The command line, quoted as a shell would take it."""
    started: str
    """When, ISO 8601 to the second."""
    wall_s: float
    finished: bool
    """False: stopped before the end (Ctrl-C, a signal)."""
    workers: int
    ran: dict[str, int]
    """How many of the runs it made ended in each way (``ok``, ``diverged``, ...)."""
    hardware: Machine
    git_commit: str | None
    """The checkout's commit; None outside a git checkout."""
    trackers: dict[str, str] = {}
    """Where its runs were logged, per experiment tracker (``runners.runs.trackers.sweep_destinations``)."""


def log_launch(folder: Path, command: list[str], started: float, workers: int, ran: dict[str, int],
               finished: bool = True, runs: Sequence[Sequence[str]] = ()) -> None:
    """Append a ``Launch`` to ``<folder>/launches.jsonl``: its ``command``, when it started, its wall time, its
    workers, how many of the runs it ran ended in each way (``ran``), whether it finished or was stopped, the
    machine and the commit (a sweep finished over several launches has several lines); and, when the ``runs``
    it sent (their ``quest train`` arguments) log to experiment trackers, where."""
    from runners.runs.provenance import git_commit, hardware  # torch: only for a launch that ran
    from runners.runs.trackers import sweep_destinations

    text = shlex.join(command).encode("utf-8", "backslashreplace").decode()  # a name not UTF-8, escaped: JSON is UTF-8
    launch = Launch(command=text, started=datetime.fromtimestamp(started).isoformat(timespec="seconds"),
                    wall_s=round(time.time() - started, 1), finished=finished, workers=workers, ran=ran,
                    hardware=Machine(**hardware()), git_commit=git_commit(), trackers=sweep_destinations(runs))
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / LAUNCH_LOG, "a") as log_file:
        log_file.write(launch.model_dump_json() + "\n")


MAX_LOG_BYTES = 16 * MiB  # a line per launch: a few hundred bytes each
TRACKER_NAMES = {"mlflow": "MLflow", "wandb": "W&B"}


def read_launches(*roots: str | Path) -> list[Launch]:
    """The sweep launches logged in each of ``roots`` (``log_launch``), oldest first. The log is data
    (``common.files``): a line that is not a launch is skipped with a warning naming the file, the line and
    what is wrong; a log that cannot be read with one naming the file."""
    launches = []
    for root in roots:
        path = Path(root) / LAUNCH_LOG
        if not path.exists():
            continue
        try:
            lines = read_text(path, "launch log", MAX_LOG_BYTES).splitlines()
        except FileError as err:
            log.warning("skipping the launch log %s", err)
            continue
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                launch = parse_json(line, f"{path} line {number}")
            except FileError as err:
                log.warning("skipping a launch: %s", err)
                continue
            try:
                launches.append(Launch.model_validate(launch))
            except ValidationError as err:
                key, why, _ = first_problem(err)
                log.warning("skipping a launch: %s line %d: %s", path, number, f"{key} {why}" if key else why)
    return sorted(launches, key=lambda launch: launch.started)


def describe_launches(launches: Sequence[Launch]) -> list[str]:
    """How the runs were made: each launch's command, start, wall time, workers and outcome counts, the machine
    and commit, where its runs were tracked (if they were); and the wall time of all of them together."""
    if not launches:
        return []
    minutes = sum(launch.wall_s for launch in launches) / 60
    lines = [f"How these runs were made ({len(launches)} sweep launch{'es' if len(launches) > 1 else ''}, "
             f"{minutes:.{1 if minutes < 10 else 0}f} min of wall time in all):", ""]  # as precise as each launch's
    for launch in launches:
        machine = launch.hardware
        gpus = f", GPUs: {', '.join(machine.gpus)}" if machine.gpus else ""
        ran = ", ".join(f"{n} {status}" for status, n in launch.ran.items() if n) or "nothing (every run was recorded)"
        tracked = ", ".join(f"{TRACKER_NAMES.get(k, k)} {where}" for k, where in launch.trackers.items())
        lines.append(f"- `{launch.command}` started {launch.started}"
                     f"{'' if launch.finished else ' (stopped before the end)'}: {launch.wall_s / 60:.1f} min "
                     f"with {launch.workers} worker(s), ran {ran}; {machine.cpu} × {machine.cpus} "
                     f"CPUs, {machine.platform}{gpus}, commit {launch.git_commit or 'unknown'}"
                     + (f"; tracked in {tracked}" if tracked else ""))
    return [*lines, ""]
