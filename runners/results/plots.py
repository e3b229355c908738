"""Figures for RESULTS.md, per (domain, dataset, preset) group as the tables are and per tuned domain, and
``save_figure`` (``common.figures``) for every figure of ``runners.results``. Importing it selects matplotlib's Agg backend (files only)."""
from __future__ import annotations

import logging
import math
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from common.figures import save_figure  # noqa: E402
from common.files import MAX_TRAINING_LOG_BYTES, FileError, read_table  # noqa: E402
from runners.results.frame import GROUP, repeats, variant_order  # noqa: E402
from runners.results.stats import half_width  # noqa: E402
from runners.results.tables import short_name  # noqa: E402
from runners.runs.margins import Grid, Margin  # noqa: E402

log = logging.getLogger(__name__)


def _probe_curves(runs: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """stat -> DataFrame indexed by step, one column per variant (mean over its runs); a run whose training log
    (``metrics.csv``) cannot be read is left out with a warning naming it."""
    frames = []
    for run in runs.itertuples():
        path = Path(run.run_dir) / "metrics.csv"
        if not path.exists():
            continue
        try:
            table = read_table(path, "training log", MAX_TRAINING_LOG_BYTES)
        except FileError as err:
            log.warning("leaving a run out of the probe plots: %s", err)
            continue
        cols = [c for c in table.columns if str(c).startswith("probe/") and str(c).count("/") == 1]
        if cols and "step" in table:
            numbers = table[["step"] + cols].apply(pd.to_numeric, errors="coerce")  # a damaged cell is left out
            long = numbers.melt("step", var_name="stat").dropna()
            frames.append(long.assign(variant=run.variant))
    if not frames:
        return {}
    samples = pd.concat(frames)
    samples["stat"] = samples["stat"].str.removeprefix("probe/")
    return {stat: g.pivot_table(index="step", columns="variant", values="value", aggfunc="mean")
            for stat, g in samples.groupby("stat")}


def write_plots(runs: pd.DataFrame, folder: Path, relative_to: Path) -> dict[tuple[str, ...], list[str]]:
    """Write PNGs per (domain, dataset, preset) group, named after it; returns group -> paths relative to
    ``relative_to`` for linking."""
    folder.mkdir(parents=True, exist_ok=True)
    written: dict[tuple[str, ...], list[str]] = {}
    repeated = repeats(runs)
    for key, group in runs.groupby(GROUP):
        if key in repeated:  # its table points to the earlier one
            continue
        # A dataset name may be a path or hold other characters a file name should not.
        stem = folder / re.sub(r"[^\w.-]+", "-", "_".join(part for part in key if part))
        title = short_name(key)
        paths = [p for p in (_metric_bars(group, stem, title), _probe_grid(group, stem, title)) if p]
        written[key] = [str(p.relative_to(relative_to)) for p in paths]
    return written


def _metric_bars(group: pd.DataFrame, stem: Path, title: str) -> Path | None:
    """Bar chart of the group's primary metric per variant (mean and its 95% t-interval over finished runs, as the
    tables give them), if any."""
    primary, mode = group["primary_metric"].iloc[0], group["mode"].iloc[0]
    ok = group[group["status"] == "ok"]
    if primary not in ok or ok[primary].isna().all():
        return None
    stats = ok.groupby("variant")[primary].agg(["mean", half_width]).reindex(variant_order(ok["variant"]))
    fig, ax = plt.subplots(figsize=(7, 3.2))
    ax.bar(stats.index, stats["mean"], yerr=stats["half_width"].fillna(0), capsize=3, color="tab:blue")
    ax.set_ylabel(f"test {primary}, mean ± 95% CI\n({'lower' if mode == 'min' else 'higher'} is better)", fontsize=8)
    ax.set_title(f"{title}: {primary} per variant")
    ax.tick_params(axis="x", rotation=30)
    return save_figure(fig, stem.with_name(f"{stem.name}_{primary}.png"))


def _probe_grid(group: pd.DataFrame, stem: Path, title: str) -> Path | None:
    """One panel per probe statistic, one curve per variant, if the group's runs logged probes."""
    curves = _probe_curves(group)
    if not curves:
        return None
    cols = min(4, len(curves))
    rows = -(-len(curves) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 2.9 * rows), squeeze=False)
    for ax in axes.flat[len(curves):]:
        ax.axis("off")
    for ax, (stat, table) in zip(axes.flat, sorted(curves.items())):
        for variant in variant_order(table.columns):
            ax.plot(table.index, table[variant], label=variant, lw=1.2)
        ax.set_title(stat, fontsize=9)
        ax.set_xlabel("step")
        if "norm" in stat or "logit" in stat:
            ax.set_yscale("symlog")
    axes.flat[len(curves) - 1].legend(fontsize=7, loc="best")
    fig.suptitle(f"{title}: stability probes over training", fontsize=10)
    return save_figure(fig, stem.with_name(f"{stem.name}_probes.png"))


def plot_selection(grids: dict[str, Grid], margins: dict[str, Margin], chosen: dict[str, float], *, key: str,
                   metric: str, sign: int, title: str, path: Path) -> Path:
    """A tuned domain's figure: each variant's mean validation score against the scaled setting (a learning rate),
    with its 95% interval over the selection seeds and its best value starred (``runners.runs.margins``), the value
    it was given dotted where that differs. ``grids`` and ``margins`` per variant (scores signed higher-better;
    ``sign`` turns them back into the metric's units), ``chosen`` the value each variant was given."""
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for variant, grid in grids.items():
        values = sorted(grid)
        scores = [np.array([s for s in grid[v].values() if math.isfinite(s)]) * sign for v in values]
        mean = np.array([s.mean() if len(s) else np.nan for s in scores])
        half = np.nan_to_num([half_width(pd.Series(s)) for s in scores])  # no bar below two finished runs
        line = ax.errorbar(values, mean, yerr=half, marker="o", capsize=3, label=variant)
        colour = line[0].get_color()
        best = margins[variant].best
        ax.plot([best], [mean[values.index(best)]], marker="*", markersize=14, color=colour)
        if chosen.get(variant) is not None and chosen[variant] != best:
            ax.axvline(chosen[variant], color=colour, linestyle=":", linewidth=1)
    ax.set_xscale("log")
    ax.set_xlabel(key)
    ax.set_ylabel(f"validation {metric} (mean, 95% CI over seeds)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    return save_figure(fig, path)
