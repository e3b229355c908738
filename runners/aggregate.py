"""`quest aggregate <runs dir> [-o RESULTS.md]`: run records -> markdown tables, CSV and plots.

Per domain, dataset and preset: rows = variants, columns = test metrics as mean ± std over runs, the number
of finished runs, diverged and failed counts, best value per column in bold; then the difference of
the primary metric to `standard` with a paired t-test over seeds. Across domains: each variant's
primary metric per domain, its rank there (1 = best) and its mean rank.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from common.attention import VARIANTS
from common.records import RecordError, find_records, read_record

LOWER_IS_BETTER = ("loss", "mse", "mae", "rmse", "err")
# Summary columns of `quest robustness` results (a record's "robustness" field) shown beside test metrics.
ROBUSTNESS = ("acc_fgsm_", "acc_pgd_", "acc_autoattack_", "acc_corruption_mean")
GROUP = ["domain", "dataset", "preset"]  # one table per group: runs of different sizes never mix


def load_runs(*roots: str | Path) -> pd.DataFrame:
    """One row per run under any of ``roots``: identity columns plus every test metric. Malformed
    records are reported and skipped."""
    rows = []
    for path in (p for root in roots for p in find_records(root)):
        try:
            rec = read_record(path)
        except RecordError as err:
            print(f"aggregate: skipping {err}", file=sys.stderr)
            continue
        row = {k: rec[k] for k in ("domain", "dataset", "variant", "seed", "preset", "status", "primary_metric", "mode")}
        row["run_dir"] = str(path.parent)
        row.update({k.removeprefix("test/"): v for k, v in rec["metrics"].items()})
        row.update({k: v for k, v in rec.get("robustness", {}).items() if k.startswith(ROBUSTNESS)})
        rows.append(row)
    if not rows:
        raise FileNotFoundError(f"no run records under {', '.join(map(str, roots))}")
    return pd.DataFrame(rows)


def lower_is_better(metric: str, primary: str, mode: str) -> bool:
    if metric == primary:
        return mode == "min"
    return any(tag in metric for tag in LOWER_IS_BETTER)


def _order(variants) -> list[str]:
    return [v for v in VARIANTS if v in set(variants)] + sorted(set(variants) - set(VARIANTS))


def _fmt(mean: float, std: float) -> str:
    if np.isnan(mean):
        return "–"
    return f"{mean:.4g}" if np.isnan(std) else f"{mean:.4g} ± {std:.2g}"


def domain_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Rows = variants of one domain/dataset; mean ± std of each metric over its finished runs."""
    primary, mode = runs["primary_metric"].iloc[0], runs["mode"].iloc[0]
    ok = runs[runs["status"] == "ok"]
    metrics = [c for c in runs.columns if c not in IDENTITY and runs[c].notna().any()]
    metrics = sorted(metrics, key=lambda m: (m != primary, m))
    variants = _order(runs["variant"])
    means = ok.groupby("variant")[metrics].mean().reindex(variants)
    stds = ok.groupby("variant")[metrics].std().reindex(variants)
    table = pd.DataFrame(index=variants)
    for m in metrics:
        cells = [_fmt(means.at[v, m], stds.at[v, m]) for v in variants]
        col = means[m]
        if col.notna().any():
            best = col.idxmin() if lower_is_better(m, primary, mode) else col.idxmax()
            cells[variants.index(best)] = f"**{cells[variants.index(best)]}**"
        table[m + (" ↓" if lower_is_better(m, primary, mode) else " ↑")] = cells
    table["runs"] = [int((ok["variant"] == v).sum()) for v in variants]
    table["diverged"] = [int(((runs["variant"] == v) & (runs["status"] == "diverged")).sum()) for v in variants]
    table["failed"] = [int(((runs["variant"] == v) & (runs["status"] == "failed")).sum()) for v in variants]
    table[f"Δ{primary} vs standard (p)"] = [paired_difference(ok, v, primary) for v in variants]
    table.index.name = "variant"
    return table


IDENTITY = {"domain", "dataset", "variant", "seed", "preset", "status", "primary_metric", "mode", "run_dir"}


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
    variants = _order(runs["variant"])
    table = pd.DataFrame(index=variants)
    ranks = pd.DataFrame(index=variants)
    for (domain, dataset, preset), group in runs.groupby(GROUP, sort=True):
        primary, mode = group["primary_metric"].iloc[0], group["mode"].iloc[0]
        ok = group[group["status"] == "ok"]
        name = f"{domain}/{dataset} ({preset}) {primary} {'↓' if mode == 'min' else '↑'}"
        mean = ok.groupby("variant")[primary].mean().reindex(variants) if primary in ok else pd.Series(np.nan, index=variants)
        std = ok.groupby("variant")[primary].std().reindex(variants) if primary in ok else mean
        table[name] = [_fmt(mean[v], std[v]) for v in variants]
        ranks[name] = mean.rank(ascending=mode == "min", method="min")
        table[f"rank {domain} ({preset})"] = ranks[name].map(lambda r: "–" if np.isnan(r) else str(int(r)))
    table["mean rank"] = ranks.mean(axis=1).map(lambda r: "–" if np.isnan(r) else f"{r:.2f}")
    table.index.name = "variant"
    return table


def render(runs: pd.DataFrame, plots: dict[tuple[str, str], list[str]] | None = None,
           sources: list[str] | None = None) -> str:
    parts = ["# Results", "",
             f"Generated by `quest aggregate {' '.join(sources or [])}` from {len(runs)} run records; do not edit "
             "by hand. Values are mean ± std "
             "over finished runs (seeds and any swept settings); best per column in bold; Δ vs standard is a "
             "paired t-test over seeds.", "",
             "## Across domains", "", summary_table(runs).to_markdown(), ""]
    for (domain, dataset, preset), group in runs.groupby(GROUP, sort=True):
        parts += [f"## {domain} / {dataset} / {preset}", "", f"{len(group)} runs.", "",
                  domain_table(group).to_markdown(), ""]
        if any(c.startswith(ROBUSTNESS) for c in group.columns if group[c].notna().any()):
            parts += ["Attacked accuracies (`acc_fgsm_*`, `acc_pgd_*`) of the elliptical variants may be optimistic: "
                      "their attention weights are computed without gradient, so white-box attacks see them as "
                      "constants (possible gradient masking).", ""]
        for plot in (plots or {}).get((domain, preset), []):
            parts += [f"![{Path(plot).stem}]({plot})", ""]
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
    out.write_text(render(runs, plots, args.runs))
    runs.to_csv(extras / "runs.csv", index=False)
    print(f"aggregate: {len(runs)} runs -> {out}, {extras / 'runs.csv'}")
    return 0
