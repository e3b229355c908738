"""`quest power` from hand-written pilot records (no training): seeds needed per claim and per plan, checked against
the noncentral t solved here with scipy; Holm's adjustment and the exact minimum detectable effect against values
computed by hand."""
import json
import math

import numpy as np
import pandas as pd
import pytest
from conftest import make_record as record
from scipy import optimize, stats

from common.records import write_record
from runners.cli import main as cli
from runners.results import sample_size as power
from runners.results import stats as results_stats

# Per pilot seed, each variant's offset from 1.0 mse (domain a: quest tuned at 3e-3; domain b: recipe rates).
SEEDS = range(6)
OFFSETS = {
    ("a", "standard"): [0.0, 0.01, -0.02, 0.03, 0.0, -0.01],
    ("a", "quest"): [-0.07, -0.13, -0.09, -0.04, -0.12, -0.10],
    ("a", "qknorm"): [0.02, -0.05, 0.04, 0.06, -0.03, 0.01],
    ("b", "standard"): [0.0, 0.2, -0.1, 0.05, 0.1, -0.15],
    ("b", "quest"): [-0.1, 0.1, 0.05, -0.2, 0.0, 0.05],
}
WALL_S = {("a", "standard"): 3600.0, ("a", "quest"): 7200.0, ("a", "qknorm"): 1800.0, ("b", "standard"): 360.0,
          ("b", "quest"): 720.0}
PLAN = """# Plan

```yaml
protocol: tuned
seeds: [10, 11, 12, 13, 14, 15, 16]
recipe_seeds: [0, 1, 2]
alpha: 0.05
hypotheses:
  - {id: C1, claim: quest beats standard, domain: a, metric: mse, variant: quest, against: standard, target: 0.05}
  - {id: C2, claim: quest beats qknorm, domain: a, metric: mse, variant: quest, against: qknorm}
  - {id: C3, claim: quest beats standard, domain: b, metric: mse, variant: quest, against: standard, target: 0.08}
```
"""


def write_pilot(root):
    """A tuned sweep's records: in domain a quest's chosen rate is 3e-3, and its runs at the recipe's 1e-3 (same
    recipe only, far worse) must not enter the tuned pilot; each seed's two wall times average to ``WALL_S``."""
    root.mkdir(parents=True)
    (root / "selection.json").write_text(json.dumps({
        "keys": ["optim.lr"], "seeds": [100], "recipe_seeds": list(SEEDS), "confirm_seeds": list(SEEDS),
        "recipe": {d: {"optim.lr": 1e-3} for d in "ab"}, "label": None, "variants": ["standard", "quest", "qknorm"],
        "chosen": {"a": {"standard": {"optim.lr": 1e-3}, "quest": {"optim.lr": 3e-3}, "qknorm": {"optim.lr": 1e-3}},
                   "b": {"standard": {"optim.lr": 1e-3}, "quest": {"optim.lr": 1e-3}}}}))
    runs = [(d, v, 3e-3 if (d, v) == ("a", "quest") else 1e-3, OFFSETS[d, v]) for d, v in OFFSETS]
    runs.append(("a", "quest", 1e-3, [0.5, -0.4, 0.3, 0.0, 0.6, -0.2]))
    for domain, variant, lr, offsets in runs:
        for seed in SEEDS:
            wall = WALL_S[domain, variant] * (1.2 if seed % 2 else 0.8)
            write_record(root / f"{domain}-{variant}-{lr}-{seed}", record(
                variant, seed, {"mse": 1.0 + offsets[seed]}, domain=domain, config={"optim": {"lr": lr}},
                wall_time_s=wall))


def nct_power(effect, n, alpha):
    """Two-sided paired t-test power from scipy's noncentral t (its lower tail by symmetry: nct.cdf returns NaN
    for some arguments)."""
    df, nc = n - 1, effect * math.sqrt(n)
    critical = stats.t.isf(alpha / 2, df)
    return stats.nct.sf(critical, df, nc) + stats.nct.sf(critical, df, -nc)


def by_stepping(sd, target, alpha):
    n = 2
    while nct_power(target / sd, n, alpha) < 0.8:
        n += 1
    return n


def nct_mde(sd, n, alpha):
    return sd * optimize.brentq(lambda effect: nct_power(effect, n, alpha) - 0.8, 1e-6, 20)


def test_seeds_effects_and_hours_per_claim_and_per_plan(tmp_path, capsys):
    write_pilot(tmp_path / "pilot")
    (tmp_path / "plan.md").write_text(PLAN)
    out = tmp_path / "power.json"
    assert cli(["power", "--plan", str(tmp_path / "plan.md"), str(tmp_path / "pilot"), "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    found = json.loads(out.read_text())
    claims = {row["id"]: row for row in found["claims"]}
    levels = {"holm": 0.05 / 3, "alpha": 0.05}
    assert found["levels"]["holm"] == pytest.approx(levels["holm"])
    sd = {c: np.std(np.subtract(OFFSETS[d, "quest"], OFFSETS[d, other]), ddof=1)
          for c, d, other in (("C1", "a", "standard"), ("C2", "a", "qknorm"), ("C3", "b", "standard"))}
    seed_hours = {"C1": 3.0, "C2": 2.5, "C3": 0.3}
    domain_n = {}
    for level, alpha in levels.items():
        for claim, target in (("C1", 0.05), ("C2", None), ("C3", 0.08)):
            row = claims[claim]
            assert row["pairs"] == 6 and row["sd"] == pytest.approx(sd[claim], rel=1e-9)
            n = by_stepping(sd[claim], target, alpha) if target else 7
            assert row[f"n_{level}"] == n and row[f"mde_{level}"] == pytest.approx(nct_mde(sd[claim], n, alpha), rel=1e-6)
            assert row[f"hours_{level}"] == pytest.approx(n * seed_hours[claim])
            assert target is None or row[f"mde_{level}"] <= target < nct_mde(sd[claim], n - 1, alpha)
        domain_n[level] = {"a": max(claims["C1"][f"n_{level}"], 7), "b": claims["C3"][f"n_{level}"]}
        # each variant runs the most seeds any of its claims needs: in a, standard (1.0 h a run) C1's, quest (2.0 h)
        # C1's or C2's, qknorm (0.5 h) C2's seven; in b, standard and quest (0.3 h together) C3's
        n_c1 = claims["C1"][f"n_{level}"]
        total = n_c1 * 1.0 + max(n_c1, 7) * 2.0 + 7 * 0.5 + domain_n[level]["b"] * 0.3
        assert found["total_hours"][level] == pytest.approx(total)
        assert f"{total:.2f} hours at {'α/m' if level == 'holm' else 'α'}" in printed
    assert domain_n["holm"]["b"] > domain_n["alpha"]["b"] > 7  # the cases reach beyond the plan's seeds
    assert "| C2 " in printed and "7 (plan)" in printed


def test_holm_and_the_exact_mde_match_hand_computations():
    """Holm by hand (each sorted p times the hypotheses left, running maximum, at most 1; ties share the larger).
    The MDEs were solved by hand from scipy's noncentral t: the pre-registered approximation (``detectable``) is
    0.3–5.5% below them here, not equal, so it stays as the plan wrote it."""
    p = pd.Series([0.2, 0.001, 0.02, 0.02, 0.5], index=list("abcde"))
    assert results_stats.holm(p).to_dict() == pytest.approx({"a": 0.4, "b": 0.005, "c": 0.08, "d": 0.08, "e": 0.5})
    assert results_stats.holm(pd.Series([0.6, 0.7])).tolist() == [1.0, 1.0]
    for (sd, n, alpha), by_hand, approximation in [((1.0, 5, 0.05), 1.681996966, 1.66247615),
                                                   ((1.0, 7, 0.05), 1.272566655, 1.26716941),
                                                   ((0.02, 7, 0.05 / 22), 0.04784366619, 0.0452233709),
                                                   ((2.5, 12, 0.01), 2.915477892, 2.87328212)]:
        assert power.mde(sd, n, alpha) == pytest.approx(by_hand, rel=1e-8)
        assert results_stats.detectable(sd, n, alpha) == pytest.approx(approximation, rel=1e-8)


@pytest.mark.parametrize("edit, problem", [
    (None, "no such plan file"),
    (("domain: b,", "domain: c,"), "claim C3: 0 pilot pair(s) of quest − standard on mse in c; at least 2 are needed"),
    (("target: 0.08", "target: -1"), "hypothesis C3: target must be a positive number in mse's units, got -1"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, edit, problem):
    write_pilot(tmp_path / "pilot")
    if edit:
        (tmp_path / "plan.md").write_text(PLAN.replace(*edit))
    assert cli(["power", "--plan", str(tmp_path / "plan.md"), str(tmp_path / "pilot")]) == 2
    err = capsys.readouterr().err
    assert problem in err and len(err.strip().splitlines()) == 1
