"""Run records as a table: one row per run, its identity columns and every test metric."""
from __future__ import annotations

import logging
from pathlib import Path

import pandas as pd

from common.attention import VARIANTS
from common.records import read_records

log = logging.getLogger(__name__)


# Summary columns of `quest robustness` results (a record's "robustness" field) shown beside test metrics:
# accuracies (common.robustness), so higher is better.
ROBUSTNESS = ("acc_fgsm_", "acc_pgd_", "acc_autoattack_", "acc_corruption_mean")
GROUP = ["domain", "dataset", "preset"]  # one table and one set of plots per group: runs of different sizes never mix
# Record fields copied into each run's row (in this order, for a stable CSV); with run_dir, not metrics.
RECORD_FIELDS = ("domain", "dataset", "variant", "seed", "preset", "status", "primary_metric", "mode")
DESCRIPTIONS = ("directions", "baselines")  # what the record says of its metrics (not written to the CSV)
IDENTITY = {*RECORD_FIELDS, "run_dir", *DESCRIPTIONS}


def load_runs(*roots: str | Path) -> pd.DataFrame:
    """One row per run under any of ``roots``: identity columns plus every test metric. Malformed
    records are skipped with a warning; ``attrs["skipped"]`` of the result lists them as (path, reason)."""
    records, errors = read_records(*roots)
    for err in errors:
        log.warning("aggregate: skipping %s", err)
    skipped = [(err.path, err.reason) for err in errors]
    rows = []
    for path, rec in records:
        row = {k: rec[k] for k in RECORD_FIELDS}
        row["run_dir"] = str(path.parent)
        row.update({k.removeprefix("test/"): v for k, v in rec["metrics"].items()})
        row.update({k: v for k, v in rec.get("robustness", {}).items() if k.startswith(ROBUSTNESS)})
        row.update({k: rec.get(k, {}) for k in DESCRIPTIONS})
        rows.append(row)
    if not rows:
        raise FileNotFoundError(f"no readable run records under {', '.join(map(str, roots))} ({len(skipped)} skipped)")
    runs = pd.DataFrame(rows)
    runs.attrs["skipped"] = skipped
    return runs


def direction(runs: pd.DataFrame, metric: str) -> str | None:
    """Which way ``metric`` is better in ``runs``, "min" or "max", as their records say (the primary metric's
    mode, the task's ``directions``); None where no record says (records written before they did)."""
    if metric == runs["primary_metric"].iloc[0]:
        return runs["mode"].iloc[0]
    if metric.startswith(ROBUSTNESS):
        return "max"
    return next((said[metric] for said in runs["directions"] if metric in said), None)


def baseline(runs: pd.DataFrame, metric: str) -> str | None:
    """What the trivial baseline ``metric`` predicts, as the records of ``runs`` say."""
    return next((said[metric] for said in runs["baselines"] if metric in said), None)


def variant_order(variants) -> list[str]:
    return [v for v in VARIANTS if v in set(variants)] + sorted(set(variants) - set(VARIANTS))

