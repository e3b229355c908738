"""The confirmatory section of RESULTS.md (``quest aggregate --confirm RESULTS/preregistration.md``): hypotheses, test,
α, correction family, protocol and seeds fixed in a committed file before its runs, and computed from those
runs alone.

The file is markdown for people with one fenced ``yaml`` block for this module::

    protocol: tuned              # the runs' protocol label (runners.results.runs)
    seeds: [5, 6, 7]             # the pre-registered seeds: no other run enters
    recipe_seeds: [5, 6, 7]      # the same-recipe runs whose attention ablation decides if a domain can rank
    alpha: 0.05                  # two-sided paired t-tests (pairs by seed), Holm over every hypothesis tested
    hypotheses:
      - {id: H1-vision, claim: ..., domain: vision, metric: acc, variant: quest, against: standard}
        # a hypothesis may add target: 0.01, the difference worth detecting in its metric's units (quest power)

A hypothesis is *supported* where the Holm-adjusted p is below α in the claimed direction (the variant better),
*contradicted* where it is below α the other way, *cannot tell* otherwise (*no paired runs* where no pair has the
metric yet). One whose domain cannot rank variants (``runners.results.stats.attention_matters`` on the same-recipe
runs at ``recipe_seeds``) is reported as such and left out of the family, by the rule written in the file. A pair
with a run that did not finish ok is dropped and counted. The section also says whether the file's commit precedes every confirmatory run's.
"""
from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from common.errors import ConfigError
from runners.results.runs import direction, second_setting
from runners.results.stats import attention_matters, detectable, half_width, holm, paired_p

PLAN = re.compile(r"^```yaml\n(.*?)^```", re.MULTILINE | re.DOTALL)
FIELDS = {"id", "claim", "domain", "metric", "variant", "against"}


def read_plan(path: Path) -> dict:
    """The plan in ``path``'s first fenced yaml block, checked; a ``ConfigError`` names what is missing."""
    found = PLAN.search(path.read_text())
    if not found:
        raise ConfigError(f"{path}: no ```yaml block holds the analysis plan")
    try:
        plan = yaml.safe_load(found.group(1))
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: the plan is not valid YAML ({str(err).splitlines()[0]})") from None
    if not isinstance(plan, dict):
        raise ConfigError(f"{path}: the plan is a mapping of protocol, seeds, recipe_seeds, alpha and hypotheses")
    missing = {"protocol", "seeds", "recipe_seeds", "alpha", "hypotheses"} - set(plan)
    if missing:
        raise ConfigError(f"{path}: the plan lacks {', '.join(sorted(missing))}")
    if not isinstance(plan["hypotheses"], list) or not all(isinstance(h, dict) for h in plan["hypotheses"]):
        raise ConfigError(f"{path}: hypotheses must be a list of mappings ({', '.join(sorted(FIELDS))})")
    for hypothesis in plan["hypotheses"]:
        if lacking := FIELDS - set(hypothesis):
            raise ConfigError(f"{path}: hypothesis {hypothesis.get('id', '?')} lacks {', '.join(sorted(lacking))}")
        target = hypothesis.get("target")  # optional: the difference worth detecting (quest power)
        if "target" in hypothesis and (isinstance(target, bool) or not isinstance(target, (int, float)) or not target > 0):
            raise ConfigError(f"{path}: hypothesis {hypothesis['id']}: target must be a positive number "
                              f"in {hypothesis['metric']}'s units, got {target!r}")
    return plan


def _pairs(runs: pd.DataFrame, h: dict, seeds: list[int]) -> tuple[pd.Series, int]:
    """Per seed, the variant's metric less its comparator's (signed so that positive favours the variant), and
    how many seeds lost a pair to a run that did not finish ok."""
    wanted = runs[(runs["domain"] == h["domain"]) & runs["seed"].isin(seeds)]
    sides = {}
    dropped = set()
    for side in ("variant", "against"):
        arm = wanted[wanted["variant"] == h[side]]
        dropped |= set(arm.loc[arm["status"] != "ok", "seed"])
        ok = arm[arm["status"] == "ok"]
        sides[side] = ok.set_index("seed")[h["metric"]] if h["metric"] in ok else pd.Series(dtype=float)
    pairs = pd.concat(sides, axis=1).dropna()
    sign = -1.0 if len(wanted) and direction(wanted, h["metric"]) == "min" else 1.0
    return sign * (pairs["variant"] - pairs["against"]), len(dropped)


def tests(runs: pd.DataFrame, plan: dict) -> pd.DataFrame:
    """One row per hypothesis: n, the difference (positive favours the claimed variant), its 95% interval, p,
    Holm p over the family, minimum detectable effect, and the verdict."""
    confirm = runs[runs["protocol"] == plan["protocol"]]
    recipe = runs[(runs["protocol"] == "same recipe") & runs["seed"].isin(plan["recipe_seeds"])]
    rows = []
    for h in plan["hypotheses"]:
        diff, dropped = _pairs(confirm, h, plan["seeds"])
        domain_recipe = recipe[recipe["domain"] == h["domain"]]
        ranks = attention_matters(domain_recipe) if len(domain_recipe) else None
        rows.append({"id": h["id"], "claim": h["claim"], "domain": h["domain"], "metric": h["metric"],
                     "contrast": f"{h['variant']} − {h['against']}", "n": len(diff), "dropped": dropped,
                     "diff": diff.mean() if len(diff) else np.nan, "half": half_width(diff), "p": paired_p(diff),
                     "mde": detectable(diff.std(), len(diff)), "ranks": ranks is None or ranks[0]})
    table = pd.DataFrame(rows)
    family = table["ranks"] & table["p"].notna()
    table["p_holm"] = np.nan
    if family.any():
        table.loc[family, "p_holm"] = holm(table.loc[family, "p"]).values
    table["verdict"] = [_verdict(row, plan["alpha"]) for _, row in table.iterrows()]
    return table


def setting_change(runs: pd.DataFrame, h: dict, protocol: str, setting: str, seeds: list[int]) -> pd.Series:
    """Per seed run under both, how much a contrast (``h``: domain, metric, variant, against; signed so that positive
    favours the variant) moves from ``protocol``'s runs to ``setting``'s ("tuned" to "tuned, PyTorch init"): the
    difference of the two paired differences, whose paired t-test over seeds asks whether the setting changes it."""
    first, _ = _pairs(runs[runs["protocol"] == protocol], h, seeds)
    second, _ = _pairs(runs[runs["protocol"] == setting], h, seeds)
    return (second - first).dropna()


def under_second_settings(runs: pd.DataFrame, plan: dict, table: pd.DataFrame) -> pd.DataFrame:
    """Exploratory: per second setting of the plan's protocol (a sweep's ``label``, "tuned, PyTorch init") and per
    hypothesis on its domain's primary metric (the accuracy claims, which the plan's init check names), the same
    paired test on that setting's runs at the plan's seeds, Holm over the hypotheses re-tested in the domain
    under the setting, beside the confirmatory verdict; and whether the setting changes the contrast
    (``setting_change``, uncorrected). Empty where no such setting ran."""
    rows = []
    for protocol in sorted(p for p in runs["protocol"].unique() if p.startswith(f"{plan['protocol']}, ")):
        setting = runs[runs["protocol"] == protocol]
        for domain, in_domain in setting.groupby("domain"):
            primary = in_domain["primary_metric"].iloc[0]
            found = []
            for h, (_, confirmed) in zip(plan["hypotheses"], table.iterrows()):
                if h["domain"] != domain or h["metric"] != primary or not confirmed["ranks"]:
                    continue
                diff, _ = _pairs(in_domain, h, plan["seeds"])
                change = setting_change(runs, h, plan["protocol"], protocol, plan["seeds"])
                found.append({"id": h["id"], "setting": second_setting(protocol), "n": len(diff),
                              "diff": diff.mean() if len(diff) else np.nan, "half": half_width(diff),
                              "p": paired_p(diff), "ranks": True, "confirmed": confirmed["verdict"],
                              "confirmed_diff": confirmed["diff"], "change": change.mean() if len(change) else np.nan,
                              "change_half": half_width(change), "change_n": len(change), "change_p": paired_p(change)})
            if found:
                found = pd.DataFrame(found)
                tested = found["p"].notna()
                found["p_holm"] = np.nan
                if tested.any():
                    found.loc[tested, "p_holm"] = holm(found.loc[tested, "p"]).values
                rows.append(found)
    if not rows:
        return pd.DataFrame()
    found = pd.concat(rows, ignore_index=True)
    found["verdict"] = [_verdict(row, plan["alpha"]) for _, row in found.iterrows()]
    return found


def _verdict(row: pd.Series, alpha: float) -> str:
    if row["n"] == 0:
        return "no paired runs"
    if not row["ranks"]:
        return "cannot rank variants here"
    if np.isnan(row["p_holm"]) or row["p_holm"] >= alpha:
        return "cannot tell"
    return "supported" if row["diff"] > 0 else "contradicted"


def _commit_of(path: Path) -> str | None:
    try:
        found = subprocess.run(["git", "log", "-1", "--format=%H", "--", path.name], cwd=path.parent,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return found or None


def _precedes(first: str, later: str, where: Path) -> bool:
    return subprocess.run(["git", "merge-base", "--is-ancestor", first, later], cwd=where,
                          capture_output=True).returncode == 0


def provenance(path: Path, runs: pd.DataFrame) -> str:
    """Whether the plan's commit is an ancestor of every confirmatory run's commit (read from its record)."""
    planned = _commit_of(path)
    if planned is None:
        return f"`{path}` is not committed: nothing shows the plan came before the runs."
    commits = set()
    for run_dir in runs["run_dir"]:
        commit = json.loads((Path(run_dir) / "record.json").read_text()).get("git_commit") or "unknown"
        commits.add(commit.removesuffix("+dirty"))
    later = [c for c in commits if c != "unknown" and _precedes(planned, c, path.parent)]
    verdict = ("every run's commit descends from it" if len(later) == len(commits) else
               f"{len(commits) - len(later)} of {len(commits)} run commits do not descend from it (or are unknown)")
    return f"The plan was committed in `{planned[:12]}`; {verdict}."


def section(runs: pd.DataFrame, path: Path) -> list[str]:
    """The confirmatory section's markdown."""
    plan = read_plan(path)
    table = tests(runs, plan)
    used = runs[(runs["protocol"] == plan["protocol"]) & runs["seed"].isin(plan["seeds"])]
    shown = pd.DataFrame({
        "hypothesis": table["id"], "claim": table["claim"], "metric": table["metric"], "contrast": table["contrast"],
        "n (dropped)": [f"{n} ({d})" for n, d in zip(table["n"], table["dropped"])],
        "difference ± 95% (+ favours the claim)": [_difference(d, h) for d, h in zip(table["diff"], table["half"])],
        "p": table["p"].map(lambda p: "–" if np.isnan(p) else f"{p:.2g}"),
        "Holm p": table["p_holm"].map(lambda p: "–" if np.isnan(p) else f"{p:.2g}"),
        "MDE (80%)": table["mde"].map(lambda m: "–" if np.isnan(m) else f"{m:.2g}"),
        "verdict": table["verdict"]})
    counts = table["verdict"].value_counts()
    return ["## Confirmatory tests", "",
            f"Pre-registered in `{path}`: {plan['protocol']} protocol, seeds {plan['seeds']} only, two-sided paired "
            f"t-tests by seed, α = {plan['alpha']}, Holm's correction over the {int((table['ranks'] & table['p'].notna()).sum())} "
            f"hypotheses tested. {provenance(path, used) if len(used) else 'No confirmatory run yet.'}", "",
            shown.to_markdown(index=False), "",
            "Verdicts: " + ", ".join(f"{n} {verdict}" for verdict, n in counts.items()) + ".", "",
            *_second_setting_lines(under_second_settings(runs, plan, table))]


def _second_setting_lines(found: pd.DataFrame) -> list[str]:
    if found.empty:
        return []
    shown = pd.DataFrame({
        "hypothesis": found["id"], "setting": found["setting"], "n": found["n"],
        "difference ± 95% (+ favours the claim)": [_difference(d, h) for d, h in zip(found["diff"], found["half"])],
        "p": found["p"].map(lambda p: "–" if np.isnan(p) else f"{p:.2g}"),
        "Holm p (domain)": found["p_holm"].map(lambda p: "–" if np.isnan(p) else f"{p:.2g}"),
        "verdict under the setting": found["verdict"], "confirmatory verdict": found["confirmed"],
        "same direction": ["yes" if np.sign(a) == np.sign(b) else "no" for a, b in zip(found["diff"], found["confirmed_diff"])],
        "same verdict": ["yes" if a == b else "no" for a, b in zip(found["verdict"], found["confirmed"])],
        "change under the setting ± 95% (n, p)": [
            f"{_difference(d, h)} (n={n}{'' if np.isnan(p) else f', p={p:.2g}'})"
            for d, h, n, p in zip(found["change"], found["change_half"], found["change_n"], found["change_p"])]})
    return ["Exploratory, as the plan says: each accuracy claim (the domain's primary metric) re-tested on a second "
            "setting's runs (a sweep's `select: label:`, such as another init) at the plan's seeds, with the same "
            "paired test and Holm's correction over the claims re-tested in that domain under that setting. Whether "
            "the setting changes the claim's difference is tested directly: per seed run under both, the difference "
            "under the setting less the one under the plan's protocol, paired t-test over those seeds (uncorrected).",
            "", shown.to_markdown(index=False), ""]


def _difference(diff: float, half: float) -> str:
    return "–" if np.isnan(diff) else f"{diff:+.3g}" if np.isnan(half) else f"{diff:+.3g} ± {half:.2g}"
