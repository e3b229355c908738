"""The run record: one JSON file per run, written atomically, read back as a typed ``RunRecord``. Commands that add
to a finished run (``quest robustness``, ``quest imagenet``, ``quest curve``) read it back, set their field and
write it again.

Validation checks every field, the values of its maps and lists and the keys of its nested parts, so that a record
that reads is one every reader can read. A number (``Number``) is an int or float, never a bool or a numeric string
such as ``"0.5"``; NaN and ±inf are numbers here: a diverged metric may be NaN. A problem is one line naming the
field: ``field 'metrics' key 'test/mse' is '0.5' (str), not a number``.
"""
from __future__ import annotations

import json
import logging
import numbers
import os
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, PlainValidator, ValidationError, model_validator
from pydantic_core import PydanticCustomError

from common.files import FileError, MiB, read_json, write_atomic
from common.typed import Model, first_problem

log = logging.getLogger(__name__)

RECORD_NAME = "record.json"
SCHEMA_VERSION = 1
MAX_RECORD_BYTES = 64 * MiB  # a long run's probe trajectory (every 25 steps, every layer) takes a few MiB


def _problem(text: str) -> PydanticCustomError:
    """A record's own problem (not a type), said as ``text`` after the field's name."""
    return PydanticCustomError("record", "{text}", {"text": text})


def _number(value: Any) -> float:
    """An int or float as it is (JSON keeps ``3`` apart from ``3.0``); another real number, such as a numpy
    scalar, as a float; anything else, a bool included, refused."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise PydanticCustomError("number", "not a number")
    return value if isinstance(value, int | float) else float(value)


Number = Annotated[float, PlainValidator(_number)]
Numbers = dict[str, Number]  # a map of names to real numbers, which aggregation averages


class BestValue(Model):
    """The best value of the primary validation metric and its epoch (None where no validation ran), and which of
    the run's validations it was (``evaluation``, from 1, of ``evaluations``; older records lack both)."""

    value: Number | None
    epoch: int | None
    evaluation: int | None = None
    evaluations: int | None = None

    @model_validator(mode="after")
    def _both(self) -> BestValue:
        if (self.evaluation is None) != (self.evaluations is None):
            raise _problem("has one of 'evaluation' and 'evaluations' without the other")
        return self


class Divergence(Model):
    step: int
    reason: str


class Stopped(Model):
    signal: str  # "SIGINT" or "SIGTERM"
    step: int


class Batch(Model):
    """The global batch (``data.batch_size``, the samples of one optimiser step) and how it splits."""

    global_: int = Field(alias="global")
    per_device: int
    world_size: int
    accumulate: int


class Timing(Model):
    """Where a run's wall time went, in seconds, filled in as it gets there (a run that failed early has less)."""

    model_config = ConfigDict(frozen=False, validate_assignment=True)  # the trainer sets each part as it ends
    build_s: Number  # config, data and model, before fitting
    fit_s: Number | None = None  # checkpoint writes included
    checkpoint_s: Number | None = None
    steps: int | None = None
    test_s: Number | None = None


class Snapshot(Model):
    """Weights kept at a ``fraction`` of training (``common.callbacks.Snapshots``), in the run's ``snapshots/``."""

    fraction: Number
    step: int
    file: str


class CurvePoint(Model):
    """A snapshot tested (``runners.runs.snapshot_tests``): its test metrics, and attacks where run."""

    fraction: Number
    step: int
    metrics: Numbers
    robustness: Numbers | None = None


class Trajectory(Model):
    """The probe statistics over training (``common.callbacks.ProbeCallback``), each one number per step."""

    step: list[int]
    layers: dict[str, dict[str, list[Number]]]  # {layer: {stat: [value per step]}}

    @model_validator(mode="wrap")
    @classmethod
    def _per_step(cls, data: Any, handler) -> Trajectory:
        try:
            trajectory = handler(data)
        except ValidationError:
            raise _problem("is not {'step': [integers], 'layers': {...}}") from None
        for name, stats in trajectory.layers.items():
            for stat, values in stats.items():
                if len(values) != len(trajectory.step):
                    raise _problem(f"layer {name!r} stat {stat!r} is not {len(trajectory.step)} numbers, one per step")
        return trajectory


class RunRecord(Model):
    """One run's record. The fields without a default are in every record; those defaulting to None are absent
    from the JSON of a record that lacks them (none of them is ever written as null)."""

    model_config = ConfigDict(frozen=False, validate_assignment=True)  # filled in as the run goes, added to later
    schema_: Literal[SCHEMA_VERSION] = Field(alias="schema")  # BaseModel has a method of that name
    domain: str
    dataset: str
    variant: str
    seed: int
    preset: str
    status: Literal["ok", "diverged", "failed", "stopped"]  # stopped: by SIGINT or SIGTERM, not a result
    config: dict[str, Any]        # the composed config, resolved
    metrics: Numbers              # test metrics, e.g. {"test/acc": 0.93}
    primary_metric: str           # e.g. "acc"
    mode: Literal["min", "max"]   # which way the primary metric is better
    best_val: BestValue
    divergence: Divergence | None
    error: str | None
    probes: Numbers               # final cross-layer probe summary
    wall_time_s: Number
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
    batch: Batch | None = None
    trajectory: Trajectory | None = None
    stopped: Stopped | None = None  # a run stopped by a signal
    directions: dict[str, str] | None = None  # which way each test metric is better: {"acc": "max", "loss": "min", ...}
    baselines: dict[str, str] | None = None  # what each trivial baseline predicts: {"acc_baseline": "always the most ..."}
    timing: Timing | None = None
    headline: list[str] | None = None  # the test metrics a summary shows: ["miou", "miou_baseline", "miou_corrupt"]
    snapshots: list[Snapshot] | None = None
    curve: list[CurvePoint] | None = None  # the snapshots tested, in their order

    def setting(self, key: str, default: Any = None) -> Any:
        """One value of the run's config, as the record holds it, by its dotted key (``"optim.lr"``); ``default``
        where the run's config lacks it (a record from before the key existed)."""
        value: Any = self.config
        for part in key.split("."):
            if not isinstance(value, dict) or part not in value:
                return default
            value = value[part]
        return value

    def fail(self, error: str) -> None:
        """The run failed: ``error`` is the one line saying why."""
        self.status, self.error = "failed", error

    def to_json(self) -> dict[str, Any]:
        """The record as its file holds it: every required field, and the optional ones it has."""
        return self.model_dump(by_alias=True, exclude_defaults=True)

    @classmethod
    def from_json(cls, data: dict[str, Any], where: str = "record") -> RunRecord:
        """The record ``data`` holds, validated: else ``RecordError`` naming ``where`` and the field at fault.
        Fields outside the schema are refused: this record would be written without them."""
        try:
            return cls.model_validate(data)
        except ValidationError as err:
            raise RecordError(where, _reason(err)) from None


def _reason(err: ValidationError) -> str:
    """The first thing wrong with a record, in one line naming its field (and the key within it, dotted)."""
    errors = err.errors(include_url=False)
    for kind, words in (("missing", "missing"), ("extra_forbidden", "unknown")):  # every such field at once
        if named := [str(error["loc"][0]) for error in errors if error["type"] == kind and len(error["loc"]) == 1]:
            return f"{words} field(s) {', '.join(named)}"
    key, why, value = first_problem(err)
    kind, (field, _, inner) = errors[0]["type"], key.partition(".")
    if kind == "literal_error":
        return f"{field} {value!r} is not one of {why.removeprefix('choose from ')}"
    if not inner:
        return f"field {field!r} {why}" if kind == "record" else f"field {field!r} has type {type(value).__name__}"
    if kind in ("missing", "extra_forbidden"):
        return f"field {field!r} {'lacks' if kind == 'missing' else 'has unknown key'} {inner!r}"
    return f"field {field!r} key {inner!r} is {value!r} ({type(value).__name__}), {why}"


class RecordError(ValueError):
    """A record file that is missing, not JSON, or does not follow the schema. ``path`` is the record's
    file (or the name given to ``RunRecord.from_json``), ``reason`` what is wrong with it."""

    def __init__(self, path: str | Path, reason: str):
        super().__init__(str(path), reason)  # both in args: the error survives pickling (sweep workers)
        self.path, self.reason = str(path), reason

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


def write_record(run_dir: str | Path, record: RunRecord) -> Path:
    """Validate ``record`` and write it to ``<run_dir>/record.json`` via a temp file and rename: a reader never sees
    half a record, and a killed run leaves none. A write that fails (a full disk) removes the temp file
    and raises ``OSError`` naming the record's path, not the temp file's."""
    run_dir = Path(run_dir)
    path = run_dir / RECORD_NAME
    run_dir.mkdir(parents=True, exist_ok=True)
    data = record.to_json()
    RunRecord.from_json(data, str(path))  # checked again: a map the run filled in place was not checked then
    return write_atomic(path, json.dumps(data, indent=2, sort_keys=True, default=float))


def read_record(path: str | Path) -> RunRecord:
    """The record of a run, from its file or its run directory, read as data (``common.files``: a regular file
    of at most ``MAX_RECORD_BYTES``); a damaged or malformed one raises ``RecordError``."""
    path = Path(path)
    if path.is_dir():
        path = path / RECORD_NAME
    try:
        data = read_json(path, "record", MAX_RECORD_BYTES)
    except FileError as err:
        raise RecordError(err.path, err.reason) from None
    if not isinstance(data, dict):
        raise RecordError(path, "not a JSON object")
    return RunRecord.from_json(data, str(path))


def find_records(root: str | Path) -> list[Path]:
    """The record files under ``root``, a link among them whether it leads to a file or not: one that loops or leads
    nowhere is a damaged record to name, where a glob, which follows it, dropped it without a word. Links to folders
    are not followed."""
    return sorted(Path(folder) / RECORD_NAME for folder, _, files in os.walk(root) if RECORD_NAME in files)


def read_records(*roots: str | Path) -> tuple[list[tuple[Path, RunRecord]], list[RecordError]]:
    """Every valid record under ``roots`` with its path, and the errors of those that are not, each logged once
    as skipped (a command that reads many records goes on without a damaged one); a record under two of them
    (``runs runs/vision``) once."""
    good, bad = [], []
    for path in {os.path.realpath(p): p for root in roots for p in find_records(root)}.values():  # a loop: as it is
        try:
            good.append((path, read_record(path)))
        except RecordError as err:
            log.warning("skipping %s", err)
            bad.append(err)
    return good, bad
