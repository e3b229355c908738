"""The confirmatory section of RESULTS.md (``quest aggregate --confirm RESULTS/preregistration.md``): hypotheses, test,
α, correction family, protocol and seeds fixed in a committed file before its runs, and computed from those
runs alone.

The file is markdown for people with one fenced ``yaml`` block for this module, a ``Plan`` (its keys and what
each means)::

    protocol: tuned
    seeds: {first: 5, count: 7}
    recipe_seeds: [5, 6, 7]
    alpha: 0.05
    hypotheses:
      - {id: H1-vision, claim: ..., domain: vision, metric: acc, variant: quest, against: standard, target: 0.01}

A hypothesis is *supported* where the Holm-adjusted p is below α in the claimed direction (the variant better),
*contradicted* where it is below α the other way, *cannot tell* otherwise (*no paired runs* where no pair has the
metric yet). One whose domain cannot rank variants (``runners.results.stats.attention_matters`` on the same-recipe
runs at ``recipe_seeds``) is reported as such and left out of the family, by the rule written in the file; every
other one is in it, one without a test yet (fewer than two pairs) as p = 1, so that the family is the one
registered however many runs are in. A pair
with a run that did not finish ok is dropped and counted. A hypothesis with a ``target`` is *powered* where its
minimum detectable effect (``stats.detectable``, the formula the first plan registered) is at most the target.
"""
from __future__ import annotations

import re
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
import pandas as pd
from pydantic import AfterValidator, Field, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

from common.errors import ConfigError
from common.files import MAX_DOCUMENT_BYTES, FileError, parse_yaml, read_text
from common.records import read_record
from common.schema import MAX_SEED
from common.typed import Model, first_problem, said
from runners.results.endpoints import ENDPOINTS, FINAL_LOSS, claim_runs, grid_differences
from runners.results.frame import direction, second_setting
from runners.results.stats import attention_matters, detectable, estimate, half_width, holm, paired_p

PLAN = re.compile(r"^```yaml\n(.*?)^```", re.MULTILINE | re.DOTALL)
MAX_PLAN_SEEDS = 10_000  # seeds a plan may list: far beyond any study's runs
FIELDS = {"id", "claim", "domain", "metric", "variant", "against"}
_two_digits = partial(estimate, spec=".2g")  # p-values and MDEs


class SeedRun(Model):
    """Seeds written as a run: ``{first: 200, count: 120}`` is 200, 201, ..., 319."""

    first: Annotated[int, Field(ge=0)]
    count: Annotated[int, Field(gt=0, le=MAX_PLAN_SEEDS)]
    """How many seeds: bounded before their list is made."""


def _seed_list(seeds: list[int] | SeedRun) -> list[int]:
    """A run of seeds as its list, whose last must be a run's seed too."""
    if isinstance(seeds, SeedRun):
        seeds = list(range(seeds.first, seeds.first + seeds.count))
        if seeds[-1] > MAX_SEED:
            raise ValueError("past the last seed")  # said as the key's phrase
    return seeds


Seeds = Annotated[Annotated[list[Annotated[int, Field(ge=0, le=MAX_SEED)]], Field(min_length=1, max_length=MAX_PLAN_SEEDS)]
                  | SeedRun, AfterValidator(_seed_list),
                  said(f"{{key}} must be a list of 1 to {MAX_PLAN_SEEDS} seeds from 0 to {MAX_SEED}, or {{first: <seed>, count: <n>}}")]
Text = Annotated[str, said(f"{', '.join(sorted(FIELDS))} must be strings")]


class Hypothesis(Model):
    """One claim of a plan: ``variant`` beats ``against`` on ``domain``'s ``metric``, in pairs by seed."""

    id: Text
    """Its name in the tables: one claim in a plan, one contrast in every plan that holds it."""
    claim: Text
    domain: Text
    """The domain whose runs test it."""
    metric: Text
    """A test metric of the domain's records, without ``test/`` (``acc``, ``miou_corrupt``)."""
    variant: Text
    """The variant claimed better."""
    against: Text
    """The variant it is compared with."""
    target: Annotated[Annotated[float, Field(gt=0)] | None, said("target must be a positive number in {metric}'s units")] = None
    """The difference worth detecting, in the metric's units (``quest power``)."""
    seeds: Seeds | None = None
    """The seeds this claim is tested on, all among the plan's (default: the plan's)."""
    over: list[str] = []
    """Config keys (``optim.lr``) whose grid one seed's ``endpoint`` spans: every run of the seed at each of their
    values, read at its final checkpoint (``runners.results.endpoints``). Empty: one run per seed and variant."""
    endpoint: Literal[ENDPOINTS] | None = None
    """With ``over``: lr_sensitivity (Wortsman et al.'s, of ``metric: final_loss``) or mean (a success rate)."""
    where: dict[str, str | int | float | bool] = {}
    """Config settings the claim's runs have (``{model.dim: 128}``): one claim per width, say."""

    @model_validator(mode="after")
    def _grid(self) -> Hypothesis:
        if bool(self.over) != (self.endpoint is not None):
            raise PydanticCustomError("rule", f"hypothesis {self.id}: over and endpoint go together (a grid and what is read over it)")
        if (self.endpoint == "lr_sensitivity") != (self.metric == FINAL_LOSS):
            raise PydanticCustomError("rule", f"hypothesis {self.id}: lr_sensitivity is read from metric {FINAL_LOSS}, "
                                      "and that metric only over a grid")
        return self

    @property
    def contrast(self) -> str:
        """What the claim compares, in words: one id names one contrast in every plan that holds it."""
        what = f"{self.endpoint} of {self.metric} over {', '.join(self.over)}" if self.over else self.metric
        where = "".join(f", {key} = {value}" for key, value in self.where.items())
        return f"{self.variant} − {self.against} on {self.domain}'s {what}{where}"


class Plan(Model):
    """A pre-registered analysis plan: the first fenced yaml block of its markdown file."""

    protocol: Annotated[str, said("protocol must be a protocol label (a string)")]
    """The runs' protocol label (``runners.results.frame``)."""
    seeds: Seeds
    """The pre-registered seeds: no other run enters."""
    recipe_seeds: Seeds = []
    """The same-recipe runs whose attention ablation decides whether a domain can rank variants (none: no domain is
    checked, as in a study of training stability, which needs no ablation to be told apart)."""
    alpha: Annotated[float, Field(gt=0, lt=1), said("alpha must be a number between 0 and 1")]
    """The level of the two-sided paired t-tests (pairs by seed), Holm over every hypothesis that can rank."""
    hypotheses: list[Hypothesis]
    """The claims: at least one, each id once."""

    @field_validator("hypotheses")
    @classmethod
    def _claims(cls, hypotheses: list[Hypothesis], info: ValidationInfo) -> list[Hypothesis]:
        if not hypotheses:
            raise PydanticCustomError("rule", "the plan lists no hypotheses")
        ids = [h.id for h in hypotheses]
        if twice := sorted({i for i in ids if ids.count(i) > 1}):
            raise PydanticCustomError("rule", f"hypothesis id {', '.join(twice)} is used more than once")
        seeds = info.data.get("seeds", [])  # [] where they are wrong, which is said first
        for h in hypotheses:
            if outside := sorted(set(h.seeds or seeds) - set(seeds)):
                raise PydanticCustomError("rule", f"hypothesis {h.id}: seeds {outside} are not among the plan's seeds")
        return [h if h.seeds else h.model_copy(update={"seeds": seeds}) for h in hypotheses]


def read_plan(path: Path) -> Plan:
    """The plan in ``path``'s first fenced yaml block, read as data (``common.files``) and validated as a ``Plan``; a
    ``ConfigError`` names what is missing or out of range."""
    found = PLAN.search(read_text(path, "analysis plan", MAX_DOCUMENT_BYTES))
    if not found:
        raise ConfigError(f"{path}: no ```yaml block holds the analysis plan")
    try:
        plan = parse_yaml(found.group(1), path)
    except FileError as err:
        raise ConfigError(f"{path}: the plan is not valid YAML ({err.reason})") from None
    if not isinstance(plan, dict):
        raise ConfigError(f"{path}: the plan is a mapping of protocol, seeds, recipe_seeds, alpha and hypotheses")
    try:
        return Plan.model_validate(plan)
    except ValidationError as err:
        raise ConfigError(f"{path}: {_problem(plan, err)}") from None


def _problem(plan: dict, err: ValidationError) -> str:
    """The first problem in the plan's words: what is wrong with which key (of which hypothesis), and the value."""
    errors = err.errors(include_url=False)
    _, reason, value = first_problem(err)
    loc, kind = errors[0]["loc"], errors[0]["type"]
    within = f"hypothesis {plan['hypotheses'][loc[1]].get('id', '?')}" if len(loc) > 2 else ""
    if kind in ("missing", "extra_forbidden"):  # every key of its mapping at once
        keys = ", ".join(sorted(str(e["loc"][-1]) for e in errors if e["type"] == kind and e["loc"][:-1] == loc[:-1]))
        return f"{within or 'the plan'} {'lacks' if kind == 'missing' else 'has unknown key(s)'} {keys}"
    if kind == "rule":
        return reason
    if kind == "said":
        return f"{within + ': ' if within else ''}{reason}, got {value!r}"
    if loc[0] == "hypotheses" and len(loc) < 3:  # the list, or an item of it, of another type
        return f"hypotheses must be a list of mappings ({', '.join(sorted(FIELDS))}), got {value!r}"
    return f"{within or 'the plan'}: {loc[-1]} {reason}, got {value!r}"


def seed_text(seeds: list[int]) -> str:
    """A long run of seeds without a gap (``[200, ..., 319]``) as "200–319", else the list."""
    if len(seeds) > 10 and seeds == list(range(seeds[0], seeds[0] + len(seeds))):
        return f"{seeds[0]}–{seeds[-1]}"
    return str(seeds)


def read_plans(paths: Sequence[Path]) -> list[Plan]:
    """Each plan (``read_plan``). A hypothesis id two plans share must name the same contrast in both: their
    columns stand side by side as one claim tested twice."""
    if twice := sorted({str(p) for p in paths if list(paths).count(p) > 1}):
        raise ConfigError(f"{', '.join(twice)}: the same plan given twice")
    plans = [read_plan(path) for path in paths]
    first = {}
    for path, plan in zip(paths, plans):
        for h in plan.hypotheses:
            where, tested = first.setdefault(h.id, (path, h.contrast))
            if tested != h.contrast:
                raise ConfigError(f"{path}: hypothesis {h.id} tests {h.contrast}, but {tested} in {where}")
    return plans


def holm_first_step(plan: Plan) -> float:
    """α over the plan's hypotheses: Holm's first step, the level a claim is sure to be tested at whatever the others do."""
    return plan.alpha / len(plan.hypotheses)


def mde_level(plan: Plan) -> float:
    """The level a plan's minimum detectable effects are computed at, as each plan registers it: a plan with
    targets is sized at Holm's first step (``quest power``) and judges "powered" there; one without, at α."""
    targeted = any(h.target is not None for h in plan.hypotheses)
    return holm_first_step(plan) if targeted else plan.alpha


def claim_differences(runs: pd.DataFrame, h: Hypothesis, seeds: list[int]) -> tuple[pd.Series, int]:
    """Per seed, the variant's metric less its comparator's (signed so that positive favours the variant), and
    how many seeds lost a pair to a run that did not finish ok; a claim over a grid compares the seed's endpoints
    (``runners.results.endpoints``)."""
    if h.over:
        return grid_differences(runs, h, seeds)
    wanted = runs[(runs["domain"] == h.domain) & runs["seed"].isin(seeds)]
    sides = {}
    dropped = set()
    for side in ("variant", "against"):
        arm = wanted[wanted["variant"] == getattr(h, side)]
        dropped |= set(arm.loc[arm["status"] != "ok", "seed"])
        ok = arm[arm["status"] == "ok"]
        sides[side] = ok.set_index("seed")[h.metric] if h.metric in ok else pd.Series(dtype=float)
    pairs = pd.concat(sides, axis=1).dropna()
    sign = -1.0 if len(wanted) and direction(wanted, h.metric) == "min" else 1.0
    return sign * (pairs["variant"] - pairs["against"]), len(dropped)


def tests(runs: pd.DataFrame, plan: Plan) -> pd.DataFrame:
    """One row per hypothesis: the seeds run, n, the difference (positive favours the claimed variant), its 95%
    interval, p, Holm p over the family, minimum detectable effect at ``mde_level``, the target (NaN where none), and
    the verdict."""
    confirm = runs[runs["protocol"] == plan.protocol]
    recipe = runs[(runs["protocol"] == "same recipe") & runs["seed"].isin(plan.recipe_seeds)]
    rows = []
    for h in plan.hypotheses:
        diff, dropped = claim_differences(confirm, h, h.seeds)
        wanted = confirm[(confirm["domain"] == h.domain) & confirm["seed"].isin(h.seeds)]
        if h.where:
            wanted, _ = claim_runs(wanted, h)
        both = set.intersection(*(set(wanted.loc[wanted["variant"] == side, "seed"]) for side in (h.variant, h.against)))
        domain_recipe = recipe[recipe["domain"] == h.domain]
        ranks = attention_matters(domain_recipe) if len(domain_recipe) else None
        rows.append({"id": h.id, "claim": h.claim, "domain": h.domain, "metric": _measured(h),
                     "contrast": f"{h.variant} − {h.against}", "n": len(diff), "dropped": dropped,
                     "diff": diff.mean(), "half": half_width(diff), "p": paired_p(diff),
                     "mde": detectable(diff.std(), len(diff), mde_level(plan)), "target": np.nan if h.target is None else h.target,
                     "seeds": len(both), "planned": len(h.seeds),  # seeds with both sides run, finished or not
                     "ranks": ranks is None or ranks[0]})
    table = pd.DataFrame(rows)
    # The family is every claim that can rank, as registered: one without a test (fewer than two pairs, differences
    # all equal) stays in it as p = 1 rather than shrinking it, which would loosen the others' correction.
    adjusted = holm(table.loc[table["ranks"], "p"].fillna(1.0))
    table["p_holm"] = adjusted.where(table["p"].notna())  # NaN outside the family and where there is no test
    table["verdict"] = ["runs not yet made" if row["seeds"] == 0 else _verdict(row, plan.alpha)
                        for _, row in table.iterrows()]
    return table


def _measured(h: Hypothesis) -> str:
    """The metric column of a claim: the metric, or its endpoint over the grid, and the settings it holds to."""
    what = f"{h.endpoint} of {h.metric} over {', '.join(h.over)}" if h.over else h.metric
    return what + "".join(f" ({key} = {value})" for key, value in h.where.items())


def setting_change(runs: pd.DataFrame, h: Hypothesis, protocol: str, setting: str, seeds: list[int]) -> pd.Series:
    """Per seed run under both, how much a contrast (``h``: domain, metric, variant, against; signed so that positive
    favours the variant) moves from ``protocol``'s runs to ``setting``'s ("tuned" to "tuned, PyTorch init"): the
    difference of the two paired differences, whose paired t-test over seeds asks whether the setting changes it."""
    first, _ = claim_differences(runs[runs["protocol"] == protocol], h, seeds)
    second, _ = claim_differences(runs[runs["protocol"] == setting], h, seeds)
    return (second - first).dropna()


def under_second_settings(runs: pd.DataFrame, plan: Plan, table: pd.DataFrame) -> pd.DataFrame:
    """Exploratory: per second setting of the plan's protocol (a sweep's ``label``, "tuned, PyTorch init") and per
    hypothesis on its domain's primary metric (the accuracy claims, which the plan's init check names), the same
    paired test on that setting's runs at the plan's seeds, Holm over the hypotheses re-tested in the domain
    under the setting, beside the confirmatory verdict; and whether the setting changes the contrast
    (``setting_change``, uncorrected). Empty where no such setting ran at the plan's seeds (a replication at
    seeds of its own, labelled as a setting of the same protocol, is another plan's runs, not a second setting)."""
    rows = []
    settings = runs[runs["protocol"].str.startswith(f"{plan.protocol}, ") & runs["seed"].isin(plan.seeds)]
    for (protocol, domain), in_domain in settings.groupby(["protocol", "domain"]):
        primary = in_domain["primary_metric"].iloc[0]
        found = []
        for h, (_, confirmed) in zip(plan.hypotheses, table.iterrows()):
            if h.domain != domain or h.metric != primary or not confirmed["ranks"]:
                continue
            diff, _ = claim_differences(in_domain, h, h.seeds)
            change = setting_change(runs, h, plan.protocol, protocol, h.seeds)
            found.append({"id": h.id, "setting": second_setting(protocol), "n": len(diff), "diff": diff.mean(),
                          "half": half_width(diff), "p": paired_p(diff), "ranks": True, "confirmed": confirmed["verdict"],
                          "confirmed_diff": confirmed["diff"], "change": change.mean(), "change_half": half_width(change),
                          "change_n": len(change), "change_p": paired_p(change)})
        if found:
            found = pd.DataFrame(found)
            rows.append(found.assign(p_holm=holm(found["p"].dropna())))
    if not rows:
        return pd.DataFrame()
    found = pd.concat(rows, ignore_index=True)
    found["verdict"] = [_verdict(row, plan.alpha) for _, row in found.iterrows()]
    return found


def _verdict(row: pd.Series, alpha: float) -> str:
    if row["n"] == 0:
        return "no paired runs"
    if not row["ranks"]:
        return "cannot rank variants here"
    if np.isnan(row["p_holm"]) or row["p_holm"] >= alpha:
        return "cannot tell"
    return "supported" if row["diff"] > 0 else "contradicted"


def provenance(path: Path, runs: pd.DataFrame) -> str:
    """Whether the plan's commit is an ancestor of every confirmatory run's commit (read from its record)."""
    try:
        planned = subprocess.run(["git", "log", "-1", "--format=%H", "--", path.name], cwd=path.parent,
                                 capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        planned = ""
    if not planned:
        return f"`{path}` is not committed: nothing shows the plan came before the runs."
    # records load_runs has read already
    commits = {(read_record(run_dir).git_commit or "unknown").removesuffix("+dirty") for run_dir in runs["run_dir"]}
    later = [c for c in commits if c != "unknown" and subprocess.run(
        ["git", "merge-base", "--is-ancestor", planned, c], cwd=path.parent, capture_output=True).returncode == 0]
    verdict = ("every run's commit descends from it" if len(later) == len(commits) else
               f"{len(commits) - len(later)} of {len(commits)} run commits do not descend from it (or are unknown)")
    return f"The plan was committed in `{planned[:12]}`; {verdict}."


@dataclass
class Confirmation:
    """One plan's tests on its own runs: its protocol at its seeds, its Holm family."""
    path: Path
    plan: Plan
    table: pd.DataFrame  # tests()
    used: pd.DataFrame  # the runs it reads
    second: pd.DataFrame  # under_second_settings()

    @property
    def planned(self) -> int:
        return len(self.plan.seeds)

    @property
    def progress(self) -> str:
        """How many of the plan's seeds have runs, where not every hypothesis has all: until then the tests are not
        the registered analysis. Empty where all are in."""
        table = self.table
        if (table["seeds"] == table["planned"]).all():
            return ""
        if table["planned"].nunique() > 1:  # claims with seeds of their own: each against its own count
            return "by claim, " + ", ".join(f"{row['id']} {row['seeds']} of {row['planned']}" for _, row in table.iterrows()
                                            if row["seeds"] < row["planned"]) + " seeds"
        fewest, most = table["seeds"].min(), table["seeds"].max()
        return f"{fewest} of {self.planned} seeds" if fewest == most else f"{fewest}–{most} of {self.planned} seeds, by claim"


def confirm(runs: pd.DataFrame, paths: Sequence[Path]) -> list[Confirmation]:
    found = []
    for path, plan in zip(paths, read_plans(paths)):
        table = tests(runs, plan)
        used = runs[(runs["protocol"] == plan.protocol) & runs["seed"].isin(plan.seeds)]
        found.append(Confirmation(path, plan, table, used, under_second_settings(runs, plan, table)))
    return found


def powered(mde: float, target: float) -> str:
    """Whether the test detects the plan's target with 80% power: its minimum detectable effect against it."""
    if np.isnan(target):
        return "no target"
    if np.isnan(mde):
        return "unknown (fewer than 2 pairs, or no spread)"
    return "powered" if mde <= target else f"not powered ({_short_of(mde, target)})"


def _short_of(mde: float, target: float) -> str:
    return f"MDE {mde:.3g} > target {target:g}"  # three digits: an MDE just above its target must not print as equal


def _status(row: pd.Series) -> str:
    """The verdict, and how far the claim's runs are where they are not all in."""
    if row["seeds"] == 0:
        return f"runs not yet made (0 of {row['planned']} seeds)"
    if row["seeds"] < row["planned"]:
        return f"{row['verdict']} ({row['seeds']} of {row['planned']} seeds; not the registered analysis)"
    return row["verdict"]


def _described(c: Confirmation) -> str:
    family, untested = int(c.table["ranks"].sum()), int((c.table["ranks"] & c.table["p"].isna()).sum())
    correction = (f"Holm's correction over the {family} hypotheses "
                  + ("of the plan" if family == len(c.table) else "whose domain can rank variants")
                  + (f" ({untested} without a test yet, counted as p = 1)" if untested else ""))
    partial = (f" Runs so far: {c.progress}; the tests use the seeds present and are not the registered analysis "
               f"until all {c.planned} are in." if c.progress and c.table["seeds"].any() else "")
    own = " (some claims on a part of them, as the plan says)" if (c.table["planned"] < c.planned).any() else ""
    level = mde_level(c.plan)
    at = (f"α = {level:g}" if level == c.plan.alpha
          else f"Holm's first step α/{len(c.plan.hypotheses)} = {level:.2g}, the level the plan was sized at")
    protocol = f"{c.plan.protocol} protocol" if c.plan.protocol else "its sweeps' runs (no protocol label)"
    return (f"Pre-registered in `{c.path}`: {protocol}, seeds {seed_text(c.plan.seeds)} only{own}, two-sided "
            f"paired t-tests by seed, α = {c.plan.alpha}, {correction}; "
            f"MDEs at 80% power and {at}. "
            f"{provenance(c.path, c.used) if len(c.used) else f'Runs not yet made (0 of {c.planned} seeds).'}{partial}")


def _verdict_counts(c: Confirmation) -> str:
    return ", ".join(f"{n} {verdict}" for verdict, n in c.table["verdict"].value_counts().items())


def _results(c: Confirmation) -> pd.DataFrame:
    """A plan's numbers as the section shows them, one row per hypothesis; target and power only where the plan
    sets a target."""
    table = c.table
    shown = pd.DataFrame({
        "n (dropped)": [f"{n} ({d})" for n, d in zip(table["n"], table["dropped"])],
        "difference ± 95% (+ favours the claim)": [estimate(d, "+.3g", h) for d, h in zip(table["diff"], table["half"])],
        "p": table["p"].map(_two_digits), "Holm p": table["p_holm"].map(_two_digits), "MDE (80%)": table["mde"].map(_two_digits)})
    if table["target"].notna().any():
        shown["target"] = table["target"].map(lambda t: "–" if np.isnan(t) else f"{t:g}")
        shown["power"] = [powered(m, t) for m, t in zip(table["mde"], table["target"])]
    shown["verdict"] = [_status(row) for _, row in table.iterrows()]
    return shown


def section(runs: pd.DataFrame, confirmations: Sequence[Confirmation]) -> list[str]:
    """The confirmatory section's markdown: one plan's table, or several plans side by side per hypothesis id."""
    if len(confirmations) == 1:
        (c,) = confirmations
        return ["## Confirmatory tests", "", _described(c), "",
                pd.concat([_claims_of(c), _results(c)], axis=1).to_markdown(index=False), "",
                f"Verdicts: {_verdict_counts(c)}.", "", *_second_setting_lines(c.second)]
    names = [c.path.stem for c in confirmations]  # a plan's columns: the file's stem, or its path where two coincide
    if len(set(names)) < len(names):
        names = [str(c.path) for c in confirmations]
    lines = ["## Confirmatory tests", "", f"{len(confirmations)} pre-registered plans, each tested on its own runs "
             "(its protocol and seeds) with its own Holm family; per hypothesis, each plan's columns side by side "
             "(— where the plan does not hold the hypothesis; differences signed so that + favours the claim).", ""]
    lines += [f"- **{name}**: {_described(c)}" for name, c in zip(names, confirmations)]
    lines += ["", _side_by_side(confirmations, names).to_markdown(index=False), ""]
    lines += [f"Verdicts, {name}: {_verdict_counts(c)}." for name, c in zip(names, confirmations)]
    return [*lines, "", *(line for name, c in zip(names, confirmations) for line in _second_setting_lines(c.second, name))]


def _claims_of(c: Confirmation) -> pd.DataFrame:
    return c.table[["id", "claim", "metric", "contrast"]].rename(columns={"id": "hypothesis"})


def _side_by_side(confirmations: Sequence[Confirmation], names: list[str]) -> pd.DataFrame:
    shown = pd.concat(map(_claims_of, confirmations)).drop_duplicates("hypothesis")  # in the order they first appear
    shown = shown.set_axis(shown["hypothesis"].tolist())
    for name, c in zip(names, confirmations):
        results = _results(c).set_axis(c.table["id"].tolist())
        results["difference ± 95% (n)"] = [f"{d} (n={n})" if n else d for d, n in
                                           zip(results["difference ± 95% (+ favours the claim)"], c.table["n"])]
        if "target" not in results:
            results["target"], results["power"] = "–", "no target"
        for column in ("difference ± 95% (n)", "Holm p", "MDE (80%)", "target", "power", "verdict"):
            shown[f"{name}: {column}"] = results[column].reindex(shown.index).fillna("—")
    return shown


def headline(confirmations: Sequence[Confirmation]) -> list[str]:
    """For the top of RESULTS.md, per plan: what it found, and what its sizes cannot show."""
    return ["Pre-registered confirmatory tests, in brief (the numbers are under “Confirmatory tests”):", "",
            *(f"- {_found(c)} {_cannot_show(c)}" for c in confirmations)]


def _found(c: Confirmation) -> str:
    if not c.table["seeds"].any():
        return f"`{c.path}`: runs not yet made (0 of {c.planned} seeds); nothing is found yet."
    always = ("supported", "contradicted", "cannot tell")
    found = []
    for verdict in [*always, *(v for v in c.table["verdict"].unique() if v not in always)]:
        named = c.table.loc[c.table["verdict"] == verdict, "id"]
        found.append(f"{len(named)} {verdict}" + (f" ({', '.join(named)})" if verdict in always[:2] and len(named) else ""))
    partial = f" (runs so far: {c.progress}; not the registered analysis)" if c.progress else ""
    return f"`{c.path}`{partial}: of its {len(c.table)} claims, {', '.join(found)}."


def _cannot_show(c: Confirmation) -> str:
    targeted = c.table[c.table["target"].notna()]
    if targeted.empty:
        return "It sets no target, so no claim is labelled powered or not; each claim's MDE (80% power) is in the table."
    short = targeted[targeted["mde"] > targeted["target"]]
    unknown = targeted[targeted["mde"].isna()]
    # a claim decided below 80% power found its difference all the same; only an undecided one may have missed it
    decided = short["verdict"].str.startswith(("supported", "contradicted"))
    said = []
    if (~decided).any():
        said.append("Its sizes cannot show an effect of the target's size for " + ", ".join(
            f"{row['id']} ({_short_of(row['mde'], row['target'])})" for _, row in short[~decided].iterrows()) + ".")
    if decided.any():
        said.append("Decided although not powered for its target: " + ", ".join(
            f"{row['id']} ({row['verdict']}; {_short_of(row['mde'], row['target'])})"
            for _, row in short[decided].iterrows()) + ".")
    if short.empty and len(targeted) > len(unknown):
        said.append(f"Each of its {len(targeted) - len(unknown)} claims with a target and an MDE is powered (MDE ≤ target).")
    if len(unknown):
        said.append(f"Whether its sizes reach the target of {', '.join(unknown['id'])} is unknown until 2 seeds are paired.")
    return " ".join(said)


def _second_setting_lines(found: pd.DataFrame, name: str = "") -> list[str]:
    if found.empty:
        return []
    shown = pd.DataFrame({
        "hypothesis": found["id"], "setting": found["setting"], "n": found["n"],
        "difference ± 95% (+ favours the claim)": [estimate(d, "+.3g", h) for d, h in zip(found["diff"], found["half"])],
        "p": found["p"].map(_two_digits), "Holm p (domain)": found["p_holm"].map(_two_digits),
        "verdict under the setting": found["verdict"], "confirmatory verdict": found["confirmed"],
        "same direction": ["yes" if np.sign(a) == np.sign(b) else "no" for a, b in zip(found["diff"], found["confirmed_diff"])],
        "same verdict": ["yes" if a == b else "no" for a, b in zip(found["verdict"], found["confirmed"])],
        "change under the setting ± 95% (n, p)": [
            f"{estimate(d, '+.3g', h)} (n={n}{'' if np.isnan(p) else f', p={p:.2g}'})"
            for d, h, n, p in zip(found["change"], found["change_half"], found["change_n"], found["change_p"])]})
    whose = f"**{name}**: " if name else ""
    return [f"{whose}Exploratory, as the plan says: each accuracy claim (the domain's primary metric) re-tested on a second "
            "setting's runs (a sweep's `select: label:`, such as another init) at the plan's seeds, with the same "
            "paired test and Holm's correction over the claims re-tested in that domain under that setting. Whether "
            "the setting changes the claim's difference is tested directly: per seed run under both, the difference "
            "under the setting less the one under the plan's protocol, paired t-test over those seeds (uncorrected).",
            "", shown.to_markdown(index=False), ""]

