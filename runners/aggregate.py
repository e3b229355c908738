"""`quest aggregate <runs dir> ... [--report REPORT.md ...] [--notes NOTES.md] [-o RESULTS.md]`: run records ->
markdown tables, CSV and plots, with the reports of studies that have their own analysis.

Per domain, dataset and preset: rows = variants, columns = test metrics as mean ± the half-width of its 95%
t-interval over runs, the number of finished runs, diverged and failed counts, best value per column in bold
(none where all variants tie); then the difference of the primary metric to `standard`, paired by seed, with
its 95% interval and a paired t-test whose p-values are Holm-corrected over the variants of the table, a
one-line verdict, and that group's plots. A variant whose metrics equal an earlier variant's on every seed
computed the same function in that setting (elliptical in one layer, a per-head gain with one head): it is
marked ``≡ <variant>``, neither tested nor ranked. Across domains: each variant's primary metric per
domain, its rank there (1 = best) and its mean rank, and how many domains find it significantly better,
not different or worse than `standard`.
A record that cannot be read or breaks the schema is skipped with a warning and listed at the end.

``--report`` adds a study's own report (``quest stability``, ``python -m domains.retrieval.report``) as a
section: its headings one level down, its figures copied beside the CSV. ``--notes`` adds the hand-written
reading of the numbers: each ``## <heading>`` section of the notes file goes under the generated heading of
the same text, marked as written by hand, so RESULTS.md is regenerated, never edited, and the prose stays
beside the numbers it reads. A note whose heading matches nothing is an error (exit 2): it would be lost.
"""
from __future__ import annotations

import argparse
import json
import logging
import re
import shutil
import warnings
from collections.abc import Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pandas as pd
from omegaconf import OmegaConf
from scipy import stats

from common.attention import ABLATIONS, VARIANTS
from common.errors import ConfigError
from common.records import read_records
from runners.sweep import LAUNCH_LOG

HEADING = re.compile(r"^(#+) (.+?)[ \t]*$", re.MULTILINE)
IMAGE = re.compile(r"!\[([^\]]*)\]\(([^)\s]+)\)")
# Substrings of secondary metrics where lower is better (a primary metric carries its own mode):
# errors, losses, and the language model's bits per token/character and perplexity.
LOWER_IS_BETTER = ("loss", "mse", "mae", "rmse", "err", "bpb", "bpc", "ppl")
# Summary columns of `quest robustness` results (a record's "robustness" field) shown beside test metrics.
ROBUSTNESS = ("acc_fgsm_", "acc_pgd_", "acc_autoattack_", "acc_corruption_mean")
GROUP = ["domain", "dataset", "preset"]  # one table and one set of plots per group: runs of different sizes never mix
# Record fields copied into each run's row (in this order, for a stable CSV); with run_dir, not metrics.
RECORD_FIELDS = ("domain", "dataset", "variant", "seed", "preset", "status", "primary_metric", "mode")
IDENTITY = {*RECORD_FIELDS, "run_dir"}
# Means this close count as tied: equal results can differ in the last bits from the order of summation.
TIE_RTOL = 1e-9
# A table counts as learning when its reference variant closes this share of the gap between the trivial
# baseline and a perfect score; below it, ranking variants would rank noise.
CLEAR_MARGIN = 0.1

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


def half_width(values: pd.Series) -> float:
    """Half-width of the 95% t-interval of the mean of ``values`` (NaN below two values)."""
    n = values.count()
    return float(stats.t.ppf(0.975, n - 1) * values.std() / np.sqrt(n)) if n > 1 else np.nan


def _fmt(mean: float, half: float) -> str:
    if np.isnan(mean):
        return "–"
    return f"{mean:.4g}" if np.isnan(half) else f"{mean:.4g} ± {half:.2g}"


def _bold_best(cells: list[str], means: pd.Series, lower: bool) -> list[str]:
    """``cells`` (one per variant of ``means``) with the best mean(s) in bold; none bold where every variant
    with a value ties, as there is nothing to tell apart."""
    values = means.dropna()
    best = values.min() if lower else values.max()
    winners = set(values.index[np.isclose(values, best, rtol=TIE_RTOL, atol=0)])
    if len(winners) == len(values):
        return cells
    return [f"**{cell}**" if variant in winners else cell for variant, cell in zip(means.index, cells)]


def equivalents(ok: pd.DataFrame) -> dict[str, str]:
    """Variants that computed exactly what an earlier variant did (every metric equal on every seed, as
    the elliptical variants do in a single layer, or a per-head gain with one head): variant -> that one."""
    metrics = [c for c in ok.columns if c not in IDENTITY and ok[c].notna().any()]
    by_variant = {v: g.set_index("seed")[metrics].sort_index() for v, g in ok.groupby("variant")}
    found: dict[str, str] = {}
    order = variant_order(by_variant)
    for i, variant in enumerate(order):
        for earlier in order[:i]:
            if earlier in found:
                continue
            a, b = by_variant[variant], by_variant[earlier]
            if len(a) and a.index.equals(b.index) and a.index.is_unique and np.allclose(a, b, rtol=TIE_RTOL, atol=0,
                                                                                     equal_nan=True):
                found[variant] = earlier
                break
    return found


def holm(pvalues: pd.Series) -> pd.Series:
    """Holm's step-down adjustment of a family of p-values (controls the family-wise error rate)."""
    order = pvalues.sort_values()
    m = len(order)
    adjusted = (order * np.arange(m, 0, -1)).cummax().clip(upper=1.0)
    return adjusted.reindex(pvalues.index)


def paired_differences(ok: pd.DataFrame, metric: str, variants: list[str]) -> pd.DataFrame:
    """Per variant, the mean difference to `standard` over runs paired by seed (each seed's runs averaged
    over any other swept settings), its 95% t-interval and two-sided paired t-test, and the p-value
    Holm-adjusted over the variants compared (rows with fewer than two pairs, or none, are left out)."""
    rows = {}
    base = ok[ok["variant"] == "standard"].groupby("seed")[metric].mean()
    for variant in variants:
        pairs = pd.concat([ok[ok["variant"] == variant].groupby("seed")[metric].mean(), base], axis=1,
                          keys=["v", "s"]).dropna()
        diff = pairs["v"] - pairs["s"]
        row = {"diff": diff.mean(), "half": half_width(diff), "n": len(diff), "p": np.nan}
        if len(diff) > 1:  # a difference equal on every seed has no spread to test against: p is 0 or 1
            constant = np.allclose(diff, diff.iloc[0], rtol=1e-9, atol=1e-12)
            row["p"] = float(abs(diff.iloc[0]) < 1e-12) if constant else stats.ttest_rel(pairs["v"], pairs["s"]).pvalue
        rows[variant] = row
    table = pd.DataFrame(rows, index=["diff", "half", "n", "p"]).T
    tested = table["p"].dropna()
    table["p_holm"] = holm(tested) if len(tested) else np.nan
    return table


def _fmt_difference(row: pd.Series) -> str:
    if np.isnan(row["diff"]):
        return "–"
    if np.isnan(row["p"]):
        return f"{row['diff']:+.3g} (n={int(row['n'])})"
    return (f"{row['diff']:+.3g} ± {row['half']:.2g} (p={row['p']:.2g}, Holm {row['p_holm']:.2g}, "
            f"n={int(row['n'])})")


def verdicts(runs: pd.DataFrame, alpha: float = 0.05) -> dict[str, str]:
    """Per variant of one table: ``better``, ``worse`` or ``not different`` from `standard` on the primary
    metric after Holm's correction, or ``≡ <variant>``; `standard` itself and variants without paired seeds
    are left out."""
    primary, mode = runs["primary_metric"].iloc[0], runs["mode"].iloc[0]
    ok = runs[runs["status"] == "ok"]
    if primary not in ok or not (ok["variant"] == "standard").any():
        return {}
    same = equivalents(ok)
    compared = [v for v in variant_order(ok["variant"]) if v != "standard" and v not in same and v not in ABLATIONS]
    table = paired_differences(ok, primary, compared).dropna(subset=["p"]) if compared else pd.DataFrame()
    found = {v: f"≡ {other}" for v, other in same.items()}
    for variant, row in table.iterrows():
        gain = -row["diff"] if mode == "min" else row["diff"]
        found[variant] = "not different" if row["p_holm"] >= alpha else ("better" if gain > 0 else "worse")
    return found


def domain_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Rows = variants of one domain/dataset; mean and 95% interval of each metric over its finished runs,
    and the paired difference to `standard` on the primary metric."""
    primary, mode = runs["primary_metric"].iloc[0], runs["mode"].iloc[0]
    ok = runs[runs["status"] == "ok"]
    metrics = [c for c in runs.columns if c not in IDENTITY and runs[c].notna().any()]
    metrics = sorted(metrics, key=lambda m: (m != primary, m))
    variants = variant_order(runs["variant"])
    grouped = ok.groupby("variant")[metrics]
    means = grouped.mean().reindex(variants)
    halves = grouped.agg(half_width).reindex(variants)
    table = pd.DataFrame(index=variants)
    for m in metrics:
        lower = lower_is_better(m, primary, mode)
        cells = [_fmt(means.at[v, m], halves.at[v, m]) for v in variants]
        contenders = means[m].where(~means.index.isin(list(ABLATIONS)))  # an ablation is never the best
        table[m + (" ↓" if lower else " ↑")] = _bold_best(cells, contenders, lower)
    table["runs"] = [int((ok["variant"] == v).sum()) for v in variants]
    table["diverged"] = [int(((runs["variant"] == v) & (runs["status"] == "diverged")).sum()) for v in variants]
    table["failed"] = [int(((runs["variant"] == v) & (runs["status"] == "failed")).sum()) for v in variants]
    stopped = [int(((runs["variant"] == v) & (runs["status"] == "stopped")).sum()) for v in variants]
    if any(stopped):  # stopped by a signal, not a result: shown so that a missing run is not missed
        table["stopped"] = stopped
    same = equivalents(ok)
    # Holm's family is the variants; an ablation's difference is tested on its own
    families = [[v for v in variants if v != "standard" and v not in same and v not in ABLATIONS],
                [v for v in variants if v in ABLATIONS]]
    diffs = pd.concat([paired_differences(ok, primary, family) for family in families if family and primary in ok]
                      or [pd.DataFrame()])
    table[f"Δ{primary} vs standard ± 95% (p, Holm)"] = [
        f"≡ {same[v]}" if v in same else _fmt_difference(diffs.loc[v]) if v in diffs.index else "–"
        for v in variants]
    table.index.name = "variant"
    return table


def learns(runs: pd.DataFrame) -> tuple[bool, str] | None:
    """Whether the table's runs beat the trivial predictor their task logs (``<primary>_baseline``) by a
    clear margin: the reference (`standard`, else every variant) closes at least ``CLEAR_MARGIN`` of the
    gap between the baseline and a perfect score (1 for scores, 0 for errors). None without a baseline."""
    primary, mode = runs["primary_metric"].iloc[0], runs["mode"].iloc[0]
    ok, column = runs[runs["status"] == "ok"], f"{primary}_baseline"
    if column not in ok or primary not in ok or ok[column].isna().all():
        return None
    reference = ok[ok["variant"] == "standard"] if (ok["variant"] == "standard").any() else ok
    model, base = reference[primary].mean(), ok[column].mean()
    closed = (base - model) / base if mode == "min" else (model - base) / (1 - base)
    verdict = "learns at this size" if closed >= CLEAR_MARGIN else "does not learn at this size"
    who = "standard closes" if reference is not ok else "the variants close"
    sentence = (f"Trivial baseline (`{column}`) {base:.4g}; {who} {closed:.0%} of the "
                f"gap to a perfect score: {verdict}"
                f"{'' if closed >= CLEAR_MARGIN else ', so this table is left out of the cross-domain ranks'}.")
    return closed >= CLEAR_MARGIN, sentence


def significance_line(runs: pd.DataFrame, alpha: float = 0.05) -> str:
    """One sentence: which variants differ from `standard` on the primary metric after Holm's correction."""
    primary = runs["primary_metric"].iloc[0]
    found = verdicts(runs, alpha)
    differ = [f"{v} {verdict}" for v, verdict in found.items() if verdict in ("better", "worse")]
    if not any(not verdict.startswith("≡") for verdict in found.values()):
        return f"Significance: no variant has two or more seeds paired with `standard` on {primary}."
    return (f"Significant after Holm's correction (α = {alpha}) on {primary}: "
            f"{', '.join(differ) if differ else 'no variant differs from standard'}.")


def ablation_lines(runs: pd.DataFrame, alpha: float = 0.05) -> list[str]:
    """Per ablation in the table (``attention=uniform``: every logit 0, each query averaging what it may see),
    one sentence on what it does to the primary metric against `standard`, paired by seed: what the metric
    owes to attention in this setting, or that removing attention changes nothing measurable."""
    primary, mode = runs["primary_metric"].iloc[0], runs["mode"].iloc[0]
    ok = runs[runs["status"] == "ok"]
    present = [a for a in ABLATIONS if (ok["variant"] == a).any()]
    if not present or primary not in ok or not (ok["variant"] == "standard").any():
        return []
    lines = []
    for ablation, row in paired_differences(ok, primary, present).iterrows():
        if np.isnan(row["p"]):
            lines.append(f"Attention ablation `{ablation}`: fewer than two seeds paired with `standard`.")
            continue
        worse = (row["diff"] > 0) == (mode == "min")
        if row["p"] >= alpha:
            verdict = "not different from standard: removing attention changes nothing measurable at this size"
        elif worse:
            verdict = "worse than standard: the metric owes that much to attention here"
        else:
            verdict = "better than standard: attention costs this setting that much"
        lines.append(f"Attention ablation `{ablation}` (every logit 0, each query averaging what it may see): "
                     f"Δ{primary} {row['diff']:+.3g} ± {row['half']:.2g} (p={row['p']:.2g}, n={int(row['n'])}), "
                     f"{verdict}.")
    return lines


def summary_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Rows = variants; per domain/dataset its primary metric (mean ± 95% half-width) and the variant's
    rank, a variant equivalent to another (``equivalents``) marked and not ranked twice."""
    variants = [v for v in variant_order(runs["variant"]) if v not in ABLATIONS]  # ablations are not contenders
    table = pd.DataFrame(index=variants)
    ranks = pd.DataFrame(index=variants)
    for (domain, dataset, preset), group in runs.groupby(GROUP, sort=True):
        if (learned := learns(group)) is not None and not learned[0]:
            continue  # ranks of a model that does not beat a constant predictor rank noise
        primary, mode = group["primary_metric"].iloc[0], group["mode"].iloc[0]
        ok = group[group["status"] == "ok"]
        name = f"{domain}/{dataset} ({preset}) {primary} {'↓' if mode == 'min' else '↑'}"
        if primary in ok:
            mean = ok.groupby("variant")[primary].mean().reindex(variants)
            half = ok.groupby("variant")[primary].agg(half_width).reindex(variants)
        else:
            mean = half = pd.Series(np.nan, index=variants)
        same = equivalents(ok)
        table[name] = [_fmt(mean[v], half[v]) for v in variants]
        ranks[name] = mean.drop(list(same)).rank(ascending=mode == "min", method="min").reindex(variants)
        table[f"rank {domain}/{dataset} ({preset})"] = [
            f"≡ {same[v]}" if v in same else "–" if np.isnan(ranks.at[v, name]) else str(int(ranks.at[v, name]))
            for v in variants]
    table["mean rank"] = ranks.mean(axis=1).map(lambda r: "–" if np.isnan(r) else f"{r:.2f}")
    table.index.name = "variant"
    return table


def verdict_table(runs: pd.DataFrame, alpha: float = 0.05) -> pd.DataFrame:
    """Rows = variants; the number of domains where each is significantly better than, not different
    from, or worse than `standard` (Holm-corrected within each table), and where it is ``≡`` another."""
    found = [verdicts(group, alpha) for _, group in runs.groupby(GROUP, sort=True)
             if (learned := learns(group)) is None or learned[0]]
    variants = [v for v in variant_order(runs["variant"]) if v != "standard" and v not in ABLATIONS]
    columns = ("better", "not different", "worse", "≡ another variant")
    table = pd.DataFrame(0, index=variants, columns=list(columns))
    for by_variant in found:
        for variant, verdict in by_variant.items():
            table.at[variant, "≡ another variant" if verdict.startswith("≡") else verdict] += 1
    table.index.name = "variant"
    return table


def read_launches(*roots: str | Path) -> list[dict]:
    """The sweep launches logged in each of ``roots`` (``runners.sweep.log_launch``), oldest first."""
    launches = []
    for root in roots:
        path = Path(root) / LAUNCH_LOG
        if path.is_file():
            launches += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return sorted(launches, key=lambda launch: launch["started"])


def describe_launches(launches: Sequence[dict]) -> list[str]:
    """How the runs were made: each launch's command, start, wall time, workers and outcome counts, the machine
    and commit; and the wall time of all of them together."""
    if not launches:
        return []
    minutes = sum(launch["wall_s"] for launch in launches) / 60
    lines = [f"How these runs were made ({len(launches)} sweep launch{'es' if len(launches) > 1 else ''}, "
             f"{minutes:.0f} min of wall time in all):", ""]
    for launch in launches:
        machine = launch["hardware"]
        gpus = f", GPUs: {', '.join(machine['gpus'])}" if machine.get("gpus") else ""
        ran = ", ".join(f"{n} {status}" for status, n in launch["ran"].items() if n) or "nothing (every run was recorded)"
        lines.append(f"- `{launch['command']}` started {launch['started']}"
                     f"{'' if launch['finished'] else ' (stopped before the end)'}: {launch['wall_s'] / 60:.1f} min "
                     f"with {launch['workers']} worker(s), ran {ran}; {machine.get('cpu', '?')} × {machine['cpus']} "
                     f"CPUs, {machine['platform']}{gpus}, commit {launch['git_commit'] or 'unknown'}")
    return [*lines, ""]


def render(runs: pd.DataFrame | None, plots: dict[tuple[str, str, str], list[str]] | None = None,
           sources: list[str] | None = None, skipped: Sequence[tuple[str, str]] = (),
           reports: Sequence[str] = (), launches: Sequence[dict] = (), anchors: Sequence[str] = ()) -> str:
    """RESULTS.md: ``plots`` maps a (domain, dataset, preset) group to its images; ``skipped`` lists
    (path, reason) of the records left out, in a footnote; ``reports`` are sections added at the end;
    ``launches`` are the sweep launches that made the runs (``read_launches``); ``anchors`` the lines of the
    "Paper anchors" section (``anchor_section``), after the cross-domain summary."""
    parts = ["# Results", "", f"Generated by `quest aggregate {' '.join(sources or [])}`; do not edit by hand."]
    if runs is not None:
        parts[-1] += (f" {len(runs)} run records aggregated, {len(skipped)} skipped"
                      f"{' (listed at the end)' if skipped else ''}. Values are mean ± the half-width of its 95% "
                      "t-interval over finished runs (seeds and any swept settings); best per column in bold (none "
                      "where all variants tie). Δ vs standard pairs runs by seed: mean ± 95% interval, paired t-test, "
                      "p-values Holm-corrected over the variants of a table. A variant whose every metric equals an "
                      "earlier one's on every seed computes the same function there: marked ≡ and not ranked. "
                      "A table's trivial baseline (`<metric>_baseline`) is the majority class for classifiers, the "
                      "training mean for regression, every pixel the majority class for segmentation, the unigram "
                      "entropy for language and the persistence forecast for time series; a table whose `standard` "
                      f"closes less than {CLEAR_MARGIN:.0%} of the gap from it to a perfect score is not ranked.")
        parts += ["", *describe_launches(launches), "## Across domains", "", summary_table(runs).to_markdown(), "",
                  "Domains where each variant is better than, not different from, or worse than `standard` "
                  "(primary metric, Holm-corrected, α = 0.05):", "", verdict_table(runs).to_markdown(), ""]
        parts += anchors
        for key, group in runs.groupby(GROUP, sort=True):
            parts += [f"## {' / '.join(key)}", "", f"{len(group)} runs.", "",
                      domain_table(group).to_markdown(), "", significance_line(group), ""]
            parts += [line for ablation in ablation_lines(group) for line in (ablation, "")]
            if (learned := learns(group)) is not None:
                parts += [learned[1], ""]
            if any(c.startswith(ROBUSTNESS) for c in group.columns if group[c].notna().any()):
                parts += ["Attacked accuracies (`acc_fgsm_*`, `acc_pgd_*`) of the elliptical variants may be "
                          "optimistic: their attention weights are computed without gradient, so white-box attacks "
                          "see them as constants (possible gradient masking).", ""]
            for plot in (plots or {}).get(key, []):
                parts += [f"![{Path(plot).stem}]({plot})", ""]
    parts += ["", *reports]
    if skipped:
        parts += ["---", "", "Skipped records (not aggregated):", "",
                  *(f"- `{path}`: {reason}" for path, reason in skipped), ""]
    return "\n".join(parts)


def anchor_section(runs: pd.DataFrame | None, anchors: Sequence[dict], source: str) -> list[str]:
    """"Paper anchors": per entry of ``anchors`` (a YAML list: ``experiment``, ``paper``, ``nearest``, ``agreement``,
    and ``measured: {table: domain/dataset/preset, metrics: [...], variants: [...]}`` or ``see: <section>``), the
    paper's numbers beside this framework's on the nearest setting it runs, the measured cells computed here
    from the runs so that no number is copied by hand. A table or metric the runs lack is a ``ConfigError``."""
    rows = []
    for anchor in anchors:
        missing = {"experiment", "paper", "nearest", "agreement"} - set(anchor)
        if missing or not ("measured" in anchor) ^ ("see" in anchor):
            raise ConfigError(f"{source}: anchor {anchor.get('experiment', '?')!r} needs experiment, paper, nearest, "
                              "agreement and one of measured or see")
        measured = f"see “{anchor['see']}”" if "see" in anchor else _measured(runs, anchor["measured"], source)
        rows.append({"paper experiment": anchor["experiment"], "paper": anchor["paper"],
                     "nearest setting here": anchor["nearest"], "measured here": measured,
                     "agreement": anchor["agreement"]})
    return ["## Paper anchors", "", f"The paper's reported numbers beside what this framework measured on the nearest "
            f"setting it can run (entries: `{source}`; measured cells computed from the runs above).", "",
            pd.DataFrame(rows).to_markdown(index=False), ""]


def _measured(runs: pd.DataFrame | None, where: dict, source: str) -> str:
    key = tuple(str(where["table"]).split("/"))
    group = None if runs is None or len(key) != len(GROUP) else runs[(runs[GROUP] == pd.Series(key, index=GROUP)).all(axis=1)]
    if group is None or group.empty:
        raise ConfigError(f"{source}: no runs make the table {where['table']!r}")
    ok = group[group["status"] == "ok"]
    lacking = [m for m in where["metrics"] if m not in ok or ok[m].isna().all()]
    if lacking:
        raise ConfigError(f"{source}: table {where['table']!r} has no metric {', '.join(lacking)}")
    cells = []
    for variant in where.get("variants") or variant_order(ok["variant"]):
        values = ok[ok["variant"] == variant]
        cells.append(f"{variant}: " + ", ".join(f"{m} {_fmt(values[m].mean(), half_width(values[m]))}"
                                                for m in where["metrics"]))
    return "<br>".join(cells)


def include_report(path: Path, extras: Path, out_dir: Path) -> str:
    """A study's report as a section of RESULTS.md: headings one level down, each figure it links copied to
    ``extras/<report's first heading>/`` and linked from there."""
    text = path.read_text()
    first = HEADING.search(text)
    folder = extras / re.sub(r"[^a-z0-9]+", "-", (first.group(2) if first else path.stem).lower()).strip("-")

    def relink(image: re.Match) -> str:
        alt, target = image.groups()
        if "://" in target:
            return image.group(0)
        source = path.parent / target
        if not source.is_file():
            raise ConfigError(f"{path}: its figure {target} does not exist")
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, folder / source.name)
        return f"![{alt}]({(folder / source.name).relative_to(out_dir).as_posix()})"

    text = IMAGE.sub(relink, text)
    return HEADING.sub(lambda h: f"#{h.group(1)} {h.group(2)}", text)


def insert_notes(document: str, notes: str, source: str) -> str:
    """``document`` with each ``## <heading>`` section of ``notes`` placed right under the document's heading
    of the same text; a note for a heading the document lacks is a ``ConfigError``."""
    sections = re.split(r"^## (.+?)[ \t]*$", notes, flags=re.MULTILINE)[1:]
    pending = {heading: body.strip() for heading, body in zip(sections[::2], sections[1::2])}

    def place(heading: re.Match) -> str:
        body = pending.pop(heading.group(2), None)
        if body is None:
            return heading.group(0)
        return f"{heading.group(0)}\n\n*Reading (written by hand from these numbers, `{source}`):* {body}"

    document = HEADING.sub(place, document)
    if pending:
        raise ConfigError(f"{source}: no section of the results is headed {', '.join(map(repr, pending))}")
    return document


@contextmanager
def each_warning_once():
    """Show each warning raised inside once per place. Python means to, but forgets what it has shown whenever a
    filter changes, as pandas does all the time; and a table's statistics are computed more than once (its
    verdicts, its baseline), so a warning of theirs would print each time."""
    try:
        with warnings.catch_warnings(record=True) as caught:
            yield
    finally:
        for w in {(w.category, str(w.message), w.filename, w.lineno): w for w in caught}.values():
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)


@each_warning_once()
def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="quest aggregate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="*", help="directories of runs (searched recursively for record.json)")
    parser.add_argument("-o", "--output", default="RESULTS.md", help="markdown file to write")
    parser.add_argument("--report", action="append", default=[], type=Path, metavar="REPORT_MD",
                        help="a study's own markdown report, added as a section (repeatable)")
    parser.add_argument("--notes", type=Path, metavar="NOTES_MD", help="hand-written reading, by section heading")
    parser.add_argument("--anchors", type=Path, metavar="ANCHORS_YAML",
                        help="the paper's numbers and the settings here nearest to them (a Paper anchors section)")
    parser.add_argument("--no-plots", action="store_true")
    args = parser.parse_args(argv)
    if not args.runs and not args.report:
        parser.error("give run directories, --report files, or both")
    for path in [*args.report, *(p for p in (args.notes, args.anchors) if p)]:
        if not path.is_file():
            raise ConfigError(f"{path}: no such file")
    out = Path(args.output)
    extras = out.parent / out.stem  # RESULTS.md -> RESULTS/ for the CSV, the plots and the reports' figures
    extras.mkdir(parents=True, exist_ok=True)
    runs, plots, skipped = None, {}, []
    if args.runs:
        runs = load_runs(*args.runs)
        skipped = runs.attrs["skipped"]
        if not args.no_plots:
            from runners.plots import write_plots

            plots = write_plots(runs, extras, relative_to=out.parent)
        runs.to_csv(extras / "runs.csv", index=False)
    reports = [include_report(path, extras, out.parent) for path in args.report]
    anchors = anchor_section(runs, OmegaConf.to_container(OmegaConf.load(args.anchors)), str(args.anchors)) if args.anchors else []
    sources = [*args.runs, *(f"--report {p}" for p in args.report),
               *(f"--{name} {p}" for name, p in (("anchors", args.anchors), ("notes", args.notes)) if p)]
    document = render(runs, plots, sources, skipped, reports, read_launches(*args.runs), anchors)
    if args.notes:
        document = insert_notes(document, args.notes.read_text(), str(args.notes))
    out.write_text(document)
    print(f"aggregate: {0 if runs is None else len(runs)} runs, {len(skipped)} skipped, {len(reports)} reports -> {out}")
    return 0
