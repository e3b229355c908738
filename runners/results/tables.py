"""The tables of RESULTS.md: per domain, dataset and preset (rows = variants), and across domains."""
from __future__ import annotations

import numpy as np
import pandas as pd

from common.attention import ABLATIONS
from runners.results import stats
from runners.results.frame import GROUP, IDENTITY, INITIAL, PROTOCOLS, direction, repeats, second_setting, variant_order


def _bold_best(cells: list[str], means: pd.Series, lower: bool) -> list[str]:
    """``cells`` (one per variant of ``means``) with the best mean(s) in bold; none bold where every variant
    with a value ties, as there is nothing to tell apart."""
    values = means.dropna()
    best = values.min() if lower else values.max()
    winners = set(values.index[np.isclose(values, best, rtol=stats.TIE_RTOL, atol=0)])
    if len(winners) == len(values):
        return cells
    return [f"**{cell}**" if variant in winners else cell for variant, cell in zip(means.index, cells)]


def _fmt_difference(row: pd.Series) -> str:
    if np.isnan(row["diff"]):
        return "–"
    if np.isnan(row["p"]):
        return f"{row['diff']:+.3g} (n={int(row['n'])}, untestable)"
    return (f"{row['diff']:+.3g} ± {row['half']:.2g} (p={row['p']:.2g}, Holm {row['p_holm']:.2g}, "
            f"n={int(row['n'])}, MDE {stats.estimate(row['mde'], '.2g')})")


def domain_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Rows = variants of one domain/dataset; mean and 95% interval of each metric over its finished runs,
    and the paired difference to `standard` on the primary metric. A table pooling a learning-rate grid
    (``stats.pools_learning_rates``) is described, not compared: no best in bold, no difference to `standard`."""
    primary, pooled = runs["primary_metric"].iloc[0], stats.pools_learning_rates(runs)
    ok = runs[runs["status"] == "ok"]
    metrics = sorted((c for c in runs.columns if c not in IDENTITY and runs[c].notna().any()), key=lambda m: (m != primary, m))
    variants = variant_order(runs["variant"])
    grouped = ok.groupby("variant")[metrics]
    means = grouped.mean().reindex(variants)
    halves = grouped.agg(stats.half_width).reindex(variants)
    table = pd.DataFrame(index=pd.Index(variants, name="variant"))
    for m in metrics:
        way = direction(runs, m)  # None: no record says, so no arrow and no best
        cells = [stats.estimate(means.at[v, m], half=halves.at[v, m]) for v in variants]
        if way is not None and not pooled:  # an ablation is never the best
            cells = _bold_best(cells, means[m].where(~means.index.isin(list(ABLATIONS))), way == "min")
        table[m + {"min": " ↓", "max": " ↑"}.get(way, "")] = cells
    table["runs"] = [int((ok["variant"] == v).sum()) for v in variants]
    for status in ("diverged", "failed", "stopped"):
        counts = [int(((runs["variant"] == v) & (runs["status"] == status)).sum()) for v in variants]
        if status != "stopped" or any(counts):  # stopped by a signal, not a result: shown where a run was
            table[status] = counts
    if pooled:
        return table
    same = stats.equivalents(ok)
    # Holm's family is the variants; an ablation's difference is tested on its own
    families = [[v for v in variants if v != "standard" and v not in same and v not in ABLATIONS],
                [v for v in variants if v in ABLATIONS]]
    diffs = pd.concat([stats.paired_differences(ok, primary, family) for family in families if family and primary in ok]
                      or [pd.DataFrame()])
    table[f"Δ{primary} vs standard ± 95% (p, Holm, n, MDE)"] = [
        f"≡ {same[v]}" if v in same else _fmt_difference(diffs.loc[v]) if v in diffs.index else "–"
        for v in variants]
    return table


def initial_sharpness_table(runs: pd.DataFrame) -> pd.DataFrame | None:
    """Rows = variants; how sharp their attention starts (``runners.results.frame.INITIAL``: logit spread and
    entropy over the uniform one's at step 0, averaged over layers), mean over runs. None where no run has it."""
    columns = [c for c in INITIAL if c in runs and runs[c].notna().any()]
    if not columns:
        return None
    table = runs.groupby("variant")[columns].mean().reindex(variant_order(runs["variant"])).round(3)
    return table.rename(columns={"init_logit_std": "logit spread at step 0", "init_entropy_ratio": "entropy / log L at step 0"})


def significance_line(runs: pd.DataFrame, alpha: float = 0.05) -> str:
    """One sentence: which variants differ from `standard` on the primary metric after Holm's correction."""
    primary = runs["primary_metric"].iloc[0]
    if stats.pools_learning_rates(runs):
        return f"Not tested against `standard` on {primary}: a mean over a learning-rate grid is no one setting's score."
    found = stats.verdicts(runs, alpha)
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
    meaning = {"not different": "not different from standard: removing attention changes nothing measurable at this size",
               "worse": "worse than standard: the metric owes that much to attention here",
               "better": "better than standard: attention costs this setting that much"}
    lines = []
    for ablation, row in stats.paired_differences(ok, primary, present).iterrows():
        if np.isnan(row["p"]):
            lines.append(f"Attention ablation `{ablation}`: fewer than two seeds paired with `standard`.")
            continue
        said = meaning[stats.verdict(-row["diff"] if mode == "min" else row["diff"], row["p"], alpha)]
        lines.append(f"Attention ablation `{ablation}` (every logit 0, each query averaging what it may see): "
                     f"Δ{primary} {row['diff']:+.3g} ± {row['half']:.2g} (p={row['p']:.2g}, n={int(row['n'])}), "
                     f"{said}.")
    return lines


def short_name(key: tuple[str, ...]) -> str:
    """domain/dataset (preset[, protocol]): a group's name in a column heading."""
    domain, dataset, preset, protocol = key
    return f"{domain}/{dataset} ({preset}{f', {protocol}' if protocol else ''})"


def ablation_sources(groups: dict[tuple[str, ...], pd.DataFrame]) -> dict[tuple[str, ...], tuple[str, ...]]:
    """Per table of ``groups`` (``GROUP`` key -> runs), the table whose attention ablation tells whether attention
    matters in it: its own where it ran one; for a tuned table (a sweep's `select:` protocol) without one, the same
    sweep's same-recipe table of its domain, dataset and preset, which differs from it only in the learning rate,
    so its ablation is the evidence at that data, model and size. A table with neither maps to itself."""
    sources = {}
    for key, group in groups.items():
        domain, dataset, preset, protocol = key
        name, _, label = protocol.partition(", ")
        sibling = (domain, dataset, preset, ", ".join(filter(None, (PROTOCOLS[0], label))))
        borrows = name == PROTOCOLS[1] and stats.attention_matters(group) is None and sibling in groups
        sources[key] = sibling if borrows else key
    return sources


def counted_groups(runs: pd.DataFrame):
    """The (key, group) of the tables that enter the cross-domain ranks and counts: ``rankable`` ones on the
    ablation that speaks for them (``ablation_sources``; where the model beats no constant predictor, or attention
    changes nothing, ranks are noise), each set of runs once (``repeats``), and no second setting's rerun of a
    counted table (``setting_agreement_table`` reports those; counting them would weigh a domain twice)."""
    repeated, groups = repeats(runs), dict(iter(runs.groupby(GROUP, sort=True)))
    sources = ablation_sources(groups)
    for key, group in groups.items():
        if (stats.rankable(group, groups[sources[key]]) and not second_setting(key[GROUP.index("protocol")])
                and key not in repeated):
            yield key, group


def borrowed_ablations(runs: pd.DataFrame) -> str:
    """One sentence naming the tuned tables judged by their same-recipe table's attention ablation
    (``ablation_sources``; a second setting's are left out, as they are not counted), those ranked on it and those
    not; empty where none is."""
    groups = dict(iter(runs.groupby(GROUP, sort=True)))
    counted = {key for key, _ in counted_groups(runs)}
    borrowing = [key for key, source in ablation_sources(groups).items()
                 if source != key and not second_setting(key[GROUP.index("protocol")])]
    if not borrowing:
        return ""
    said = {ranked: ", ".join(short_name(key) for key in borrowing if (key in counted) == ranked) or "none"
            for ranked in (True, False)}
    return (f"Tuned tables without an ablation of their own, judged by their same-recipe table's: ranked "
            f"{said[True]}; not ranked {said[False]}.")


def summary_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Rows = variants; per domain/dataset its primary metric (mean ± 95% half-width) and the variant's
    rank, a variant equivalent to another (``equivalents``) marked and not ranked twice."""
    variants = [v for v in variant_order(runs["variant"]) if v not in ABLATIONS]  # ablations are not contenders
    table = pd.DataFrame(index=pd.Index(variants, name="variant"))
    ranks = pd.DataFrame(index=variants)
    for key, group in counted_groups(runs):
        primary, mode = group["primary_metric"].iloc[0], group["mode"].iloc[0]
        ok = group[group["status"] == "ok"]
        where = short_name(key)
        name = f"{where} {primary} {'↓' if mode == 'min' else '↑'}"
        if primary in ok:
            mean = ok.groupby("variant")[primary].mean().reindex(variants)
            half = ok.groupby("variant")[primary].agg(stats.half_width).reindex(variants)
        else:  # no run logged it
            mean = half = pd.Series(np.nan, index=variants)
        same = stats.equivalents(ok)
        table[name] = [stats.estimate(mean[v], half=half[v]) for v in variants]
        ranks[name] = mean.drop(list(same)).rank(ascending=mode == "min", method="min").reindex(variants)
        table[f"rank {where}"] = [
            f"≡ {same[v]}" if v in same else "–" if np.isnan(ranks.at[v, name]) else str(int(ranks.at[v, name]))
            for v in variants]
    table["mean rank"] = ranks.mean(axis=1).map(lambda r: "–" if np.isnan(r) else f"{r:.2f}")
    return table


def verdict_table(runs: pd.DataFrame, alpha: float = 0.05) -> pd.DataFrame:
    """Rows = variants; the number of rankable tables (``rankable``) where each is significantly better than,
    not different from, or worse than `standard`, Holm-corrected over every test the table counts, and where it
    is ``≡`` another variant."""
    tests, same = [], []
    for _, group in counted_groups(runs):
        table, equal = stats.comparisons(group)
        tests.append(table)
        same += list(equal)
    tests = pd.concat(tests) if tests else pd.DataFrame(columns=["gain", "p"])
    corrected = stats.holm(tests["p"].reset_index(drop=True))
    variants = [v for v in variant_order(runs["variant"]) if v != "standard" and v not in ABLATIONS]
    table = pd.DataFrame(0, index=pd.Index(variants, name="variant"),
                         columns=["better", "not different", "worse", "≡ another variant"])
    for variant, gain, p in zip(tests.index, tests["gain"], corrected):
        table.at[variant, stats.verdict(gain, p, alpha)] += 1
    for variant in same:
        table.at[variant, "≡ another variant"] += 1
    return table


def setting_agreement_table(runs: pd.DataFrame, alpha: float = 0.05) -> pd.DataFrame | None:
    """Whether each verdict holds under a sweep's second setting (its ``label``, such as another init): for every
    table whose protocol carries a label ("tuned, PyTorch init") and the table of the same domain, dataset, preset
    and protocol without it, each variant's difference to `standard` and its verdict (``verdicts``, Holm within
    each table) in both, and whether the two verdicts agree. None where no table carries a label."""
    groups = dict(iter(runs.groupby(GROUP, sort=True)))
    rows = []
    for (domain, dataset, preset, protocol), labelled in groups.items():
        base_protocol, _, label = protocol.partition(", ")
        base = groups.get((domain, dataset, preset, base_protocol))
        if not label or base is None:
            continue
        (diff, said), (diff_l, said_l) = ((stats.comparisons(group)[0]["diff"], stats.verdicts(group, alpha))
                                          for group in (base, labelled))
        for variant in [v for v in variant_order(runs["variant"]) if v in said_l]:  # those the setting reran
            shown = [f"{d[variant]:+.3g} ({s[variant]})" if variant in d else s.get(variant, "–")
                     for d, s in ((diff, said), (diff_l, said_l))]
            agree = "–" if variant not in said or variant not in said_l else "yes" if said[variant] == said_l[variant] else "no"
            rows.append({"table": short_name((domain, dataset, preset, base_protocol)), "setting": label,
                         "variant": variant, "Δ vs standard (verdict)": shown[0], "under the setting": shown[1],
                         "same verdict": agree})
    return pd.DataFrame(rows).set_index("table") if rows else None
