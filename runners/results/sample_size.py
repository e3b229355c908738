"""Seeds and compute a pre-registered plan (``runners.results.confirmatory``) needs, from pilot records (``quest
power``), with the exact noncentral t, at the two levels Holm's correction may test a claim at (α / m and α)."""
from __future__ import annotations

import math
from collections.abc import Collection
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import optimize, stats
from statsmodels.stats.power import TTestPower

from common.errors import ConfigError
from common.records import read_record
from runners.results.confirmatory import Hypothesis, claim_differences, holm_first_step, read_plan
from runners.results.stats import POWER, detectable


def power(effect: float, n: int, alpha: float) -> float:
    """Power of a two-sided paired t-test over ``n`` pairs at level ``alpha`` for a true mean difference of
    ``effect`` standard deviations. Each tail is statsmodels' one-sided power: its two-sided call reads the lower
    tail from scipy's ``nct.cdf``, which returns NaN over much of the range asked here (scipy/scipy#25470). Where
    scipy's noncentral t fails, the lower tail is below Φ(−effect·√n) (counted as 0) and the upper one, past a
    noncentrality of about 36, is 1 to double precision."""
    one_sided = TTestPower().power
    upper = one_sided(effect, n, alpha / 2, alternative="larger")
    lower = one_sided(-effect, n, alpha / 2, alternative="larger")
    return float(np.nan_to_num(upper, nan=1.0) + np.nan_to_num(lower, nan=0.0))


def mde(sd: float, n: int, alpha: float) -> float:
    """The smallest mean difference a two-sided paired t-test over ``n`` pairs detects with 80% power at ``alpha``
    (``power`` solved for the effect), for pair differences of standard deviation ``sd``."""
    high = 2 * detectable(1.0, n, alpha)  # the usual approximation, within a few percent: brackets the root
    while power(high, n, alpha) < POWER:
        high *= 2
    return sd * optimize.brentq(lambda effect: power(effect, n, alpha) - POWER, 0.0, high, xtol=1e-12, rtol=1e-12)


def seeds_needed(sd: float, target: float, alpha: float) -> int:
    """The fewest pairs (at least 2) whose ``mde`` at ``alpha`` is at most ``target``. A z-test needs fewer than the
    t-test, so its count is where the upward search starts."""
    effect = target / sd
    n = max(2, math.floor(((stats.norm.isf(alpha / 2) + stats.norm.ppf(POWER)) / effect) ** 2))
    while power(effect, n, alpha) < POWER:
        n += 1
    return n


def pilot_sd(runs: pd.DataFrame, claim: Hypothesis) -> tuple[float, int]:
    """The standard deviation of the claim's paired differences over the pilot ``runs`` (one protocol), and how
    many pairs it rests on. A ``ConfigError`` where fewer than two pairs, or no spread, leave nothing to plan from."""
    diff, _ = claim_differences(runs, claim, sorted(runs["seed"].unique()))
    where = f"{claim.variant} − {claim.against} on {claim.metric} in {claim.domain}"
    if len(diff) < 2:
        raise ConfigError(f"claim {claim.id}: {len(diff)} pilot pair(s) of {where}; at least 2 are needed")
    if not diff.std() > 0:
        raise ConfigError(f"claim {claim.id}: the pilot differences of {where} do not vary; no power to plan from")
    return float(diff.std()), len(diff)


def seed_hours(runs: pd.DataFrame, domain: str, variants: set[str]) -> float:
    """Hours one seed of ``domain`` costs: the sum over ``variants`` of their pilot runs' ``wall_time_s`` per seed (a
    claim over a grid trains a run at each of its cells)."""
    here = runs[(runs["domain"] == domain) & runs["variant"].isin(variants)]
    wall = here["run_dir"].map(lambda run_dir: read_record(Path(run_dir)).wall_time_s)
    per_variant = wall.groupby(here["variant"]).sum() / here.groupby("variant")["seed"].nunique()
    return float(per_variant.sum()) / 3600.0


def plan_power(runs: pd.DataFrame, path: Path, protocol: str | None = None,
               claims_piloted: Collection[str] = ()) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """Per claim and per domain, the seeds, effects and hours at Holm's first step (``_holm``) and at α
    (``_alpha``), and the plan's levels. ``runs``: the pilot's (``runners.results.frame.load_runs``), of which those of
    ``protocol`` (default: the plan's own; a replication plans from the first study's protocol) are read.
    ``claims_piloted``: the ids of the claims the pilot ran, where it ran some only (the levels are the whole plan's)."""
    plan = read_plan(path)
    if unknown := sorted(set(claims_piloted) - {h.id for h in plan.hypotheses}):
        raise ConfigError(f"{path} has no claim {', '.join(unknown)}")
    protocol = protocol or plan.protocol
    pilot = runs[runs["protocol"] == protocol]
    if pilot.empty:
        raise ConfigError(f"no pilot run of protocol {protocol!r}; the runs have {', '.join(map(repr, runs['protocol'].unique()))}")
    levels = {"holm": holm_first_step(plan), "alpha": plan.alpha}
    claims = []
    for claim in plan.hypotheses:
        if claims_piloted and claim.id not in claims_piloted:
            continue
        sd, pairs = pilot_sd(pilot, claim)
        row = {"id": claim.id, "domain": claim.domain, "metric": claim.metric,
               "contrast": f"{claim.variant} − {claim.against}", "pairs": pairs, "sd": sd,
               "target": np.nan if claim.target is None else claim.target,
               "seed_hours": seed_hours(pilot, claim.domain, {claim.variant, claim.against})}
        for level, alpha in levels.items():
            n = seeds_needed(sd, claim.target, alpha) if claim.target is not None else len(claim.seeds)
            row |= {f"n_{level}": n, f"mde_{level}": mde(sd, n, alpha), f"hours_{level}": n * row["seed_hours"]}
        claims.append(row)
    claims = pd.DataFrame(claims)
    domains = []  # one row per variant of a domain: a claim's seeds train both its variants, shared with other claims
    for domain in claims["domain"].unique():
        sized = {h.id: h for h in plan.hypotheses}
        claimed = [(sized[row["id"]], row) for _, row in claims.iterrows() if row["domain"] == domain]
        for variant in dict.fromkeys(v for h, _ in claimed for v in (h.variant, h.against)):
            row = {"domain": domain, "variants": variant, "seed_hours": seed_hours(pilot, domain, {variant})}
            for level in levels:
                n = max(int(claim[f"n_{level}"]) for h, claim in claimed if variant in (h.variant, h.against))
                row |= {f"n_{level}": n, f"hours_{level}": n * row["seed_hours"]}
            domains.append(row)
    return claims, pd.DataFrame(domains), {"alpha": plan.alpha, "family": len(plan.hypotheses), **levels}
