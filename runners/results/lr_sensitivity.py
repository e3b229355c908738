"""The analysis of a learning-rate sweep for ``quest stability``: each variant's learning-rate sensitivity
(Wortsman et al. 2023) with its interval over seeds, where runs diverged, the peak attention logits and query norms,
and their figures; one section per setting the sweep varies beside the rate (a model's width), each a panel."""
from __future__ import annotations

import re
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from common.records import Trajectory, read_records
from runners.results.frame import GROUP, variant_order
from runners.results.plots import save_figure  # and the Agg backend
from runners.results.stats import estimate, half_width
from runners.runs.selection import settings, varying_keys

UNPROBED = Trajectory(step=[], layers={})  # the trajectory of a run whose probes never ran


def load_lr_runs(*roots: str | Path) -> pd.DataFrame:
    """One row per run with its learning rate, status, divergence step, initial and final loss, the final loss
    clipped (``clipped``: the initial loss where the run diverged, failed or ended above it), and the probe
    trajectory; records without losses (not from a run that trained) are left out."""
    records, _ = read_records(*roots)  # each damaged one logged as skipped
    rows, configs = [], []
    for _, rec in records:
        losses = rec.losses or {}
        if "train_first" not in losses:
            continue
        final = losses.get("val_final", np.nan)
        trajectory = rec.trajectory or UNPROBED
        rows.append({**{k: getattr(rec, k) for k in ("domain", "dataset", "preset", "variant", "seed", "status")},
                     "lr": float(rec.setting("optim.lr")), "initial": losses["train_first"], "final": final,
                     "diverged_step": rec.divergence.step if rec.divergence else None, "trajectory": trajectory,
                     **{column: rec.probes.get(f"peak_{stat}", _peak(trajectory, stat)) for column, stat in PEAKS.items()}})
        configs.append({k: v for k, v in settings(rec.config).items() if k != "optim.lr"})
    if not rows:
        raise FileNotFoundError(f"no records of trained runs under {', '.join(map(str, roots))}")
    runs = pd.DataFrame(rows)
    runs["setting"] = _varying_settings(runs, configs)
    bad = (runs["status"] != "ok") | ~np.isfinite(runs["final"]) | (runs["final"] > runs["initial"])
    return runs.assign(clipped=runs["final"].where(~bad, runs["initial"]))


# How far above its best a variant's final loss must end for a rate to count as where it breaks: plan 4's exploratory
# reading of Wortsman et al.'s finding that standard attention breaks at lower rates as width grows (nats).
BREAK_MARGIN = 0.1
PEAKS = {"peak_logit": "max_logit", "peak_q_norm": "q_norm_max"}  # column -> the probe whose peak over training it is


def _peak(trajectory: Trajectory, stat: str) -> float:
    """The largest ``stat`` any layer reached at any kept probe step (a record written before runs kept their peaks)."""
    return max((max(stats[stat], default=np.nan) for stats in trajectory.layers.values() if stat in stats), default=np.nan)


def _varying_settings(runs: pd.DataFrame, settings: list[dict]) -> list[str]:
    """Per run, the settings that vary within its domain, dataset and preset besides the rate (and the variant), as
    ``key=value`` (a width: ``model.dim=128``); empty where nothing else varies."""
    labels = [""] * len(runs)
    for _, group in runs.groupby(GROUP[:3]):
        at = list(group.index)
        varying = [k for k in varying_keys([settings[i] for i in at]) if k != "attention.variant"]
        for i in at:
            labels[i] = ", ".join(f"{k}={settings[i].get(k)}" for k in varying)
    return labels


def lr_sensitivity(runs: pd.DataFrame) -> pd.DataFrame:
    """Per variant: the sensitivity of each seed with a finished run (ok or diverged) at every learning rate of the
    sweep, as the confirmatory endpoint counts a seed (``runners.results.endpoints``: a seed short of a rate, or with
    a run that failed, would be read over other rates), then mean, std and the half-width of the mean's 95%
    t-interval over seeds."""
    finished = runs[runs["status"].isin(["ok", "diverged"])]
    whole = finished.groupby(["variant", "seed"])["lr"].transform("nunique") == runs["lr"].nunique()
    per_seed = finished[whole].groupby(["variant", "seed"])["clipped"].agg(lambda c: c.mean() - c.min())
    table = per_seed.groupby("variant").agg(["mean", "std", "count"]).reindex(runs["variant"].unique())
    table["count"] = table["count"].fillna(0)
    table["half"] = per_seed.groupby("variant").agg(half_width)
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


def breaking_rates(runs: pd.DataFrame, margin: float = BREAK_MARGIN) -> pd.Series:
    """Per variant: the first rate above its best at which its final loss (clipped, median over seeds) ends more than
    ``margin`` above the best, and the best rate: "0.03 (best 0.003)"; "–" where no rate does."""
    out = {}
    for variant, losses in by_rate(runs, "clipped").iterrows():
        losses = losses.dropna()
        if losses.empty:
            out[variant] = "–"
            continue
        best = losses.idxmin()
        above = losses[(losses.index > best) & (losses > losses[best] + margin)]
        out[variant] = (f"{above.index[0]:.3g}" if len(above) else "–") + f" (best {best:.3g})"
    return pd.Series(out)


def by_rate(runs: pd.DataFrame, column: str) -> pd.DataFrame:
    """Per variant (rows) and learning rate (columns): ``column``'s median over seeds."""
    table = runs.groupby(["variant", "lr"])[column].median().unstack("lr")
    return table.reindex(variant_order(runs["variant"]))


def plot_against_rate(panels: dict[str, pd.DataFrame], column: str, label: str, path: Path, log: bool = False) -> None:
    """``column`` against the learning rate, a line per variant (the mean over seeds) in a band (their range), a
    panel per setting the sweep varies (a width)."""
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.4), squeeze=False, sharey=True)
    values = pd.concat([runs[column] for runs in panels.values()]).dropna()
    yscale = ("log" if len(values) and (values > 0).all() else "symlog") if log else "linear"  # symlog: a value <= 0, or none
    for ax, (title, runs) in zip(axes[0], panels.items()):
        for variant in variant_order(runs["variant"]):
            stats = runs[runs["variant"] == variant].groupby("lr")[column].agg(["mean", "min", "max"])
            ax.plot(stats.index, stats["mean"], marker="o", ms=3, label=variant)
            ax.fill_between(stats.index, stats["min"], stats["max"], alpha=0.15)
        ax.set_xlim(runs["lr"].min() / 1.5, runs["lr"].max() * 1.5)  # where no value is finite (no probes), still an axis
        ax.set(xscale="log", yscale=yscale, xlabel="learning rate", title=title or None)
        ax.title.set_fontsize(8)
    axes[0][0].set_ylabel(f"{label}\nmean; band: min to max over seeds", fontsize=7)
    axes[0][-1].legend(fontsize=7)
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
    """The markdown of one domain/dataset/preset: per setting it varies beside the rate (a width), the table and
    facts; then its figures, a panel per setting."""
    domain, dataset, preset = (runs[k].iloc[0] for k in GROUP[:3])
    stem = re.sub(r"[^A-Za-z0-9_.-]", "-", f"stability_{domain}_{dataset}_{preset}")
    panels = {setting: runs[runs["setting"] == setting] for setting in sorted(runs["setting"].unique(), key=_in_order)}
    plots = {"final_loss": ("clipped", "final loss (clipped to the initial loss)", False),
             "peak_logit": ("peak_logit", "peak attention logit over training", True),
             "peak_q_norm": ("peak_q_norm", "peak query norm over training", True)}
    for name, (column, label, log) in plots.items():
        plot_against_rate(panels, column, label, figures / f"{stem}_{name}.png", log)
    plot_max_logits(runs[runs["setting"] == next(iter(panels))], figures / f"{stem}_max_logit.png")
    lines = [f"## Stability: {domain} / {dataset} ({preset})", ""]
    if len(panels) > 1:  # a width grid: does the rate where a variant breaks fall as the width grows?
        breaks = pd.DataFrame({setting: breaking_rates(group) for setting, group in panels.items()})
        lines += [f"Where each variant's final loss first ends more than {BREAK_MARGIN:g} above its best (the rate; its "
                  "best in brackets), median over seeds, by setting:", "",
                  "| variant | " + " | ".join(panels) + " |", "|---|" + "---|" * len(panels),
                  *(f"| {variant} | " + " | ".join(row.fillna("–")) + " |"
                    for variant, row in breaks.reindex(variant_order(runs["variant"])).iterrows()), ""]
    for setting, group in panels.items():
        lines += _setting_lines(group, setting)
    rel = lambda name: (figures / name).relative_to(link_root).as_posix()  # noqa: E731
    lines += [f"![{label} against the learning rate]({rel(f'{stem}_{name}.png')})" for name, (_, label, _) in plots.items()]
    lines += [f"![max attention logit over training{f' ({next(iter(panels))})' if next(iter(panels)) else ''}]"
              f"({rel(stem + '_max_logit.png')})", ""]
    return lines


def _in_order(setting: str) -> list[tuple[int, float | str]]:
    """A ``key=value, ...`` label's sort key: numbers by value (width 64 before 128), other values as text."""
    def value(text: str) -> tuple[int, float | str]:
        try:
            return 0, float(text)
        except ValueError:
            return 1, text
    return [value(part.partition("=")[2]) for part in setting.split(", ")]


def _setting_lines(runs: pd.DataFrame, setting: str) -> list[str]:
    table = lr_sensitivity(runs).join(divergence_summary(runs).rename("diverged")).join(breaking_rates(runs).rename("breaks"))
    table = table.reindex(variant_order(runs["variant"]))
    lrs = sorted(runs["lr"].unique())
    lines = [*([f"### {setting}", ""] if setting else []),
             f"{len(runs)} runs: learning rates {', '.join(f'{lr:.3g}' for lr in lrs)} x "
             f"{runs['variant'].nunique()} variants x seeds {sorted(map(int, runs['seed'].unique()))}.", "",
             "A seed's LR sensitivity counts where it has a finished run at every rate.", "",
             "| variant | LR sensitivity ↓ (± 95%) | spread (std over seeds) | seeds | diverged runs (lr: count) | "
             f"ends > {BREAK_MARGIN:g} above its best at lr (best lr) |",
             "|---|---|---|---|---|---|"]
    for variant, row in table.iterrows():
        sensitivity, spread = estimate(row["lr_sensitivity"], half=row["half"]), estimate(row["spread"], ".2g")
        lines.append(f"| {variant} | {sensitivity} | {spread} | {int(row['seeds'])} | {row['diverged']} | "
                     f"{row['breaks']} |")
    lines += ["", "Final loss (clipped to the initial loss; diverged runs count as it), median over seeds:", "",
              *_by_lr(by_rate(runs, "clipped")),
              "", "Peak max attention logit over training (any layer, any probe step), median over seeds:", "",
              *_by_lr(by_rate(runs, "peak_logit")),
              "", "Peak query norm over training (any layer, any probe step), median over seeds:", "",
              *_by_lr(by_rate(runs, "peak_q_norm")), ""]
    return lines


def _by_lr(table: pd.DataFrame) -> list[str]:
    """A markdown table of ``table`` (rows = variants, columns = learning rates)."""
    return ["| variant | " + " | ".join(f"lr {lr:.3g}" for lr in table.columns) + " |",
            "|---|" + "---|" * len(table.columns),
            *(f"| {variant} | " + " | ".join(f"{value:.3g}" for value in row) + " |" for variant, row in table.iterrows())]
