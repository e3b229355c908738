"""The statistics of a results table: intervals, paired differences to `standard` with Holm's correction,
the verdicts they give, variants that computed the same function, and whether a table learned at all."""
from __future__ import annotations

import numpy as np
import pandas as pd
from scipy import stats

from common.attention import ABLATIONS
from runners.results.runs import IDENTITY, baseline, variant_order

# Means this close count as tied: equal results can differ in the last bits from the order of summation.
TIE_RTOL = 1e-9


# A table counts as learning when its reference variant closes this share of the gap between the trivial
# baseline and a perfect score; below it, ranking variants would rank noise.
CLEAR_MARGIN = 0.1


def half_width(values: pd.Series) -> float:
    """Half-width of the 95% t-interval of the mean of ``values`` (NaN below two values)."""
    n = values.count()
    return float(stats.t.ppf(0.975, n - 1) * values.std() / np.sqrt(n)) if n > 1 else np.nan


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
    said = baseline(runs, column)
    sentence = (f"Trivial baseline (`{column}`{f': {said}' if said else ''}) {base:.4g}; {who} {closed:.0%} of the "
                f"gap to a perfect score: {verdict}"
                f"{'' if closed >= CLEAR_MARGIN else ', so this table is left out of the cross-domain ranks'}.")
    return closed >= CLEAR_MARGIN, sentence
