"""Choosing settings on validation data: the runs of a grid, grouped by the settings they differ in, ranked by
their validation score averaged over seeds (``quest select``).

A run's validation score is its record's ``best_val``: the primary metric on the validation split at the
epoch its checkpoint was kept (the one it is tested at). Test metrics are never read here, so a choice made
from this table cannot lean on the test set. The rule is the same wherever it is used:

1. a candidate is one combination of the settings that vary over the runs (seed excepted), within one domain,
   dataset, preset and, with ``by=variant``, one variant;
2. its score is the mean of its runs' validation scores; a run that diverged or failed scores as the worst
   value there is (it is counted, never dropped, so an unstable setting cannot win on its lucky seeds);
3. the best mean wins; a tie (equal to the printed precision, 1e-4) goes to the candidate with fewer parameters,
   then to the earlier in the runs' order of settings.
"""
from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path
from statistics import fmean, stdev
from typing import Literal

from pydantic import Field, ValidationError

from common.errors import ConfigError
from common.files import FileError, MiB, read_json, write_atomic
from common.records import RunRecord, read_records
from common.typed import Model, first_problem
from runners.config import UNHASHED
from runners.runs.margins import Grid, Margin, bucket, margin

SELECTION_FILE = "selection.json"  # where a sweep's tuned protocol keeps its choices (runners.sweeps.tuning)
IGNORED = ("seed", *UNHASHED)  # what never makes two runs different candidates


def leaves(tree: dict, prefix: str = "") -> dict[str, object]:
    """A nested config as ``{dotted key: value}`` (lists as tuples, so that values compare and hash)."""
    found = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            found.update(leaves(value, f"{prefix}{key}."))
        else:
            found[f"{prefix}{key}"] = tuple(value) if isinstance(value, list) else value
    return found


def settings(config: dict) -> dict[str, object]:
    """A run's config as ``leaves``, less what never makes two runs different (``IGNORED``)."""
    return {k: v for k, v in leaves(config).items() if not any(k == skip or k.startswith(f"{skip}.") for skip in IGNORED)}


def candidates(records: Iterable[RunRecord], by: tuple[str, ...] = ()) -> list[dict]:
    """The candidates of a grid (see the module's rule), best first within each group of ``by`` (and of domain,
    dataset and preset): ``{"group", "settings", "runs", "seeds", "mean", "std", "params", "failed"}``."""
    records = list(records)
    flat = [settings(rec.config) for rec in records]
    groups: dict[tuple, list[int]] = {}
    for index, rec in enumerate(records):
        key = tuple(getattr(rec, field) for field in ("domain", "dataset", "preset", *by))
        groups.setdefault(key, []).append(index)
    ranked = []
    for group, members in groups.items():
        fixed = {"attention.variant"} if "variant" in by else set()  # chosen for each variant apart
        varying = [k for k in varying_keys([flat[i] for i in members]) if k not in fixed]
        pool: dict[tuple, list[int]] = {}
        for i in members:
            pool.setdefault(tuple(repr(flat[i].get(k)) for k in varying), []).append(i)
        mode = records[members[0]].mode
        rows = [_candidate(group, varying, [records[i] for i in runs], [flat[i] for i in runs], mode)
                for runs in pool.values()]
        sign = -1 if mode == "max" else 1
        rows.sort(key=lambda row: (bucket(sign * row["mean"]), row["params"]))  # stable: then the runs' order
        ranked += rows
    return ranked


def varying_keys(flat: list[dict]) -> list[str]:
    """The keys whose value differs between some of ``flat``'s runs, a run without the key holding None: each
    run's values are seen once (comparing every run with every other took minutes on 20,000 records)."""
    values: dict[str, set[str]] = {}
    holders: dict[str, int] = {}
    for settings in flat:
        for key, value in settings.items():
            values.setdefault(key, set()).add(repr(value))
            holders[key] = holders.get(key, 0) + 1
    for key, count in holders.items():
        if count < len(flat):  # the runs without it: None
            values[key].add(repr(None))
    return sorted(key for key, seen in values.items() if len(seen) > 1)


def _candidate(group: tuple, varying: list[str], runs: list[RunRecord], flat: list[dict], mode: str) -> dict:
    worst = -math.inf if mode == "max" else math.inf
    scores = [rec.best_val.value if rec.status == "ok" and rec.best_val.value is not None
              and math.isfinite(rec.best_val.value) else worst for rec in runs]
    return {"group": group, "settings": {k: flat[0].get(k) for k in varying},
            "runs": len(runs), "seeds": sorted(rec.seed for rec in runs),
            "scores": {rec.seed: score for rec, score in zip(runs, scores)},
            "mean": fmean(scores), "std": stdev(scores) if len(scores) > 1 and all(map(math.isfinite, scores)) else 0.0,
            "params": runs[0].params, "failed": sum(rec.status != "ok" for rec in runs),
            "metric": f"val/{runs[0].primary_metric}", "mode": mode}


def select(*roots: str | Path, by: tuple[str, ...] = ()) -> list[dict]:
    """The ranked candidates of the runs under ``roots`` (malformed records are left out, as in aggregation)."""
    records, _ = read_records(*roots)
    if not records:
        raise FileNotFoundError(f"no readable run records under {', '.join(map(str, roots))}")
    return candidates([rec for _, rec in sorted(records, key=lambda item: str(item[0]))], by)


def group_margins(ranked: list[dict]) -> dict[tuple, Margin]:
    """Per group of two or more candidates, the chosen one's margin over the runner-up (``runners.runs.margins``);
    where one numeric setting varies, also whether the choice sits on the grid's edge and the curve's vertex. The
    grid's keys are that setting's values, else the candidates' ranks (0 the chosen)."""
    found = {}
    for group, rows in _groups(ranked).items():
        if len(rows) > 1:
            keys = [_numeric(row["settings"]) for row in rows]
            ordered = None not in keys
            found[group] = margin(dict(zip(keys if ordered else map(float, range(len(rows))), map(_signed, rows))),
                                  ordered=ordered)
    return found


def grids(ranked: list[dict]) -> dict[tuple, Grid]:
    """Per group whose candidates differ in one numeric setting, its grid: value -> {seed: score, higher better}."""
    return {group: {_numeric(row["settings"]): _signed(row) for row in rows}
            for group, rows in _groups(ranked).items() if None not in (_numeric(row["settings"]) for row in rows)}


def _groups(ranked: list[dict]) -> dict[tuple, list[dict]]:
    found: dict[tuple, list[dict]] = {}
    for row in ranked:
        found.setdefault(row["group"], []).append(row)
    return found


def _signed(row: dict) -> dict[int, float]:
    sign = 1 if row["mode"] == "max" else -1
    return {seed: sign * score for seed, score in row["scores"].items()}


def _numeric(settings: dict) -> float | None:
    """The value of a candidate's one numeric setting, None where several settings vary or it is not a number."""
    (value,) = settings.values() if len(settings) == 1 else (None,)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 else None


def margins_table(ranked: list[dict]) -> list[str]:
    """Markdown: each group's choice, its runner-up, their paired difference with its 95% interval and verdict,
    and (one numeric setting) whether the choice is on the grid's edge and where the curve rule would put it."""
    found = group_margins(ranked)
    if not found:
        return []
    lines = ["", "**Margins**: the chosen candidate against the runner-up, paired over the seeds both ran (signed so that "
             "> 0 favours the chosen)", "", "| group | chosen vs runner-up | difference [95% CI] | seeds | verdict | edge "
             "| curve vertex [90% bootstrap] |", "|---|---|---|---|---|---|---|"]
    for group, m in found.items():
        rows = [row for row in ranked if row["group"] == group]
        names = [f"{m.best:g}", f"{m.runner_up:g}"]
        if _numeric(rows[0]["settings"]) is None:  # keyed by rank: name the candidates by their settings
            names = [" ".join(f"{k}={x}" for k, x in rows[int(rank)]["settings"].items()) for rank in (m.best, m.runner_up)]
        interval = f"{m.difference:+.4f} [{m.low:+.4f}, {m.high:+.4f}]" if math.isfinite(m.low) else f"{m.difference:+.4f}"
        curve = f"{m.curve:.3g} [{m.curve_low:.3g}, {m.curve_high:.3g}]" if m.curve is not None else "–"
        lines.append(f"| {' / '.join(map(str, group))} | {names[0]} vs {names[1]} | {interval} | {m.seeds} | {m.verdict} "
                     f"| {'yes' if m.edge else 'no'} | {curve} |")
    return lines


def chosen(ranked: list[dict]) -> dict[tuple, dict]:
    """The winning candidate of each group, by group."""
    return {group: rows[0] for group, rows in _groups(ranked).items()}


def main_effects(ranked: list[dict]) -> dict[tuple, dict[str, dict[str, float]]]:
    """Per group, each setting's main effect over its candidates: the mean score at each of its values
    (over every candidate with that value; a full grid makes this the factorial main effect)."""
    effects: dict[tuple, dict[str, dict[str, list[float]]]] = {}
    for row in ranked:
        for key, value in row["settings"].items():
            effects.setdefault(row["group"], {}).setdefault(key, {}).setdefault(str(value), []).append(row["mean"])
    return {group: {key: {value: fmean(means) for value, means in values.items()} for key, values in keys.items()}
            for group, keys in effects.items()}


def overrides(settings: dict) -> list[str]:
    """A candidate's settings as ``key=value`` overrides (what a preset or a sweep file takes)."""
    def text(value):
        return "[" + ",".join(map(str, value)) + "]" if isinstance(value, tuple) else "null" if value is None else value
    return [f"{key}={text(value)}" for key, value in settings.items() if key != "attention.variant"]


def effects_table(ranked: list[dict]) -> list[str]:
    """Markdown: per group, each setting's main effect (``main_effects``), its values best first."""
    lines = []
    for group, keys in main_effects(ranked).items():
        mode = next(row["mode"] for row in ranked if row["group"] == group)
        lines += ["", f"**{' / '.join(map(str, group))}**: mean score at each value of a setting, over the candidates",
                  "", "| setting | values (mean score) |", "|---|---|"]
        for key, values in keys.items():
            order = sorted(values.items(), key=lambda item: item[1], reverse=mode == "max")
            lines.append(f"| {key} | " + " · ".join(f"{value} {mean:.4f}" for value, mean in order) + " |")
    return lines


def selection_table(ranked: list[dict]) -> list[str]:
    """Markdown: one table per group, the chosen candidate first and marked."""
    lines = []
    for group, rows in _groups(ranked).items():
        lines += ["", f"**{' / '.join(map(str, group))}** (ranked by mean {rows[0]['metric']} over seeds)", "",
                  "| | settings | mean | sd | runs | not ok | params |", "|---|---|---|---|---|---|---|"]
        for rank, row in enumerate(rows):
            shown = " ".join(f"{k}={v}" for k, v in row["settings"].items()) or "(one candidate)"
            lines.append(f"| {'' if rank else 'chosen'} | {shown} | {row['mean']:.4f} | {row['std']:.4f} | {row['runs']} "
                         f"| {row['failed']} | {row['params']} |")
    return lines


Settings = dict[str, float]  # a scaled key's dotted name -> its value


class Selection(Model):
    """A tuned protocol's choices (``selection.json``), written once by ``runners.sweeps.tuning`` and then read by
    the sweep's later launches and by ``quest aggregate``."""

    keys: list[str]
    """The scaled keys (``optim.lr``)."""
    seeds: list[int]
    """The selection seeds the choices were made on (empty where ``source`` made them)."""
    recipe_seeds: list[int]
    """The seeds of the runs at the recipe (the same-recipe protocol)."""
    confirm_seeds: list[int]
    """The seeds of the runs at the choices (the tuned protocol)."""
    label: str | None = None
    """What sets this sweep's tables apart from another's (say, its init)."""
    rule: Literal["best", "curve"] = "best"
    """How a value was chosen from the grid (``runners.runs.margins``)."""
    variants: list[str]
    """The variants chosen for."""
    recipe: dict[str, Settings]
    """Per domain, the recipe's value of each key."""
    chosen: dict[str, dict[str, Settings]]
    """Per domain and variant, the value chosen for each key."""
    margins: dict[str, dict[str, dict[str, float | int | str | bool | None]]] = {}
    """Per domain and variant, the choice's margin (``Margin.as_json``), for the reader."""
    source: str | None = Field(None, alias="from")
    """The other sweep's ``selection.json`` whose choices these are (``select: use:``), taken as they are."""

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(self.model_dump(by_alias=True, exclude_none=True), indent=1) + "\n")


def read_selection(path: Path) -> Selection:
    """A tuned protocol's choices, read as data (``common.files``) and validated: a file that is not one is a
    one-line ``ConfigError``, never a traceback."""
    spoilt = lambda why: ConfigError(f"{path}: not a selection file ({why}); delete it to choose again")
    try:
        found = read_json(path, "selection file", 16 * MiB)  # a few KiB when written
    except FileError as err:
        raise spoilt(f"unreadable: {err.reason}") from None
    if not isinstance(found, dict):
        raise spoilt("not a JSON object")
    try:
        return Selection.model_validate(found)
    except ValidationError as err:
        key, why, _ = first_problem(err)
        raise spoilt(f"{key} {why}") from None
