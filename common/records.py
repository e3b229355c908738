"""The run record: one JSON file per run, written atomically, read back with validation.

Validation checks every field's type and that each value of ``metrics``, ``probes`` and (when
``quest robustness`` has added it) ``robustness`` is a real number: an int or float, never a bool or a
numeric string such as ``"0.5"``. NaN and ±inf are numbers here: a diverged metric may be NaN.
"""
from __future__ import annotations

import json
import numbers
import os
import tempfile
from pathlib import Path
from typing import Any

RECORD_NAME = "record.json"
SCHEMA_VERSION = 1
STATUSES = ("ok", "diverged", "failed", "stopped")  # stopped: by SIGINT or SIGTERM, not a result

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
# Fields that only some records have; checked like SCHEMA when present.
OPTIONAL: dict[str, tuple[type, ...]] = {
    "robustness": (dict,),        # added by `quest robustness`: {"acc_pgd_eps0.03": 0.41, ...}
    "imagenet": (dict,),          # added by `quest imagenet`: {"real_acc": 0.71, "c_mce": 72.4, ...}
    "split": (dict,),             # how the data was split: {"source", "rule", "hash": {split: membership hash}}
    "losses": (dict,),            # train_first/last/best and val_final/best loss, for stability studies
    "batch": (dict,),             # the global batch and its split: {"global", "per_device", "world_size", "accumulate"}
    "trajectory": (dict,),        # probe statistics over training: {"step": [...], "layers": {name: {stat: [...]}}}
    "stopped": (dict,),           # a run stopped by a signal: {"signal": "SIGTERM", "step": 40}
    "directions": (dict,),        # which way each test metric is better: {"acc": "max", "loss": "min", ...}
    "baselines": (dict,),         # what each trivial baseline predicts: {"acc_baseline": "always the most ..."}
    "timing": (dict,),            # where the wall time went: {"build_s", "fit_s", "checkpoint_s", "steps", "test_s"}
    "headline": (list,),          # the test metrics a summary shows: ["miou", "miou_baseline", "miou_corrupt"]
    "snapshots": (list,),         # weights kept along training: [{"fraction", "step", "file"}] (in snapshots/)
    "curve": (list,),             # the snapshots evaluated (runners.runs.curve): [{"fraction", "step", "metrics"}]
}
# Fields mapping names to numbers, which aggregation averages.
NUMERIC_MAPS = ("metrics", "probes", "robustness", "imagenet", "losses")


class RecordError(ValueError):
    """A record file that is missing, not JSON, or does not follow the schema. ``path`` is the record's
    file (or the name given to ``validate``), ``reason`` what is wrong with it."""

    def __init__(self, path: str | Path, reason: str):
        super().__init__(str(path), reason)  # both in args: the error survives pickling (sweep workers)
        self.path, self.reason = str(path), reason

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


def _is_number(value: Any) -> bool:
    """An int or float (numpy scalars too: ``write_record`` turns them into floats), not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def validate(record: dict[str, Any], where: str = "record") -> dict[str, Any]:
    """``record`` if it follows the schema (see the module docstring), else ``RecordError`` naming ``where``."""
    missing = [k for k in SCHEMA if k not in record]
    if missing:
        raise RecordError(where, f"missing field(s) {', '.join(missing)}")
    present = {**SCHEMA, **{k: t for k, t in OPTIONAL.items() if k in record}}
    for key, types in present.items():
        if not isinstance(record[key], types) or isinstance(record[key], bool) and bool not in types:
            raise RecordError(where, f"field {key!r} has type {type(record[key]).__name__}")
    for field in (f for f in NUMERIC_MAPS if f in record):
        for key, value in record[field].items():
            if not _is_number(value):
                raise RecordError(where, f"field {field!r} key {key!r} is {value!r} "
                                         f"({type(value).__name__}), not a number")
    if record["status"] not in STATUSES:
        raise RecordError(where, f"status {record['status']!r} is not one of {', '.join(STATUSES)}")
    if record["schema"] != SCHEMA_VERSION:
        raise RecordError(where, f"schema version {record['schema']} (this reader knows {SCHEMA_VERSION})")
    return record


def write_record(run_dir: str | Path, record: dict[str, Any]) -> Path:
    """Validate and write ``<run_dir>/record.json`` via a temp file and rename: a reader never sees
    half a record, and a killed run leaves none. A write that fails (a full disk) removes the temp file
    and raises ``OSError`` naming the record's path, not the temp file's."""
    run_dir = Path(run_dir)
    path = run_dir / RECORD_NAME
    run_dir.mkdir(parents=True, exist_ok=True)
    validate(record, str(path))
    fd, tmp = tempfile.mkstemp(dir=run_dir, prefix=".record.", suffix=".json")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(record, f, indent=2, sort_keys=True, default=float)
        os.replace(tmp, path)
    except OSError as err:
        Path(tmp).unlink(missing_ok=True)
        raise OSError(err.errno, err.strerror, str(path)) from None
    return path


def read_record(path: str | Path) -> dict[str, Any]:
    """A record from its file or its run directory; malformed ones raise ``RecordError``."""
    path = Path(path)
    if path.is_dir():
        path = path / RECORD_NAME
    try:
        record = json.loads(path.read_text(encoding="utf-8"))  # as JSON is
    except FileNotFoundError:
        raise RecordError(path, "no such record") from None
    except UnicodeDecodeError as err:
        raise RecordError(path, f"not UTF-8 text (byte {err.object[err.start]:#04x} at offset {err.start})") from None
    except json.JSONDecodeError as err:
        raise RecordError(path, f"not valid JSON ({err.msg} at line {err.lineno})") from None
    if not isinstance(record, dict):
        raise RecordError(path, "not a JSON object")
    return validate(record, str(path))


def find_records(root: str | Path) -> list[Path]:
    return sorted(Path(root).rglob(RECORD_NAME))


def read_records(*roots: str | Path) -> tuple[list[tuple[Path, dict[str, Any]]], list[RecordError]]:
    """Every valid record under ``roots`` with its path, and the errors of those that are not; a record under
    two of them (``runs runs/vision``) once."""
    good, bad = [], []
    for path in {p.resolve(): p for root in roots for p in find_records(root)}.values():
        try:
            good.append((path, read_record(path)))
        except RecordError as err:
            bad.append(err)
    return good, bad
