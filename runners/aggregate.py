"""`quest aggregate <runs dir> [-o RESULTS.md]`: run records -> markdown tables, CSV and plots.

Per domain, dataset and preset: rows = variants, columns = test metrics as mean ± std over runs, the number
of finished runs, diverged and failed counts, best value per column in bold (none where all variants tie);
then the difference of the primary metric to `standard` with a paired t-test over seeds, and that group's
plots. Across domains: each variant's primary metric per domain, its rank there (1 = best) and its mean rank.
A record that cannot be read or breaks the schema is skipped with a warning and listed at the end.
"""
from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from common.attention import VARIANTS
from common.records import read_records

LOWER_IS_BETTER = ("loss", "mse", "mae", "rmse", "err")
# Summary columns of `quest robustness` results (a record's "robustness" field) shown beside test metrics.
ROBUSTNESS = ("acc_fgsm_", "acc_pgd_", "acc_autoattack_", "acc_corruption_mean")
GROUP = ["domain", "dataset", "preset"]  # one table and one set of plots per group: runs of different sizes never mix
# Record fields copied into each run's row (in this order, for a stable CSV); with run_dir, not metrics.
RECORD_FIELDS = ("domain", "dataset", "variant", "seed", "preset", "status", "primary_metric", "mode")
IDENTITY = {*RECORD_FIELDS, "run_dir"}
# Means this close count as tied: equal results can differ in the last bits from the order of summation.
TIE_RTOL = 1e-9

log = logging.getLogger(__name__)


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
        rows.append(row)
    if not rows:
        raise FileNotFoundError(f"no readable run records under {', '.join(map(str, roots))} ({len(skipped)} skipped)")
    runs = pd.DataFrame(rows)
    runs.attrs["skipped"] = skipped
    return runs


def lower_is_better(metric: str, primary: str, mode: str) -> bool:
    if metric == primary:
        return mode == "min"
    return any(tag in metric for tag in LOWER_IS_BETTER)


def variant_order(variants) -> list[str]:
    return [v for v in VARIANTS if v in set(variants)] + sorted(set(variants) - set(VARIANTS))


def _fmt(mean: float, std: float) -> str:
    if np.isnan(mean):
        return "–"
    return f"{mean:.4g}" if np.isnan(std) else f"{mean:.4g} ± {std:.2g}"


def _bold_best(cells: list[str], means: pd.Series, lower: bool) -> list[str]:
    """``cells`` (one per variant of ``means``) with the best mean(s) in bold; none bold where every variant
    with a value ties, as there is nothing to tell apart."""
    values = means.dropna()
    best = values.min() if lower else values.max()
    winners = set(values.index[np.isclose(values, best, rtol=TIE_RTOL, atol=0)])
    if len(winners) == len(values):
        return cells
    return [f"**{cell}**" if variant in winners else cell for variant, cell in zip(means.index, cells)]


def domain_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Rows = variants of one domain/dataset; mean ± std of each metric over its finished runs."""
    primary, mode = runs["primary_metric"].iloc[0], runs["mode"].iloc[0]
    ok = runs[runs["status"] == "ok"]
    metrics = [c for c in runs.columns if c not in IDENTITY and runs[c].notna().any()]
    metrics = sorted(metrics, key=lambda m: (m != primary, m))
    variants = variant_order(runs["variant"])
    means = ok.groupby("variant")[metrics].mean().reindex(variants)
    stds = ok.groupby("variant")[metrics].std().reindex(variants)
    table = pd.DataFrame(index=variants)
    for m in metrics:
        lower = lower_is_better(m, primary, mode)
        cells = [_fmt(means.at[v, m], stds.at[v, m]) for v in variants]
        table[m + (" ↓" if lower else " ↑")] = _bold_best(cells, means[m], lower)
    table["runs"] = [int((ok["variant"] == v).sum()) for v in variants]
    table["diverged"] = [int(((runs["variant"] == v) & (runs["status"] == "diverged")).sum()) for v in variants]
    table["failed"] = [int(((runs["variant"] == v) & (runs["status"] == "failed")).sum()) for v in variants]
    table[f"Δ{primary} vs standard (p)"] = [paired_difference(ok, v, primary) for v in variants]
    table.index.name = "variant"
    return table


def paired_difference(ok: pd.DataFrame, variant: str, metric: str) -> str:
    """Mean difference to `standard` over runs paired by seed (each seed's runs averaged over any other
    swept settings; preset and dataset are fixed per table), with a two-sided paired t-test when there
    are >= 2 pairs."""
    if variant == "standard" or metric not in ok:
        return "–"
    a = ok[ok["variant"] == variant].groupby("seed")[metric].mean()
    b = ok[ok["variant"] == "standard"].groupby("seed")[metric].mean()
    pairs = pd.concat([a, b], axis=1, keys=["v", "s"]).dropna()
    if pairs.empty:
        return "–"
    diff = float((pairs["v"] - pairs["s"]).mean())
    if len(pairs) < 2 or np.allclose(pairs["v"], pairs["s"]):
        return f"{diff:+.3g} (n={len(pairs)})"
    p = stats.ttest_rel(pairs["v"], pairs["s"]).pvalue
    return f"{diff:+.3g} (p={p:.2g}, n={len(pairs)})"


def summary_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Rows = variants; per domain/dataset its primary metric (mean ± std) and the variant's rank."""
    variants = variant_order(runs["variant"])
    table = pd.DataFrame(index=variants)
    ranks = pd.DataFrame(index=variants)
    for (domain, dataset, preset), group in runs.groupby(GROUP, sort=True):
        primary, mode = group["primary_metric"].iloc[0], group["mode"].iloc[0]
        ok = group[group["status"] == "ok"]
        name = f"{domain}/{dataset} ({preset}) {primary} {'↓' if mode == 'min' else '↑'}"
        if primary in ok:
            mean, std = (ok.groupby("variant")[primary].agg(f).reindex(variants) for f in ("mean", "std"))
        else:
            mean = std = pd.Series(np.nan, index=variants)
        table[name] = [_fmt(mean[v], std[v]) for v in variants]
        ranks[name] = mean.rank(ascending=mode == "min", method="min")
        table[f"rank {domain}/{dataset} ({preset})"] = ranks[name].map(lambda r: "–" if np.isnan(r) else str(int(r)))
    table["mean rank"] = ranks.mean(axis=1).map(lambda r: "–" if np.isnan(r) else f"{r:.2f}")
    table.index.name = "variant"
    return table


def render(runs: pd.DataFrame, plots: dict[tuple[str, str, str], list[str]] | None = None,
           sources: list[str] | None = None, skipped: Sequence[tuple[str, str]] = ()) -> str:
    """RESULTS.md: ``plots`` maps a (domain, dataset, preset) group to its images; ``skipped`` lists
    (path, reason) of the records left out, in a footnote."""
    parts = ["# Results", "",
             f"Generated by `quest aggregate {' '.join(sources or [])}`: {len(runs)} run records aggregated, "
             f"{len(skipped)} skipped{' (listed at the end)' if skipped else ''}; do not edit by hand. Values are "
             "mean ± std over finished runs (seeds and any swept settings); best per column in bold (none where "
             "all variants tie); Δ vs standard is a paired t-test over seeds.", "",
             "## Across domains", "", summary_table(runs).to_markdown(), ""]
    for key, group in runs.groupby(GROUP, sort=True):
        parts += [f"## {' / '.join(key)}", "", f"{len(group)} runs.", "",
                  domain_table(group).to_markdown(), ""]
        if any(c.startswith(ROBUSTNESS) for c in group.columns if group[c].notna().any()):
            parts += ["Attacked accuracies (`acc_fgsm_*`, `acc_pgd_*`) of the elliptical variants may be optimistic: "
                      "their attention weights are computed without gradient, so white-box attacks see them as "
                      "constants (possible gradient masking).", ""]
        for plot in (plots or {}).get(key, []):
            parts += [f"![{Path(plot).stem}]({plot})", ""]
    if skipped:
        parts += ["---", "", "Skipped records (not aggregated):", "",
                  *(f"- `{path}`: {reason}" for path, reason in skipped), ""]
    return "\n".join(parts)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="quest aggregate", description=__doc__)
    parser.add_argument("runs", nargs="+", help="directories of runs (searched recursively for record.json)")
    parser.add_argument("-o", "--output", default="RESULTS.md", help="markdown file to write")
    parser.add_argument("--no-plots", action="store_true")
    args = parser.parse_args(argv)
    runs = load_runs(*args.runs)
    out = Path(args.output)
    extras = out.parent / out.stem  # RESULTS.md -> RESULTS/ for the CSV and the plots
    extras.mkdir(parents=True, exist_ok=True)
    plots = {}
    if not args.no_plots:
        from runners.plots import write_plots

        plots = write_plots(runs, extras, relative_to=out.parent)
    skipped = runs.attrs["skipped"]
    out.write_text(render(runs, plots, args.runs, skipped))
    runs.to_csv(extras / "runs.csv", index=False)
    print(f"aggregate: {len(runs)} runs, {len(skipped)} skipped -> {out}, {extras / 'runs.csv'}")
    return 0
