"""Claims over a grid (a plan hypothesis's ``over:``): Wortsman et al.'s learning-rate sensitivity per seed, read at
the final checkpoint and clipped at the initial loss, a grid's success rate, one claim per width (``where:``), the
seeds a failed run drops, and ``quest aggregate --confirm`` and ``quest power`` reading them."""
import math

import pytest
from conftest import make_record

from common.errors import ConfigError
from common.records import write_record
from runners.cli import main as cli
from runners.results import confirmatory
from runners.results.frame import load_runs

LRS = (1e-3, 1e-2, 1e-1)
INITIAL = 5.0


def lr_run(root, variant, seed, lr, final, dim=64, status=None, success=None):
    """A run of the lr grid: its final validation loss ``final`` (NaN: it diverged), its test success."""
    status = status or ("diverged" if math.isnan(final) else "ok")
    metrics = {} if status != "ok" else {"success": success if success is not None else float(final < 2)}
    record = make_record(variant, seed, metrics, domain="language", status=status,
                         config={"optim": {"lr": lr}, "model": {"dim": dim}},
                         losses={"train_first": INITIAL, "val_final": final})
    record.directions = {"success": "max"}
    write_record(root / f"{variant}-{seed}-{lr}-{dim}", record)


def write_grid(root, finals, dim=64):
    """finals: {(variant, seed): [final loss at each of LRS]}."""
    for (variant, seed), values in finals.items():
        for lr, final in zip(LRS, values):
            lr_run(root, variant, seed, lr, final, dim)


def claim(**fields) -> confirmatory.Hypothesis:
    base = {"id": "L1", "claim": "quest trains over more rates", "domain": "language", "metric": "final_loss",
            "variant": "quest", "against": "standard", "over": ["optim.lr"], "endpoint": "lr_sensitivity"}
    return confirmatory.Hypothesis.model_validate({**base, **fields})


def test_lr_sensitivity_is_paired_by_seed_clipped_at_the_initial_loss(tmp_path):
    write_grid(tmp_path, {
        ("standard", 0): [2.0, 1.0, math.nan],  # diverged at the top: its initial loss, 5.0
        ("quest", 0): [2.0, 1.0, 3.0],
        ("standard", 1): [2.0, 1.0, 6.0],       # ended above its initial loss: clipped to 5.0
        ("quest", 1): [1.5, 1.0, 2.5],
    })
    diff, dropped = confirmatory.claim_differences(load_runs(tmp_path), claim(), [0, 1])
    # standard: mean(2, 1, 5) - 1 = 1.667 at both seeds; quest: mean(2, 1, 3) - 1 = 1.0 and mean(1.5, 1, 2.5) - 1 = 0.667;
    # lower is better, so positive favours quest
    assert diff.to_dict() == pytest.approx({0: 2 / 3, 1: 1.0}) and dropped == 0


def test_a_seed_counts_once_both_variants_cover_the_grid_and_a_failed_run_drops_it(tmp_path):
    write_grid(tmp_path, {("standard", 0): [2.0, 1.0, 3.0], ("quest", 0): [2.0, 1.0, 3.0],
                          ("standard", 1): [2.0, 1.0, 3.0], ("standard", 2): [2.0, 1.0, 3.0],
                          ("quest", 2): [2.0, 1.0, 3.0]})
    lr_run(tmp_path, "quest", 1, LRS[0], 2.0)  # seed 1: quest has one rate of three, not yet in
    lr_run(tmp_path / "again", "quest", 2, LRS[1], math.nan, status="failed")  # a crash is no result
    diff, dropped = confirmatory.claim_differences(load_runs(tmp_path), claim(), [0, 1, 2])
    assert list(diff.index) == [0] and dropped == 1


def test_where_holds_a_claim_to_one_width_and_mean_reads_a_success_rate(tmp_path):
    write_grid(tmp_path, {("standard", 0): [1.0, 1.0, math.nan], ("quest", 0): [1.0, 1.0, 1.0]}, dim=64)
    write_grid(tmp_path, {("standard", 0): [1.0, 1.0, 1.0], ("quest", 0): [1.0, 1.0, 1.0]}, dim=128)
    runs = load_runs(tmp_path)
    narrow = claim(where={"model.dim": 64})
    assert confirmatory.claim_differences(runs, narrow, [0])[0].to_dict() == pytest.approx({0: 4 / 3})
    assert confirmatory.claim_differences(runs, claim(where={"model.dim": 128}), [0])[0].to_dict() == {0: 0.0}
    success = claim(metric="success", endpoint="mean", where={"model.dim": 64})
    # success over the grid: quest 3 of 3, standard 2 of 3 (a diverged run did not succeed)
    assert confirmatory.claim_differences(runs, success, [0])[0].to_dict() == pytest.approx({0: 1 / 3})


@pytest.mark.parametrize("fields, problem", [
    ({"endpoint": None}, "over and endpoint go together"),
    ({"metric": "loss"}, "lr_sensitivity is read from metric final_loss"),
    ({"endpoint": "median"}, "endpoint"),
])
def test_a_grid_claim_that_does_not_say_what_it_reads_is_refused(fields, problem):
    with pytest.raises(Exception, match=problem):
        claim(**fields)


PLAN = """# Plan

```yaml
protocol: ""
seeds: [0, 1, 2]
alpha: 0.05
hypotheses:
  - {id: L1-64, claim: QUEST trains well over more rates, domain: language, metric: final_loss, variant: quest,
     against: standard, over: [optim.lr], endpoint: lr_sensitivity, where: {model.dim: 64}}
```
"""


def test_aggregate_confirms_a_grid_claim_and_power_sizes_it(tmp_path, capsys):
    for seed in (0, 1, 2):
        write_grid(tmp_path / "runs", {("standard", seed): [2.0, 1.0 + 0.1 * seed, math.nan],
                                       ("quest", seed): [2.0, 1.0, 1.5 + 0.05 * seed]})
    (tmp_path / "plan.md").write_text(PLAN)
    out = tmp_path / "R.md"
    assert cli(["aggregate", str(tmp_path / "runs"), "--confirm", str(tmp_path / "plan.md"), "-o", str(out), "--no-plots"]) == 0
    row = next(line for line in out.read_text().splitlines() if line.startswith("| L1-64"))
    assert "lr_sensitivity of final_loss over optim.lr (model.dim = 64)" in row and "| 3 (0) " in row
    assert "supported" in row
    assert cli(["power", str(tmp_path / "runs"), "--plan", str(tmp_path / "plan.md")]) == 0
    assert "| L1-64 " in capsys.readouterr().out


def test_a_claim_without_a_test_yet_stays_in_the_holm_family_as_p_one(tmp_path):
    """The plan registers Holm over its claims: while the wider claim has no runs, the narrow one is still corrected
    over both, not over itself alone."""
    for seed in (0, 1, 2):
        write_grid(tmp_path / "runs", {("standard", seed): [2.0, 1.0 + 0.1 * seed, math.nan],
                                       ("quest", seed): [2.0, 1.0, 1.5 + 0.05 * seed]})
    wider = "  - {id: L1-128, claim: QUEST trains well over more rates, domain: language, metric: final_loss,\n" \
            "     variant: quest, against: standard, over: [optim.lr], endpoint: lr_sensitivity, where: {model.dim: 128}}\n"
    (tmp_path / "plan.md").write_text(PLAN.replace("```\n", wider + "```\n"))  # the closing fence
    (found,) = confirmatory.confirm(load_runs(tmp_path / "runs"), [tmp_path / "plan.md"])
    table = found.table.set_index("id")
    assert table.loc["L1-64", "p_holm"] == pytest.approx(min(1.0, 2 * table.loc["L1-64", "p"]))
    assert math.isnan(table.loc["L1-128", "p"]) and math.isnan(table.loc["L1-128", "p_holm"])
    assert "Holm's correction over the 2 hypotheses of the plan (1 without a test yet, counted as p = 1)" in \
        "\n".join(confirmatory.section(found.used, [found]))


def test_two_plans_that_name_one_id_for_two_widths_are_refused(tmp_path):
    (tmp_path / "a.md").write_text(PLAN)
    (tmp_path / "b.md").write_text(PLAN.replace("model.dim: 64", "model.dim: 128"))
    with pytest.raises(ConfigError, match=r"hypothesis L1-64 tests .*model.dim = 128, but .*model.dim = 64"):
        confirmatory.read_plans([tmp_path / "a.md", tmp_path / "b.md"])


def test_power_sizes_only_the_claims_the_pilot_ran_at_the_whole_plans_level(tmp_path, capsys):
    for seed in (0, 1, 2):
        write_grid(tmp_path / "pilot", {("standard", seed): [2.0, 1.0 + 0.1 * seed, math.nan],
                                        ("quest", seed): [2.0, 1.0, 1.5 + 0.05 * seed]})
    plan = PLAN.replace("where: {model.dim: 64}}", "where: {model.dim: 64}, target: 0.1}") + ""
    plan = plan.replace("```\n", "  - {id: M1, claim: QUEST succeeds more, domain: retrieval, metric: success, variant: quest,\n"
                        "     against: standard, over: [optim.lr], endpoint: mean}\n```\n")
    (tmp_path / "plan.md").write_text(plan)
    assert cli(["power", str(tmp_path / "pilot"), "--plan", str(tmp_path / "plan.md")]) == 2
    assert "claim M1: 0 pilot pair(s)" in capsys.readouterr().err
    assert cli(["power", str(tmp_path / "pilot"), "--plan", str(tmp_path / "plan.md"), "--claims", "L1-64"]) == 0
    out = capsys.readouterr().out
    assert "α/m = 0.05/2" in out and "| L1-64 " in out and "| M1 " not in out
