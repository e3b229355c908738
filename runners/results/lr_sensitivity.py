"""The analysis of a learning-rate sweep for ``quest stability``: each variant's learning-rate sensitivity
(Wortsman et al. 2023), where runs diverged, the peak attention logits, and their figures."""
from __future__ import annotations

import re
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from common.records import Trajectory, read_records
from runners.results.frame import GROUP, variant_order
from runners.results.plots import save_figure  # and the Agg backend

UNPROBED = Trajectory(step=[], layers={})  # the trajectory of a run whose probes never ran


def load_lr_runs(*roots: str | Path) -> pd.DataFrame:
    """One row per run with its learning rate, status, divergence step, initial and final loss, the final loss
    clipped (``clipped``: the initial loss where the run diverged, failed or ended above it), and the probe
    trajectory; records without losses (not from a run that trained) are left out."""
    records, _ = read_records(*roots)  # each damaged one logged as skipped
    rows = []
    for _, rec in records:
        losses = rec.losses or {}
        if "train_first" not in losses:
            continue
        final = losses.get("val_final", np.nan)
        rows.append({**{k: getattr(rec, k) for k in ("domain", "dataset", "preset", "variant", "seed", "status")},
                     "lr": float(rec.setting("optim.lr")), "initial": losses["train_first"], "final": final,
                     "diverged_step": rec.divergence.step if rec.divergence else None, "trajectory": rec.trajectory or UNPROBED})
    if not rows:
        raise FileNotFoundError(f"no records of trained runs under {', '.join(map(str, roots))}")
    runs = pd.DataFrame(rows)
    bad = (runs["status"] != "ok") | ~np.isfinite(runs["final"]) | (runs["final"] > runs["initial"])
    return runs.assign(clipped=runs["final"].where(~bad, runs["initial"]))


def lr_sensitivity(runs: pd.DataFrame) -> pd.DataFrame:
    """Per variant: the sensitivity of each seed over the learning rates it has, then mean and std over seeds."""
    per_seed = runs.groupby(["variant", "seed"])["clipped"].agg(lambda c: c.mean() - c.min())
    table = per_seed.groupby("variant").agg(["mean", "std", "count"])
    return table.rename(columns={"mean": "lr_sensitivity", "std": "spread", "count": "seeds"})


def divergence_summary(runs: pd.DataFrame) -> pd.Series:
    """Per variant: how many runs diverged, and at which learning rates ("lr: diverged/runs")."""
    out = {}
    for variant, group in runs.groupby("variant"):
        per_lr = group.groupby("lr")["status"].agg(lambda s: (s == "diverged").sum())
        totals = group.groupby("lr")["status"].size()
        where = ", ".join(f"{lr:.3g}: {n}/{totals[lr]}" for lr, n in per_lr.items() if n)
        out[variant] = f"{int(per_lr.sum())}/{len(group)}" + (f" ({where})" if where else "")
    return pd.Series(out)


def peak_logits(runs: pd.DataFrame, top: int = 2) -> pd.DataFrame:
    """Per variant (rows) and each of the ``top`` highest learning rates (columns): the largest attention
    logit any layer reached at any probe step, median over seeds."""
    lrs = sorted(runs["lr"].unique())[-top:]
    chosen = runs[runs["lr"].isin(lrs)]
    peak = chosen["trajectory"].map(lambda t: max((max(stats["max_logit"], default=np.nan)
                                                   for stats in t.layers.values()), default=np.nan))
    table = chosen.assign(peak=peak).groupby(["variant", "lr"])["peak"].median().unstack("lr")
    return table.reindex(variant_order(runs["variant"]))


def plot_final_loss(runs: pd.DataFrame, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(6, 4))
    for variant in variant_order(runs["variant"]):
        stats = runs[runs["variant"] == variant].groupby("lr")["clipped"].agg(["mean", "min", "max"])
        ax.plot(stats.index, stats["mean"], marker="o", label=variant)
        ax.fill_between(stats.index, stats["min"], stats["max"], alpha=0.15)
    ax.set(xscale="log", xlabel="learning rate", ylabel="final loss (clipped to the initial loss)")
    ax.legend(fontsize=7)
    save_figure(fig, path, dpi=120)


def plot_max_logits(runs: pd.DataFrame, path: Path) -> None:
    """Max attention logit over training, one line per layer, for each variant at the two highest learning
    rates (the first seed of each)."""
    lrs = sorted(runs["lr"].unique())[-2:]
    variants = variant_order(runs["variant"])
    fig, axes = plt.subplots(len(lrs), len(variants), figsize=(2.4 * len(variants), 2.2 * len(lrs)), squeeze=False,
                             sharey="row")
    for row, lr in enumerate(lrs):
        for col, variant in enumerate(variants):
            ax = axes[row][col]
            pick = runs[(runs["lr"] == lr) & (runs["variant"] == variant)].sort_values("seed")
            trajectory = pick.iloc[0]["trajectory"] if len(pick) else UNPROBED
            for layer, stats in trajectory.layers.items():
                ax.plot(trajectory.step, stats["max_logit"], lw=1, label=layer)
            ax.set_title(f"{variant}, lr {lr:.3g}", fontsize=8)
            ax.set_yscale("symlog")
            ax.tick_params(labelsize=6)
    axes[0][0].set_ylabel("max attention logit", fontsize=7)
    for ax in axes[-1]:
        ax.set_xlabel("training step", fontsize=7)
    if axes[0][0].get_lines():
        axes[0][0].legend(fontsize=5, title="layer", title_fontsize=5)
    save_figure(fig, path)


def section(runs: pd.DataFrame, figures: Path, link_root: Path) -> list[str]:
    """The markdown of one domain/dataset/preset: table, facts and figures."""
    domain, dataset, preset = (runs[k].iloc[0] for k in GROUP[:3])
    stem = re.sub(r"[^A-Za-z0-9_.-]", "-", f"stability_{domain}_{dataset}_{preset}")
    plot_final_loss(runs, figures / f"{stem}_final_loss.png")
    plot_max_logits(runs, figures / f"{stem}_max_logit.png")
    table = lr_sensitivity(runs).join(divergence_summary(runs).rename("diverged"))
    table = table.reindex(variant_order(runs["variant"]))
    lrs = sorted(runs["lr"].unique())
    lines = [f"## Stability: {domain} / {dataset} ({preset})", "",
             f"{len(runs)} runs: learning rates {', '.join(f'{lr:.3g}' for lr in lrs)} x "
             f"{runs['variant'].nunique()} variants x seeds {sorted(map(int, runs['seed'].unique()))}.", "",
             "| variant | LR sensitivity ↓ | spread (std over seeds) | seeds | diverged runs (lr: count) |",
             "|---|---|---|---|---|"]
    for variant, row in table.iterrows():
        spread = "–" if np.isnan(row["spread"]) else f"{row['spread']:.2g}"
        lines.append(f"| {variant} | {row['lr_sensitivity']:.4g} | {spread} | {int(row['seeds'])} | {row['diverged']} |")
    finals = runs.groupby(["variant", "lr"])["clipped"].median().unstack("lr")
    lines += ["", "Final loss (clipped to the initial loss; diverged runs count as it), median over seeds:", "",
              *_by_lr(finals.reindex(variant_order(runs["variant"]))),
              "", "Peak max attention logit over training (any layer, any probe step), median over seeds:", "",
              *_by_lr(peak_logits(runs))]
    rel = lambda name: (figures / name).relative_to(link_root).as_posix()  # noqa: E731
    lines += ["", f"![final loss vs learning rate]({rel(stem + '_final_loss.png')})",
              f"![max attention logit over training]({rel(stem + '_max_logit.png')})", ""]
    return lines


def _by_lr(table: pd.DataFrame) -> list[str]:
    """A markdown table of ``table`` (rows = variants, columns = learning rates)."""
    return ["| variant | " + " | ".join(f"lr {lr:.3g}" for lr in table.columns) + " |",
            "|---|" + "---|" * len(table.columns),
            *(f"| {variant} | " + " | ".join(f"{value:.3g}" for value in row) + " |" for variant, row in table.iterrows())]
