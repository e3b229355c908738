"""Run records as a table: one row per run, its identity columns and every test metric."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from common.attention import VARIANTS
from common.records import RunRecord, read_records
from runners.runs.selection import SELECTION_FILE, Selection, leaves, read_selection, settings, varying_keys

# Summary columns of `quest robustness` results (a record's "robustness" field) shown beside test metrics:
# accuracies (common.perturbations), so higher is better.
ROBUSTNESS = ("acc_fgsm_", "acc_pgd_", "acc_autoattack_", "acc_corruption_mean")
# One table and one set of plots per group: runs of different sizes never mix, nor those of the two protocols of a
# sweep with a `select:` section ("same recipe", "tuned", followed by its `label:` if it has one, such as "tuned,
# PyTorch init"; empty for other runs).
GROUP = ["domain", "dataset", "preset", "protocol"]
# Record fields copied into each run's row (in this order, for a stable CSV); with run_dir, not metrics.
RECORD_FIELDS = ("domain", "dataset", "variant", "seed", "preset", "status", "primary_metric", "mode")
DESCRIPTIONS = ("directions", "baselines")  # what the record says of its metrics (not written to the CSV)
# How sharp a run's attention starts: its probes at step 0, averaged over layers (common.probes).
INITIAL = {"init_logit_std": "logit_std", "init_entropy_ratio": "entropy_ratio"}
IDENTITY = {*RECORD_FIELDS, "protocol", "run_dir", *DESCRIPTIONS, *INITIAL, "best_at_end", "pooled"}
PROTOCOLS = ("same recipe", "tuned")


def load_runs(*roots: str | Path) -> pd.DataFrame:
    """One row per run under any of ``roots``: identity columns plus every test metric. Damaged or malformed
    records are skipped with a warning; ``attrs["skipped"]`` of the result lists them as (path, reason)."""
    records, errors = read_records(*roots)  # each damaged one logged as skipped
    selections = {Path(root): read_selection(Path(root) / SELECTION_FILE) for root in roots
                  if (Path(root) / SELECTION_FILE).is_file()}
    rows, flat = [], []
    for path, rec in records:
        row = {**{k: getattr(rec, k) for k in RECORD_FIELDS}, "run_dir": str(path.parent),
               **{k.removeprefix("test/"): v for k, v in rec.metrics.items()},
               **{k: v for k, v in (rec.robustness or {}).items() if k.startswith(ROBUSTNESS)},
               **{k: getattr(rec, k) or {} for k in DESCRIPTIONS}, **initial_sharpness(rec)}
        kept = rec.best_val
        if kept.evaluations:  # its best validation was its last: still improving when it stopped
            row["best_at_end"] = kept.evaluation == kept.evaluations
        protocols = _protocols(path, rec, selections)
        rows += [{**row, "protocol": protocol} for protocol in protocols]
        flat += [settings(rec.config)] * len(protocols)
    if not rows:
        raise FileNotFoundError(f"no readable run records under {', '.join(map(str, roots))} ({len(errors)} skipped)")
    runs = pd.DataFrame(rows)
    runs["pooled"] = _pooled(runs, flat)
    runs.attrs["skipped"] = [(err.path, err.reason) for err in errors]
    return runs


def _pooled(runs: pd.DataFrame, flat: list[dict]) -> list[str]:
    """Per run, the settings that vary among its variant's runs in its table besides the seed (a learning-rate
    grid's ``optim.lr``), which the table's mean and interval pool; "" where only seeds differ. A key some of the
    runs lack (recorded before it existed) is not counted as varying."""
    pooled = [""] * len(runs)
    for _, group in runs.groupby([*GROUP, "variant"], sort=False):
        members = [flat[i] for i in group.index]
        keys = ", ".join(key for key in varying_keys(members) if all(key in run for run in members))
        for i in group.index:
            pooled[i] = keys
    return pooled


def second_setting(protocol: str) -> str:
    """The sweep's own setting in a protocol label ("tuned, PyTorch init" -> "PyTorch init"), else ""."""
    return protocol.partition(", ")[2]


def repeats(runs: pd.DataFrame) -> dict[tuple[str, ...], tuple[str, ...]]:
    """Groups (``GROUP`` keys) that hold exactly the runs of an earlier group, mapped to it: a sweep's two
    protocols where every choice is the recipe's at the same seeds. Shown, plotted and counted once."""
    first, found = {}, {}
    for key, group in runs.groupby(GROUP, sort=True):
        earlier = first.setdefault(frozenset(group["run_dir"]), key)
        if earlier != key:
            found[key] = earlier
    return found


def initial_sharpness(rec: RunRecord) -> dict[str, float]:
    """The run's attention sharpness at step 0 (``INITIAL``), where its probes ran then."""
    trajectory = rec.trajectory
    if trajectory is None or trajectory.step[:1] != [0]:
        return {}
    at_start = {column: [layer[stat][0] for layer in trajectory.layers.values() if layer.get(stat)]
                for column, stat in INITIAL.items()}
    return {column: sum(values) / len(values) for column, values in at_start.items() if values}


def _protocols(path: Path, rec: RunRecord, selections: dict[Path, Selection]) -> list[str]:
    """The protocols a run belongs to: none for a selection run, else "same recipe" where its scaled settings
    are the recipe's and its seed one of the sweep's, and "tuned" where they are its variant's choice and its
    seed a confirmation seed (both where the two agree); a run of no sweep with a ``select:`` section belongs
    to one table, unlabelled."""
    root = next((root for root in selections if path.is_relative_to(root)), None)
    if root is None:
        return [""]
    if path.is_relative_to(root / "select"):
        return []
    selection, settings = selections[root], leaves(rec.config)
    same = lambda want: all(abs(float(settings.get(k, "nan")) - v) <= 1e-9 * abs(v) for k, v in want.items())
    recipe = selection.recipe.get(rec.domain, {})  # a domain not tuned has only the recipe's runs
    chosen = selection.chosen.get(rec.domain, {}).get(rec.variant)
    found = [PROTOCOLS[0]] if same(recipe) and rec.seed in selection.recipe_seeds else []
    found += [PROTOCOLS[1]] if chosen is not None and same(chosen) and rec.seed in selection.confirm_seeds else []
    label = selection.label  # a sweep's own setting (another init) keeps its tables apart
    return [f"{name}, {label}" if label else name for name in found]


def direction(runs: pd.DataFrame, metric: str) -> str | None:
    """Which way ``metric`` is better in ``runs``, "min" or "max", as their records say (the primary metric's
    mode, the task's ``directions``); None where no record says (records written before they did)."""
    if metric == runs["primary_metric"].iloc[0]:
        return runs["mode"].iloc[0]
    if metric.startswith(ROBUSTNESS):
        return "max"
    return next((said[metric] for said in runs["directions"] if metric in said), None)


def variant_order(variants) -> list[str]:
    return [v for v in VARIANTS if v in set(variants)] + sorted(set(variants) - set(VARIANTS))

