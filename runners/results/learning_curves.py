"""Learning curves across training length and width (``quest scaling``), from runs that kept snapshots and tested
them (``runners.runs.snapshot_tests``)."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from common.records import RunRecord, read_records
from runners.results.frame import variant_order
from runners.results.plots import save_figure  # and the Agg backend
from runners.results.stats import detectable, estimate, half_width, paired_p

PROBES = ("max_logit", "q_norm_max", "k_norm_max")


def _curved_runs(roots) -> Iterator[tuple[RunRecord, dict]]:
    """Each finished run with a tested curve, and its identity: domain, width (``model.dim``), variant, seed."""
    records, _ = read_records(*roots)
    for _, rec in records:
        if rec.status == "ok" and rec.curve:
            yield rec, {"domain": rec.domain, "width": rec.setting("model.dim"), "variant": rec.variant, "seed": rec.seed}


def curve_points(*roots: str | Path) -> pd.DataFrame:
    """One row per (run, snapshot): the run's identity, step, fraction, the primary metric's name and direction,
    and every test and robustness metric of that snapshot."""
    rows = [{**run, "step": point.step, "fraction": point.fraction, "primary": rec.primary_metric, "mode": rec.mode,
             **{k.removeprefix("test/"): v for k, v in point.metrics.items()}, **(point.robustness or {})}
            for rec, run in _curved_runs(roots) for point in rec.curve]
    if not rows:
        raise FileNotFoundError(f"no run under {', '.join(map(str, roots))} has a tested curve (quest curve)")
    return pd.DataFrame(rows)


def probe_points(*roots: str | Path) -> pd.DataFrame:
    """One row per (run, probe step): the run's identity, step and the cross-layer ``PROBES`` (max over layers)."""
    rows = []
    for rec, run in _curved_runs(roots):
        if rec.trajectory is None:
            continue
        layers = rec.trajectory.layers.values()
        for i, step in enumerate(rec.trajectory.step):
            maxima = {stat: max((layer[stat][i] for layer in layers if stat in layer), default=np.nan) for stat in PROBES}
            rows.append({**run, "step": step, **maxima})
    return pd.DataFrame(rows)


def _to_standard(group: pd.DataFrame, metric: str) -> dict[str, pd.Series]:
    """Per variant of one cell (domain, width, step), its ``metric`` less `standard`'s, per seed run by both,
    signed so that positive is better."""
    lower = group["mode"].iloc[0] == "min" if metric == group["primary"].iloc[0] else not metric.startswith("acc")
    sign = -1.0 if lower else 1.0
    base = group[group["variant"] == "standard"].set_index("seed")[metric]
    return {variant: sign * (group[group["variant"] == variant].set_index("seed")[metric] - base).dropna()
            for variant in variant_order(group["variant"]) if variant != "standard"}


def _tested(diff: pd.Series) -> dict:
    """Mean of paired differences, its 95% half-width, p (uncorrected: exploratory) and minimum detectable effect."""
    return {"n": len(diff), "diff": diff.mean(), "half": half_width(diff), "p": paired_p(diff),
            "mde": detectable(diff.std(), len(diff))}


def differences(points: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Per domain, width, step and variant: the paired difference to `standard` on ``metric``, signed so that
    positive is better (``_tested``)."""
    return pd.DataFrame([{"domain": domain, "width": width, "step": step, "variant": variant, **_tested(diff)}
                         for (domain, width, step), group in points.groupby(["domain", "width", "step"])
                         for variant, diff in _to_standard(group, metric).items()])


def width_changes(points: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Whether a variant's difference to `standard` depends on width (the width × variant interaction): per domain,
    step, variant and pair of consecutive widths, the paired difference at the wider less the one at the narrower,
    per seed run at both, tested over those seeds (``_tested``; positive: the variant gains on `standard` with width)."""
    rows = []
    for (domain, step), group in points.groupby(["domain", "step"]):
        widths = sorted(group["width"].unique())
        for narrow, wide in zip(widths, widths[1:]):
            before = _to_standard(group[group["width"] == narrow], metric)
            after = _to_standard(group[group["width"] == wide], metric)
            for variant in [v for v in after if v in before]:
                change = (after[variant] - before[variant]).dropna()
                rows.append({"domain": domain, "widths": f"{narrow} → {wide}", "step": step, "variant": variant,
                             **_tested(change)})
    return pd.DataFrame(rows)


def _cell(row: pd.Series) -> str:
    tested = "" if np.isnan(row["diff"]) or np.isnan(row["p"]) else f" (p={row['p']:.2g}, MDE {estimate(row['mde'], '.2g')})"
    return estimate(row["diff"], "+.3g", row["half"]) + tested


def delta_table(points: pd.DataFrame, metric: str, by: str = "width") -> str:
    """Markdown: rows = width (``by="width"``: ``differences``) or pair of widths (``by="widths"``:
    ``width_changes``) and training steps, columns = variants, cells = the paired difference (+ is better)."""
    table = (differences if by == "width" else width_changes)(points, metric)
    if table.empty:
        return ""
    cells = table.assign(cell=table.apply(_cell, axis=1)).pivot_table(
        index=[by, "step"], columns="variant", values="cell", aggfunc="first")
    cells = cells[variant_order(cells.columns)].fillna("–").reset_index()
    return cells.to_markdown(index=False, disable_numparse=True)  # "+0.02" stays as written


def probe_table(probes: pd.DataFrame, domain: str) -> str:
    """Markdown: per width and variant, each probe's peak (the largest over training and seeds) and its value at
    the last probed step (the largest over seeds): whether normalised keys keep query norms and logits bounded
    at each size."""
    mine = probes[probes["domain"] == domain]
    if mine.empty:
        return ""
    last = mine[mine["step"] == mine.groupby(["width", "variant", "seed"])["step"].transform("max")]
    peak = mine.groupby(["width", "variant"])[list(PROBES)].max()
    end = last.groupby(["width", "variant"])[list(PROBES)].max()
    table = pd.concat({"peak": peak, "end": end}, axis=1).swaplevel(axis=1)[[(p, w) for p in PROBES for w in ("peak", "end")]]
    table.columns = [f"{probe} {when}" for probe, when in table.columns]
    table = table.reset_index()
    table["order"] = table["variant"].map({v: i for i, v in enumerate(variant_order(table["variant"]))})
    table = table.sort_values(["width", "order"]).drop(columns="order")
    return table.to_markdown(index=False, floatfmt=".3g")


def _band(by_step, column: str) -> tuple[pd.Series, pd.Series, pd.Series]:
    """Lower edge, mean and upper edge of one variant's band. A probe's band is the range over seeds: whether a
    quantity stays bounded is a claim about the worst seed. A metric's band is the 95% interval of its mean, cut
    to [0, 1] for accuracies (a t-interval over three seeds can pass both ends)."""
    if column in PROBES:
        return by_step.min(), by_step.mean(), by_step.max()
    stats = by_step.agg(["mean", half_width])
    half = stats["half_width"].fillna(0)
    low, high = stats["mean"] - half, stats["mean"] + half
    if column.startswith("acc"):
        low, high = low.clip(0, 1), high.clip(0, 1)
    return low, stats["mean"], high


def plot_curves(points: pd.DataFrame, probes: pd.DataFrame, domain: str, metrics: list[str], out: Path) -> Path:
    """One row of panels per width: each metric (and each probe) against steps, one line per variant with its
    band over seeds (``_band``)."""
    widths = sorted(points["width"].unique())
    columns = [*metrics, *PROBES]
    fig, axes = plt.subplots(len(widths), len(columns), figsize=(3.4 * len(columns), 2.8 * len(widths)), squeeze=False)
    for r, width in enumerate(widths):
        for c, column in enumerate(columns):
            ax, source = axes[r, c], points if column in metrics else probes
            panel = source[(source["domain"] == domain) & (source["width"] == width)] if len(source) else source
            for variant in variant_order(panel["variant"]) if len(panel) else []:
                low, mean, high = _band(panel[panel["variant"] == variant].groupby("step")[column], column)
                ax.plot(mean.index, mean, marker="o" if column in metrics else None, ms=3, label=variant)
                ax.fill_between(mean.index, low, high, alpha=0.15)
            ax.set_title(f"width {width}: {column}", fontsize=9)
            ax.set_xlabel("step")
            if column in PROBES:
                ax.set_yscale("log")
            else:  # the lengths double from one snapshot to the next
                ax.set_xscale("log", base=2)
    axes[0, -1].legend(fontsize=7)
    return save_figure(fig, out)


def _count(counts: pd.Series) -> str:
    """"3" when every group counts the same, else the range, "2–3"."""
    return str(counts.min()) if counts.min() == counts.max() else f"{counts.min()}–{counts.max()}"


def report(*roots: str | Path, out: Path) -> str:
    """The scaling report's markdown (figures beside ``out``)."""
    points, probes = curve_points(*roots), probe_points(*roots)
    lines = ["# Scaling: training length and width", "",
             f"From `quest scaling {' '.join(map(str, roots))}`. Each run kept its weights at fixed fractions of "
             "training; each snapshot was tested (`quest curve`), so one run gives every length up to its own. A "
             "snapshot has not had the end of its own learning-rate schedule: an early point is a partly trained "
             "model at a high learning rate, not a shorter run. Δ vs standard is paired by seed, positive is "
             "better, p uncorrected (exploratory), MDE the smallest difference the seeds detect at 80% power.", ""]
    for domain, group in points.groupby("domain"):
        primary = group["primary"].iloc[0]
        robust = [m for m in ("acc_corruption_mean", *sorted(c for c in group if c.startswith("acc_pgd_")))
                  if m in group and group[m].notna().any()]
        figure = plot_curves(points, probes, domain, [primary, *robust], out.parent / f"scaling_{domain}.png")
        seeds = group.groupby(["width", "variant"])["seed"].nunique()
        lines += [f"## Scaling: {domain}", "",
                  f"Widths {', '.join(map(str, sorted(group['width'].unique())))}; "
                  f"{_count(seeds)} seeds per variant and width; snapshots at steps "
                  f"{', '.join(map(str, sorted(group['step'].unique())))}.", "",
                  f"![scaling {domain}]({figure.name})", ""]
        for metric in [primary, *robust]:
            lines += [f"Δ{metric} vs standard (+ is better):", "", delta_table(group, metric), ""]
        if group["width"].nunique() > 1:
            for metric in [primary, *robust]:
                lines += [f"Width × variant, Δ{metric} vs standard: its change from one width to the next, per seed run at "
                          "both, paired t-test over those seeds (+: the variant gains on standard with width; p "
                          "uncorrected, exploratory):", "", delta_table(group, metric, by="widths"), ""]
        probed = probe_table(probes, domain)
        if probed:
            steps = probes[probes["domain"] == domain].groupby(["width", "variant", "seed"])["step"].nunique()
            lines += [f"Probes, the largest over layers: peak over the {_count(steps)} probed steps each record holds "
                      "(an archived record keeps evenly spaced ones, so a brief spike between them is missed) and "
                      "over seeds, and the largest over seeds at the last probed step (query and key norms before "
                      "normalisation):", "", probed, ""]
    return "\n".join(lines)
