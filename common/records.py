"""The run record: one JSON file per run, written atomically, read back with validation.

``RunRecord`` is the schema: its fields, their types and what each holds. Both trainers build one and
``write_record`` serialises it; commands that add to a finished run (``quest robustness``, ``quest imagenet``,
``quest curve``) read it back as a ``RunRecord`` (``RunRecord.read``), set their field and write it again.
Tables are built from the JSON form (``read_record``, ``read_records``).

A record file is data (``common.files``): a regular file of at most ``MAX_RECORD_BYTES``, JSON within the
nesting and integer limits. Validation checks every field's type, the values of its maps and lists where the
schema types them (each value of ``metrics``, ``probes`` and, when ``quest robustness`` has added it,
``robustness`` a real number: an int or float, never a bool or a numeric string such as ``"0.5"``), and the keys
readers take from the nested fields (``NESTED``, and a probe trajectory's numbers per step). NaN and ±inf are
numbers here: a diverged metric may be NaN.
"""
from __future__ import annotations

import json
import logging
import numbers
import os
import tempfile
import types
import typing
from dataclasses import dataclass, fields
from functools import cache
from pathlib import Path
from typing import Any

from common.files import FileError, MiB, read_json

log = logging.getLogger(__name__)

RECORD_NAME = "record.json"
SCHEMA_VERSION = 1
MAX_RECORD_BYTES = 64 * MiB  # a long run's probe trajectory (every 25 steps, every layer) takes a few MiB
STATUSES = ("ok", "diverged", "failed", "stopped")  # stopped: by SIGINT or SIGTERM, not a result

Numbers = dict[str, float]  # a map of names to real numbers, which aggregation averages


@dataclass
class RunRecord:
    """One run's record. The fields without a default are in every record; those defaulting to None are
    absent from the JSON of a record that lacks them (none of them is ever written as null). A field typed
    ``float`` takes an int too, as JSON does."""

    schema: int
    domain: str
    dataset: str
    variant: str
    seed: int
    preset: str
    status: str                   # one of STATUSES
    config: dict[str, Any]        # the composed config, resolved
    metrics: Numbers              # test metrics, e.g. {"test/acc": 0.93}
    primary_metric: str           # e.g. "acc"
    mode: str                     # "min" | "max"
    best_val: dict[str, Any]      # {"value": float | None, "epoch": int | None, "evaluation", "evaluations"}
    divergence: dict[str, Any] | None  # {"step": int, "reason": str}
    error: str | None
    probes: Numbers               # final cross-layer probe summary
    wall_time_s: float
    params: int
    hardware: dict[str, Any]
    versions: dict[str, Any]
    git_commit: str | None
    # Fields that only some records have.
    robustness: Numbers | None = None  # added by `quest robustness`: {"acc_pgd_eps0.03": 0.41, ...}
    robustness_config: dict[str, Any] | None = None  # the `robustness` settings that evaluation ran with
    imagenet: Numbers | None = None  # added by `quest imagenet`: {"real_acc": 0.71, "c_mce": 72.4, ...}
    split: dict[str, Any] | None = None  # how the data was split: {"source", "rule", "hash": {split: membership hash}}
    losses: Numbers | None = None  # train_first/last/best and val_final/best loss, for stability studies
    batch: dict[str, int] | None = None  # the global batch and its split: {"global", "per_device", "world_size", "accumulate"}
    trajectory: dict[str, Any] | None = None  # probe statistics over training: {"step": [...], "layers": {name: {stat: [...]}}}
    stopped: dict[str, Any] | None = None  # a run stopped by a signal: {"signal": "SIGTERM", "step": 40}
    directions: dict[str, str] | None = None  # which way each test metric is better: {"acc": "max", "loss": "min", ...}
    baselines: dict[str, str] | None = None  # what each trivial baseline predicts: {"acc_baseline": "always the most ..."}
    timing: dict[str, Any] | None = None  # where the wall time went: {"build_s", "fit_s", "checkpoint_s", "steps", "test_s"}
    headline: list[str] | None = None  # the test metrics a summary shows: ["miou", "miou_baseline", "miou_corrupt"]
    snapshots: list[dict[str, Any]] | None = None  # weights kept along training: [{"fraction", "step", "file"}] (in snapshots/)
    curve: list[dict[str, Any]] | None = None  # the snapshots evaluated (runners.runs.snapshot_tests): [{"fraction", "step", "metrics"}]

    def fail(self, error: str) -> None:
        """The run failed: ``error`` is the one line saying why."""
        self.status, self.error = "failed", error

    def to_json(self) -> dict[str, Any]:
        """The record as its file holds it: every required field, and the optional ones it has."""
        return {key: getattr(self, key) for key, field in _fields().items()
                if field.required or getattr(self, key) is not None}

    @classmethod
    def from_json(cls, data: dict[str, Any], where: str = "record") -> RunRecord:
        """The record ``data`` holds, validated (``RecordError`` naming ``where``). Fields outside the schema
        are refused: this record would be written without them."""
        unknown = sorted(set(validate(data, where)) - set(_fields()))
        if unknown:
            raise RecordError(where, f"unknown field(s) {', '.join(unknown)}")
        return cls(**data)

    @classmethod
    def read(cls, path: str | Path) -> RunRecord:
        """The record of a run directory or file, to add to it and write it again."""
        path = Path(path)
        return cls.from_json(read_record(path), str(path / RECORD_NAME if path.is_dir() else path))


@dataclass(frozen=True)
class _Field:
    """What validation needs of a ``RunRecord`` field, from its annotation."""

    required: bool
    types: tuple[type, ...]  # the JSON types accepted
    item: type | None  # each value of a map or item of a list, where the annotation says (float: a real number)


@cache
def _fields() -> dict[str, _Field]:
    hints = typing.get_type_hints(RunRecord)
    found = {}
    for field in fields(RunRecord):
        required = field.default is not None
        parts = typing.get_args(hints[field.name]) if isinstance(hints[field.name], types.UnionType) \
            else (hints[field.name],)
        kinds = tuple(typing.get_origin(part) or part for part in parts if required or part is not type(None))
        items = [typing.get_args(part)[-1] for part in parts if typing.get_origin(part) in (dict, list)]
        item = None if not items or items[0] is Any else typing.get_origin(items[0]) or items[0]
        found[field.name] = _Field(required, kinds + ((int,) if float in kinds else ()), item)
    return found


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


NUMBER, INTEGER, OPTIONAL = "a number", "an integer", " or null"
KIND_TESTS = {NUMBER: _is_number, INTEGER: lambda v: isinstance(v, int) and not isinstance(v, bool),
              "a string": lambda v: isinstance(v, str), "a mapping": lambda v: isinstance(v, dict)}
ITEM_KINDS = {float: NUMBER, int: INTEGER, str: "a string", dict: "a mapping"}

# The keys readers take from the nested fields (tables, selection, archive, curves), each with its kind; a key
# marked with "?" may be absent. Checked, so that a record that passes validation is one every reader can read.
NESTED = {
    "best_val": {"value": NUMBER + OPTIONAL, "epoch?": INTEGER + OPTIONAL, "evaluation?": INTEGER,
                 "evaluations?": INTEGER},
    "divergence": {"step": INTEGER, "reason": "a string"},
    "stopped": {"signal": "a string", "step": INTEGER},
    "snapshots": {"fraction": NUMBER, "step": INTEGER, "file": "a string"},
    "curve": {"fraction": NUMBER, "step": INTEGER, "metrics": "a mapping", "robustness?": "a mapping"},
}


def _is(value: Any, kind: str) -> bool:
    return (kind.endswith(OPTIONAL) and value is None) or KIND_TESTS[kind.removesuffix(OPTIONAL)](value)


def _nested(name: str, value: Any) -> str | None:
    """What is wrong with the nested field ``name`` (a mapping, or a list of them), or None."""
    for index, entry in (enumerate(value) if isinstance(value, list) else [(None, value)]):
        place = f"field {name!r}" + ("" if index is None else f" item {index}")
        for key, kind in NESTED[name].items():
            optional, key = key.endswith("?"), key.removesuffix("?")
            if key not in entry and not optional:
                return f"{place} lacks {key!r}"
            if key in entry and not _is(entry[key], kind):
                return f"{place} key {key!r} is {entry[key]!r}, not {kind}"
        if name == "curve" and not all(map(_is_number, entry["metrics"].values())):
            return f"{place} has metrics that are not numbers"
    if name == "best_val" and ("evaluation" in value) != ("evaluations" in value):
        return "field 'best_val' has one of 'evaluation' and 'evaluations' without the other"
    return None


def _trajectory(value: dict) -> str | None:
    """What is wrong with a probe trajectory (``{"step": [...], "layers": {name: {stat: [...]}}}``), or None:
    each stat has a number for every step."""
    steps, layers = value.get("step"), value.get("layers")
    if not isinstance(steps, list) or not all(map(KIND_TESTS[INTEGER], steps)) or not isinstance(layers, dict):
        return "field 'trajectory' is not {'step': [integers], 'layers': {...}}"
    for name, stats in layers.items():
        if not isinstance(stats, dict):
            return f"field 'trajectory' layer {name!r} is not a mapping of stats"
        for stat, values in stats.items():
            if not isinstance(values, list) or len(values) != len(steps) or not all(map(_is_number, values)):
                return f"field 'trajectory' layer {name!r} stat {stat!r} is not {len(steps)} numbers, one per step"
    return None


def validate(record: dict[str, Any], where: str = "record") -> dict[str, Any]:
    """``record`` if it follows the schema (see the module docstring), else ``RecordError`` naming ``where``."""
    schema = _fields()
    missing = [key for key, field in schema.items() if field.required and key not in record]
    if missing:
        raise RecordError(where, f"missing field(s) {', '.join(missing)}")
    present = {key: field for key, field in schema.items() if key in record}
    for key, field in present.items():
        if not isinstance(record[key], field.types) or isinstance(record[key], bool):
            raise RecordError(where, f"field {key!r} has type {type(record[key]).__name__}")
    for name, field in present.items():
        if field.item is None or record[name] is None:
            continue
        kind = ITEM_KINDS[field.item]
        for key, value in (record[name].items() if isinstance(record[name], dict) else enumerate(record[name])):
            if not _is(value, kind):
                raise RecordError(where, f"field {name!r} {'key' if isinstance(key, str) else 'item'} {key!r} is "
                                         f"{value!r} ({type(value).__name__}), not {kind}")
    problem = next(filter(None, (_nested(name, record[name]) for name in NESTED if record.get(name) is not None)), None)
    problem = problem or (_trajectory(record["trajectory"]) if record.get("trajectory") is not None else None)
    if problem:
        raise RecordError(where, problem)
    if record["status"] not in STATUSES:
        raise RecordError(where, f"status {record['status']!r} is not one of {', '.join(STATUSES)}")
    if record["schema"] != SCHEMA_VERSION:
        raise RecordError(where, f"schema version {record['schema']} (this reader knows {SCHEMA_VERSION})")
    return record


def write_record(run_dir: str | Path, record: RunRecord) -> Path:
    """Validate ``record`` and write it to ``<run_dir>/record.json`` via a temp file and rename: a reader never sees
    half a record, and a killed run leaves none. A write that fails (a full disk) removes the temp file
    and raises ``OSError`` naming the record's path, not the temp file's."""
    run_dir = Path(run_dir)
    path = run_dir / RECORD_NAME
    run_dir.mkdir(parents=True, exist_ok=True)
    data = validate(record.to_json(), str(path))
    fd, tmp = tempfile.mkstemp(dir=run_dir, prefix=".record.", suffix=".json")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2, sort_keys=True, default=float)
        os.replace(tmp, path)
    except OSError as err:
        Path(tmp).unlink(missing_ok=True)
        raise OSError(err.errno, err.strerror, str(path)) from None
    return path


def read_record(path: str | Path) -> dict[str, Any]:
    """The JSON form of a record, from its file or its run directory, read as data (``common.files``: a regular
    file of at most ``MAX_RECORD_BYTES``); a damaged or malformed one raises ``RecordError``."""
    path = Path(path)
    if path.is_dir():
        path = path / RECORD_NAME
    try:
        record = read_json(path, "record", MAX_RECORD_BYTES)
    except FileError as err:
        raise RecordError(err.path, err.reason) from None
    if not isinstance(record, dict):
        raise RecordError(path, "not a JSON object")
    return validate(record, str(path))


def find_records(root: str | Path) -> list[Path]:
    return sorted(Path(root).rglob(RECORD_NAME))


def read_records(*roots: str | Path) -> tuple[list[tuple[Path, dict[str, Any]]], list[RecordError]]:
    """Every valid record under ``roots`` with its path, and the errors of those that are not, each logged once
    as skipped (a command that reads many records goes on without a damaged one); a record under two of them
    (``runs runs/vision``) once."""
    good, bad = [], []
    for path in {p.resolve(): p for root in roots for p in find_records(root)}.values():
        try:
            good.append((path, read_record(path)))
        except RecordError as err:
            log.warning("skipping %s", err)
            bad.append(err)
    return good, bad
