"""Endpoints that span one seed's runs over a grid of settings (a plan hypothesis's ``over:``), read at each run's
final checkpoint: the learning-rate sensitivity of Wortsman et al. (2023, "Small-scale proxies for large-scale
Transformer training instabilities") and a grid's mean (a success rate over a learning rate × weight decay grid).

``final_loss`` is a run's last validation loss (``losses.val_final``), clipped as Wortsman et al. clip it: a run that
diverged, or ended above its initial loss (its first training loss), counts as that initial loss. Any other metric
is the run's test metric, 0 where the run diverged (a run that blew up did not succeed). A run that failed or was
stopped is no result: its seed is dropped from the claim, and counted.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from common.records import RunRecord, read_record
from runners.results.frame import direction

ENDPOINTS = ("lr_sensitivity", "mean")
FINAL_LOSS = "final_loss"  # the metric of an lr_sensitivity claim: the final validation loss, clipped


def _matches(value, wanted) -> bool:
    if isinstance(wanted, (int, float)) and not isinstance(wanted, bool) and isinstance(value, (int, float)):
        return abs(float(value) - float(wanted)) <= 1e-9 * max(abs(float(wanted)), 1e-30)
    return value == wanted


def claim_runs(runs: pd.DataFrame, h) -> tuple[pd.DataFrame, dict[str, RunRecord]]:
    """The runs of ``h.domain`` and its two variants whose config has every setting of ``h.where``
    (``{model.dim: 128}``), and their records by run directory."""
    found = runs[(runs["domain"] == h.domain) & runs["variant"].isin([h.variant, h.against])]
    records = {run_dir: read_record(run_dir) for run_dir in found["run_dir"]}  # the frame read them: they read
    keep = [all(_matches(records[run_dir].setting(key), value) for key, value in h.where.items()) for run_dir in found["run_dir"]]
    return found[np.array(keep, dtype=bool)], records


def run_value(row: pd.Series, record: RunRecord, metric: str) -> float:
    """One run's value of ``metric`` at its final checkpoint, as the module's docstring says."""
    if metric == FINAL_LOSS:
        losses = record.losses or {}
        initial, final = losses.get("train_first", np.nan), losses.get("val_final", np.nan)
        ended_well = row["status"] == "ok" and np.isfinite(final) and final <= initial
        return final if ended_well else initial
    return 0.0 if row["status"] == "diverged" else row.get(metric, np.nan)


def endpoint(values: pd.Series, kind: str) -> float:
    """One seed's endpoint over its grid's ``values``: Wortsman's sensitivity (their mean less their best) or mean."""
    return values.mean() - values.min() if kind == "lr_sensitivity" else values.mean()


def better_when(runs: pd.DataFrame, metric: str, kind: str) -> str | None:
    """Which way an endpoint is better: a sensitivity, or a loss, lower; otherwise as the records say of the metric."""
    if kind == "lr_sensitivity" or metric == FINAL_LOSS:
        return "min"
    return direction(runs, metric) if len(runs) else None


def grid_differences(runs: pd.DataFrame, h, seeds: list[int]) -> tuple[pd.Series, int]:
    """Per seed, ``h.variant``'s endpoint less ``h.against``'s (signed so that positive favours the variant) over the
    grid of ``h.over``, and how many seeds were dropped for a run that failed or was stopped. A seed counts once
    both variants have a run at every cell of the grid (the cells any of the claim's runs has)."""
    mine, records = claim_runs(runs[runs["seed"].isin(seeds)], h)
    if mine.empty:
        return pd.Series(dtype=float), 0
    mine = mine.assign(cell=[tuple(records[run_dir].setting(key) for key in h.over) for run_dir in mine["run_dir"]],
                       value=[run_value(row, records[row["run_dir"]], h.metric) for _, row in mine.iterrows()])
    grid = set(mine["cell"])
    dropped = set(mine.loc[~mine["status"].isin(["ok", "diverged"]), "seed"])
    diffs = {}
    for seed, at_seed in mine.groupby("seed"):
        sides = {v: at_seed[at_seed["variant"] == v] for v in (h.variant, h.against)}
        if seed in dropped or any(set(side["cell"]) != grid for side in sides.values()):
            continue
        ends = {v: endpoint(side.groupby("cell")["value"].mean(), h.endpoint) for v, side in sides.items()}
        diffs[seed] = ends[h.variant] - ends[h.against]
    sign = -1.0 if better_when(mine, h.metric, h.endpoint) == "min" else 1.0
    return sign * pd.Series(diffs, dtype=float).sort_index(), len(dropped)
