"""The run record: one JSON file per run, written atomically, read back with validation."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

RECORD_NAME = "record.json"
SCHEMA_VERSION = 1
STATUSES = ("ok", "diverged", "failed")

# field -> accepted JSON types; None is accepted where listed.
SCHEMA: dict[str, tuple[type, ...]] = {
    "schema": (int,),
    "domain": (str,),
    "dataset": (str,),
    "variant": (str,),
    "seed": (int,),
    "preset": (str,),
    "status": (str,),
    "config": (dict,),
    "metrics": (dict,),           # test metrics, e.g. {"test/acc": 0.93}
    "primary_metric": (str,),     # e.g. "acc"
    "mode": (str,),               # "min" | "max"
    "best_val": (dict,),          # {"value": float | None, "epoch": int | None}
    "divergence": (dict, type(None)),  # {"step": int, "reason": str}
    "error": (str, type(None)),
    "probes": (dict,),            # final cross-layer probe summary
    "wall_time_s": (float, int),
    "params": (int,),
    "hardware": (dict,),
    "versions": (dict,),
    "git_commit": (str, type(None)),
}


class RecordError(ValueError):
    """A record file that is missing, not JSON, or does not follow the schema."""


def validate(record: dict[str, Any], where: str = "record") -> dict[str, Any]:
    missing = [k for k in SCHEMA if k not in record]
    if missing:
        raise RecordError(f"{where}: missing field(s) {', '.join(missing)}")
    for key, types in SCHEMA.items():
        if not isinstance(record[key], types) or isinstance(record[key], bool) and bool not in types:
            raise RecordError(f"{where}: field {key!r} has type {type(record[key]).__name__}")
    if record["status"] not in STATUSES:
        raise RecordError(f"{where}: status {record['status']!r} is not one of {', '.join(STATUSES)}")
    if record["schema"] != SCHEMA_VERSION:
        raise RecordError(f"{where}: schema version {record['schema']} (this reader knows {SCHEMA_VERSION})")
    return record


def write_record(run_dir: str | Path, record: dict[str, Any]) -> Path:
    """Validate and write ``<run_dir>/record.json`` via a temp file and rename: a reader never sees
    half a record, and a killed run leaves none."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    validate(record, str(run_dir / RECORD_NAME))
    fd, tmp = tempfile.mkstemp(dir=run_dir, prefix=".record.", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(record, f, indent=2, sort_keys=True, default=float)
    os.replace(tmp, run_dir / RECORD_NAME)
    return run_dir / RECORD_NAME


def read_record(path: str | Path) -> dict[str, Any]:
    """A record from its file or its run directory; malformed ones raise ``RecordError``."""
    path = Path(path)
    if path.is_dir():
        path = path / RECORD_NAME
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        raise RecordError(f"{path}: no such record") from None
    except json.JSONDecodeError as err:
        raise RecordError(f"{path}: not valid JSON ({err.msg} at line {err.lineno})") from None
    if not isinstance(record, dict):
        raise RecordError(f"{path}: not a JSON object")
    return validate(record, str(path))


def find_records(root: str | Path) -> list[Path]:
    return sorted(Path(root).rglob(RECORD_NAME))
