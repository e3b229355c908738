"""The launch log of an output directory (``launches.jsonl``): one line per sweep launch into it, so that
results aggregated from the folder can say how they were made."""
from __future__ import annotations

import json
import logging
import shlex
import time
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

from common.files import FileError, MiB, parse_json, read_text

log = logging.getLogger(__name__)

LAUNCH_LOG = "launches.jsonl"  # one line per launch of a sweep into its output_dir (``log_launch``)


def log_launch(folder: Path, command: list[str], started: float, workers: int, ran: dict[str, int],
               finished: bool = True, runs: Sequence[Sequence[str]] = ()) -> None:
    """Append a launch to ``<folder>/launches.jsonl``: its ``command``, when it started, its wall time, its
    workers, how many of the runs it ran ended in each way (``ran``), whether it finished or was stopped, the
    machine and the commit (a sweep finished over several launches has several lines); and, when the ``runs``
    it sent (their ``quest train`` arguments) log to experiment trackers, where (``trackers``)."""
    from runners.runs.provenance import git_commit, hardware  # torch: only for a launch that ran
    from runners.runs.trackers import sweep_destinations

    entry = {"command": shlex.join(command), "started": datetime.fromtimestamp(started).isoformat(timespec="seconds"),
             "wall_s": round(time.time() - started, 1), "finished": finished, "workers": workers, "ran": ran,
             "hardware": hardware(), "git_commit": git_commit()}
    trackers = sweep_destinations(runs)
    if trackers:
        entry["trackers"] = trackers
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / LAUNCH_LOG, "a") as log_file:
        log_file.write(json.dumps(entry) + "\n")


MAX_LOG_BYTES = 16 * MiB  # a line per launch: a few hundred bytes each
TRACKER_NAMES = {"mlflow": "MLflow", "wandb": "W&B"}
# What ``describe_launches`` takes from each line, and its kind.
LAUNCH_FIELDS = {"command": str, "started": str, "wall_s": (int, float), "finished": bool, "workers": int, "ran": dict,
                 "hardware": dict, "git_commit": (str, type(None))}


def read_launches(*roots: str | Path) -> list[dict]:
    """The sweep launches logged in each of ``roots`` (``log_launch``), oldest first. The log is data
    (``common.files``): a line that is not a launch is skipped with a warning naming the file and the line, a
    log that cannot be read with one naming the file."""
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
            problem = _problem(launch)
            if problem:
                log.warning("skipping a launch: %s line %d %s", path, number, problem)
            else:
                launches.append(launch)
    return sorted(launches, key=lambda launch: launch["started"])


def _problem(launch) -> str | None:
    """What keeps ``describe_launches`` from reading a logged line, or None."""
    if not isinstance(launch, dict):
        return "is not a JSON object"
    wrong = [key for key, kind in LAUNCH_FIELDS.items()
             if not isinstance(launch.get(key), kind) or isinstance(launch.get(key), bool) != (kind is bool)]
    machine, ran, trackers = launch.get("hardware"), launch.get("ran"), launch.get("trackers", {})
    if isinstance(machine, dict) and (not {"cpus", "platform"} <= set(machine) or not _strings(machine.get("gpus", []))):
        wrong.append("hardware")
    if isinstance(ran, dict) and not all(isinstance(n, int) for n in ran.values()):
        wrong.append("ran")
    if not isinstance(trackers, dict) or not _strings(list(trackers.values())):
        wrong.append("trackers")
    return f"lacks or mistypes {', '.join(wrong)}" if wrong else None


def _strings(values) -> bool:
    return isinstance(values, list) and all(isinstance(value, str) for value in values)


def describe_launches(launches: Sequence[dict]) -> list[str]:
    """How the runs were made: each launch's command, start, wall time, workers and outcome counts, the machine
    and commit, where its runs were tracked (if they were); and the wall time of all of them together."""
    if not launches:
        return []
    minutes = sum(launch["wall_s"] for launch in launches) / 60
    lines = [f"How these runs were made ({len(launches)} sweep launch{'es' if len(launches) > 1 else ''}, "
             f"{minutes:.0f} min of wall time in all):", ""]
    for launch in launches:
        machine = launch["hardware"]
        gpus = f", GPUs: {', '.join(machine['gpus'])}" if machine.get("gpus") else ""
        ran = ", ".join(f"{n} {status}" for status, n in launch["ran"].items() if n) or "nothing (every run was recorded)"
        tracked = ", ".join(f"{TRACKER_NAMES.get(k, k)} {where}" for k, where in launch.get("trackers", {}).items())
        lines.append(f"- `{launch['command']}` started {launch['started']}"
                     f"{'' if launch['finished'] else ' (stopped before the end)'}: {launch['wall_s'] / 60:.1f} min "
                     f"with {launch['workers']} worker(s), ran {ran}; {machine.get('cpu', '?')} × {machine['cpus']} "
                     f"CPUs, {machine['platform']}{gpus}, commit {launch['git_commit'] or 'unknown'}"
                     + (f"; tracked in {tracked}" if tracked else ""))
    return [*lines, ""]
