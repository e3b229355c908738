"""The statistics of a results table: intervals, paired differences to `standard` with Holm's correction,
the verdicts they give, variants that computed the same function, and whether a table learned at all."""
from __future__ import annotations

import numpy as np
import pandas as pd
from scipy import stats
from statsmodels.stats.multitest import multipletests

from common.attention import ABLATIONS
from runners.results.frame import IDENTITY, variant_order

# Means this close count as tied: equal results can differ in the last bits from the order of summation.
TIE_RTOL = 1e-9

# The power at which a minimum detectable effect is quoted (paired t-test, two-sided, at the table's α).
POWER = 0.8

# A table counts as learning when its reference variant closes this share of the gap between the trivial
# baseline and a perfect score; below it, ranking variants would rank noise.
CLEAR_MARGIN = 0.1


def half_width(values: pd.Series) -> float:
    """Half-width of the 95% t-interval of the mean of ``values`` (NaN below two values)."""
    n = values.count()
    return float(stats.t.ppf(0.975, n - 1) * values.std() / np.sqrt(n)) if n > 1 else np.nan


def detectable(sd: float, n: int, alpha: float = 0.05, power: float = POWER) -> float:
    """The smallest true mean difference a two-sided paired t-test over ``n`` pairs detects with probability
    ``power`` at level ``alpha``, for pair differences of standard deviation ``sd``: (t_{1-α/2} + t_{power}) ·
    sd / √n on n - 1 degrees of freedom, the usual approximation of the noncentral t, and the formula the plan
    pre-registers (``runners.results.sample_size.mde`` is the exact one, for planning). NaN below 2 pairs, and where
    every pair differs alike (an endpoint at its floor for both variants): a spread of 0 estimates none."""
    if n < 2 or not np.isfinite(sd) or sd == 0:
        return np.nan
    return float((stats.t.ppf(1 - alpha / 2, n - 1) + stats.t.ppf(power, n - 1)) * sd / np.sqrt(n))


def equivalents(ok: pd.DataFrame) -> dict[str, str]:
    """Variants that computed exactly what an earlier variant did (every metric equal on every seed, as
    the elliptical variants do in a single layer, or a per-head gain with one head): variant -> that one."""
    metrics = [c for c in ok.columns if c not in IDENTITY and ok[c].notna().any()]
    by_variant = {v: g.set_index("seed")[metrics].sort_index() for v, g in ok.groupby("variant")}
    found: dict[str, str] = {}
    order = variant_order(by_variant)
    for i, variant in enumerate(order):
        a = by_variant[variant]
        for earlier in [v for v in order[:i] if v not in found]:
            b = by_variant[earlier]
            if len(a) and a.index.equals(b.index) and a.index.is_unique and np.allclose(a, b, rtol=TIE_RTOL, atol=0,
                                                                                     equal_nan=True):
                found[variant] = earlier
                break
    return found


def estimate(value: float, spec: str = ".4g", half: float = np.nan) -> str:
    """``value`` formatted by ``spec``, with `` ± half`` (two digits) where ``half`` is a number; "–" where ``value``
    is missing (NaN)."""
    if np.isnan(value):
        return "–"
    return f"{value:{spec}}" if np.isnan(half) else f"{value:{spec}} ± {half:.2g}"


def holm(pvalues: pd.Series) -> pd.Series:
    """Holm's step-down adjustment of a family of p-values (controls the family-wise error rate)."""
    return pd.Series(multipletests(pvalues.to_numpy(dtype=float), method="holm")[1], index=pvalues.index)


def paired_p(diff: pd.Series) -> float:
    """Two-sided paired t-test of differences ``diff``. Differences equal on every pair have no spread to test
    against: all zero is no difference (p = 1), equal and non-zero is untestable (NaN), however large, since
    two seeds that happen to agree would otherwise read as certain."""
    if len(diff) < 2:
        return np.nan
    if np.allclose(diff, diff.iloc[0], rtol=1e-9, atol=1e-12):
        return 1.0 if abs(diff.iloc[0]) < 1e-12 else np.nan
    return float(stats.ttest_1samp(diff, 0.0).pvalue)


def paired_differences(ok: pd.DataFrame, metric: str, variants: list[str], against: str = "standard") -> pd.DataFrame:
    """Per variant, the mean difference to ``against`` (`standard`) over runs paired by seed (each seed's runs
    averaged over any other swept settings), its 95% t-interval, two-sided paired t-test and minimum detectable
    effect (``detectable``, ``mde``), and the p-value Holm-adjusted over the variants compared (rows with fewer
    than two pairs, or none, are left out of the adjustment)."""
    rows = {}
    base = ok[ok["variant"] == against].groupby("seed")[metric].mean()
    for variant in variants:
        pairs = pd.concat([ok[ok["variant"] == variant].groupby("seed")[metric].mean(), base], axis=1,
                          keys=["v", "s"]).dropna()
        diff = pairs["v"] - pairs["s"]
        rows[variant] = {"diff": diff.mean(), "half": half_width(diff), "n": len(diff), "p": paired_p(diff),
                         "mde": detectable(diff.std(), len(diff))}
    table = pd.DataFrame(rows, index=["diff", "half", "n", "p", "mde"]).T
    return table.assign(p_holm=holm(table["p"].dropna()))


def comparisons(runs: pd.DataFrame) -> tuple[pd.DataFrame, dict[str, str]]:
    """One table's tests: each variant against `standard` on the primary metric (``paired_differences``, with
    ``gain``: the difference signed so that positive is better), and the variants ``≡`` an earlier one, which
    are not tested. Ablations and variants without two paired seeds are left out."""
    primary, mode = runs["primary_metric"].iloc[0], runs["mode"].iloc[0]
    ok = runs[runs["status"] == "ok"]
    empty = pd.DataFrame(columns=["diff", "half", "n", "p", "mde", "p_holm"], dtype=float)
    if primary not in ok or not (ok["variant"] == "standard").any():
        return empty.assign(gain=[]), {}
    same = equivalents(ok)
    compared = [v for v in variant_order(ok["variant"]) if v != "standard" and v not in same and v not in ABLATIONS]
    table = paired_differences(ok, primary, compared).dropna(subset=["p"]) if compared else empty
    return table.assign(gain=-table["diff"] if mode == "min" else table["diff"]), same


def verdict(gain: float, p: float, alpha: float = 0.05) -> str:
    """``better`` or ``worse`` where a (corrected) ``p`` is below ``alpha``, else ``not different``."""
    return "not different" if not p < alpha else ("better" if gain > 0 else "worse")


def verdicts(runs: pd.DataFrame, alpha: float = 0.05) -> dict[str, str]:
    """Per variant of one table: ``better``, ``worse`` or ``not different`` from `standard` on the primary
    metric after Holm's correction over the table's variants, or ``≡ <variant>``; `standard` itself and
    variants without paired seeds are left out."""
    table, same = comparisons(runs)
    return {**{v: f"≡ {other}" for v, other in same.items()},
            **{variant: verdict(row["gain"], row["p_holm"], alpha) for variant, row in table.iterrows()}}


def attention_matters(runs: pd.DataFrame) -> tuple[bool, str] | None:
    """Whether the table can rank variants at all: its attention ablation (`uniform`, paired with `standard`)
    moves the primary metric by at least the minimum detectable effect at the achieved seeds. Where removing
    attention is inside what the seeds can detect, a difference between attention variants is too. None
    without the ablation."""
    primary = runs["primary_metric"].iloc[0]
    ok = runs[runs["status"] == "ok"]
    present = [a for a in ABLATIONS if (ok["variant"] == a).any()]
    if not present or primary not in ok or not (ok["variant"] == "standard").any():
        return None
    row = paired_differences(ok, primary, present[:1]).iloc[0]
    if not np.isfinite(row["mde"]):
        return False, f"Cannot rank variants here: fewer than two seeds pair `{present[0]}` with `standard`."
    matters = abs(row["diff"]) >= row["mde"]
    return matters, (f"Attention ablation `{present[0]}` moves {primary} by {row['diff']:+.3g}; the minimum effect "
                     f"{int(row['n'])} paired seeds detect (80% power, α = 0.05) is {row['mde']:.3g}: "
                     + ("variants can be ranked here." if matters else
                        "cannot rank variants here, so this table is left out of the cross-domain ranks and counts."))


def rankable(runs: pd.DataFrame, ablation: pd.DataFrame | None = None) -> bool:
    """A table enters the cross-domain ranks and counts when it learns (``learns``, where a baseline tells) and
    an attention ablation shows that attention matters in it (``attention_matters``): that of ``ablation``, the
    table whose ablation speaks for this one (``runners.results.tables.ablation_sources``), by default its own.
    Without an ablation it cannot show that, so it is not ranked: its differences could be as undetectable as
    removing attention."""
    if pools_learning_rates(runs):
        return False
    learned, matters = learns(runs), attention_matters(runs if ablation is None else ablation)
    return (learned is None or learned[0]) and matters is not None and matters[0]


def pools_learning_rates(runs: pd.DataFrame) -> bool:
    """Whether a variant's runs in the table span a learning-rate grid (``optim.lr`` pooled besides the seed): a mean
    over good and runaway rates alike is no one setting's score, so the table is read rate by rate, never ranked."""
    return runs["pooled"].str.split(", ").map(lambda keys: "optim.lr" in keys).any()


def learns(runs: pd.DataFrame) -> tuple[bool, str] | None:
    """Whether the table's runs beat the trivial predictor their task logs (``<primary>_baseline``) by a
    clear margin: the reference (`standard`, else every variant) closes at least ``CLEAR_MARGIN`` of the
    gap between the baseline and a perfect score (1 for scores, 0 for errors). None without a baseline, or where the
    table pools a learning-rate grid (``pools_learning_rates``)."""
    primary, mode = runs["primary_metric"].iloc[0], runs["mode"].iloc[0]
    ok, column = runs[runs["status"] == "ok"], f"{primary}_baseline"
    if column not in ok or primary not in ok or ok[column].isna().all() or pools_learning_rates(runs):
        return None
    reference = ok[ok["variant"] == "standard"] if (ok["variant"] == "standard").any() else ok
    model, base = reference[primary].mean(), ok[column].mean()
    closed = (base - model) / base if mode == "min" else (model - base) / (1 - base)
    verdict = "learns at this size" if closed >= CLEAR_MARGIN else "does not learn at this size"
    who = "standard closes" if reference is not ok else "the variants close"
    said = next((said[column] for said in runs["baselines"] if column in said), None)  # what the baseline predicts
    sentence = (f"Trivial baseline (`{column}`{f': {said}' if said else ''}) {base:.4g}; {who} {closed:.0%} of the "
                f"gap to a perfect score: {verdict}"
                f"{'' if closed >= CLEAR_MARGIN else ', so this table is left out of the cross-domain ranks'}.")
    return closed >= CLEAR_MARGIN, sentence
