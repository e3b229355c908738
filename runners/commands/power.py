"""`quest power --plan PREREGISTRATION.md <pilot runs dir> ... [--json FILE]`: the seeds and compute a
pre-registered plan needs, from the records of a pilot.

Per claim of the plan (``runners.results.sample_size``): the paired standard deviation of its contrast on the pilot's
runs of the plan's protocol, and, for a claim with a ``target:`` (the smallest difference worth detecting, in its
metric's units), the fewest seeds whose minimum detectable effect (two-sided paired t-test, 80% power) is at most
the target, that effect, and the hours of training those seeds take (the pilot's training wall time per seed of
the two variants, every run of a claim's grid counted). A claim without a target is shown at the plan's seeds.
Each at Holm's first step (α over the number of claims: the level a claim is sure to be tested at) and at α (the
level of Holm's last step). Then per domain, where a seed trains every variant the domain's claims use once, and the
plan's total. ``--claims`` sizes only the claims the pilot ran; the levels stay the whole plan's.
"""
from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import pandas as pd

from common.arguments import CommandParser
from common.errors import ConfigError
from common.files import write_atomic
from runners.results.frame import load_runs
from runners.results.sample_size import plan_power
from runners.results.stats import estimate

_number = partial(estimate, spec=".3g")


def _claims_table(claims: pd.DataFrame, levels: dict) -> str:
    shown = pd.DataFrame({"claim": claims["id"], "metric": claims["metric"], "contrast": claims["contrast"],
                          "pilot pairs": claims["pairs"], "paired sd": claims["sd"].map(_number),
                          "target": claims["target"].map(_number)})
    for level, name in (("holm", f"α/m = {levels['holm']:.3g}"), ("alpha", f"α = {levels['alpha']:g}")):
        from_target = claims["target"].notna()
        shown[f"seeds ({name})"] = [f"{n}" if has else f"{n} (plan)" for n, has in zip(claims[f"n_{level}"], from_target)]
        shown[f"MDE ({name})"] = claims[f"mde_{level}"].map(_number)
        shown[f"hours ({name})"] = claims[f"hours_{level}"].map(lambda h: f"{h:.2f}")
    return shown.to_markdown(index=False)


def _domains_table(domains: pd.DataFrame, levels: dict) -> str:
    shown = pd.DataFrame({"domain": domains["domain"], "variant": domains["variants"],
                          "hours per run": domains["seed_hours"].map(lambda h: f"{h:.3f}")})
    for level, name in (("holm", f"α/m = {levels['holm']:.3g}"), ("alpha", f"α = {levels['alpha']:g}")):
        shown[f"seeds ({name})"] = domains[f"n_{level}"]
        shown[f"hours ({name})"] = domains[f"hours_{level}"].map(lambda h: f"{h:.2f}")
    return shown.to_markdown(index=False)


def main(argv: list[str]) -> int:
    parser = CommandParser("quest power", __doc__)
    parser.add_argument("pilot", nargs="+", help="directories of the pilot's runs (searched for record.json)")
    parser.add_argument("--plan", type=Path, required=True, metavar="PREREGISTRATION_MD",
                        help="the analysis plan: a markdown file with one ```yaml block (runners.results.confirmatory)")
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write the tables and levels as JSON")
    parser.add_argument("--protocol", metavar="NAME",
                        help="the pilot runs' protocol (default: the plan's; a replication labelled 'tuned, confirmation "
                        "2' plans from the first study's 'tuned' runs)")
    parser.add_argument("--claims", type=lambda text: [c for c in text.split(",") if c], default=[], metavar="ID,ID,...",
                        help="size only these claims, the ones the pilot ran (the test levels stay the whole plan's)")
    args = parser.parse_args(argv)
    if not args.plan.is_file():
        raise ConfigError(f"{args.plan}: no such plan file")
    runs = load_runs(*args.pilot)
    claims, domains, levels = plan_power(runs, args.plan, args.protocol, args.claims)
    print(f"Pilot: {len(runs)} run records under {', '.join(args.pilot)}. Test levels: α/m = {levels['alpha']:g}/"
          f"{levels['family']}, Holm's first step, the level each claim is sure to be tested at; and α, the level of "
          f"Holm's last step, reached only when every other claim is rejected first. Claims without a target are at "
          f"their seeds in the plan. Hours: the records' training wall time on the pilot's machine "
          f"(evaluations run after training, `quest robustness`, are not in it).\n")
    print(_claims_table(claims, levels) + "\n")
    print(_domains_table(domains, levels) + "\n")
    print(f"Total: {domains['hours_holm'].sum():.2f} hours at α/m, {domains['hours_alpha'].sum():.2f} hours at α.")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(args.json, json.dumps({
            "levels": levels, "claims": json.loads(claims.to_json(orient="records", double_precision=15)),
            "domains": json.loads(domains.to_json(orient="records", double_precision=15)),
            "total_hours": {level: float(domains[f"hours_{level}"].sum()) for level in ("holm", "alpha")}}, indent=1) + "\n")
    return 0
