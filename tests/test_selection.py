"""`quest select`: the candidates of a grid ranked on validation, never on test; a diverged or failed run
counts as the worst score; ties to the smaller model; one choice per variant with --by variant."""
import json

import pandas as pd

from common.records import Trajectory, read_record, write_record
from runners.cli import main as cli
from runners.runs.selection import candidates, chosen, main_effects, overrides
from tests.conftest import make_record


def grid_record(variant, seed, lr, depth, val, test, status="ok", params=100, mode="max"):
    config = {"seed": seed, "output_dir": "runs", "optim": {"lr": lr, "name": "adamw"}, "model": {"depth": depth},
              "attention": {"variant": variant, "l2norm_kernel": "fused"}}
    return make_record(variant, seed, {"acc": test}, status=status, config=config, params=params,
                       best_val={"value": val, "epoch": 3}, primary_metric="acc", mode=mode)


def test_the_best_mean_validation_score_wins_and_test_scores_are_not_read():
    records = [grid_record("standard", seed, lr, 2, val, test) for seed, lr, val, test in [
        (0, 1e-3, 0.80, 0.99), (1, 1e-3, 0.70, 0.99),  # mean val 0.75, the best test
        (0, 3e-3, 0.78, 0.50), (1, 3e-3, 0.78, 0.50),  # mean val 0.78: chosen
    ]]
    ranked = candidates(records)
    assert [row["settings"] for row in ranked] == [{"optim.lr": 3e-3}, {"optim.lr": 1e-3}]  # seed, kernel: not settings
    assert ranked[0]["mean"] == 0.78 and ranked[0]["runs"] == 2 and ranked[1]["std"] > 0
    assert overrides(ranked[0]["settings"]) == ["optim.lr=0.003"]
    (effects,) = main_effects(ranked).values()
    assert effects == {"optim.lr": {"0.003": 0.78, "0.001": 0.75}}


def test_a_diverged_run_counts_as_the_worst_score_and_ties_go_to_the_smaller_model():
    lucky = [grid_record("standard", 0, 1e-2, 2, 0.95, 0.9), grid_record("standard", 1, 1e-2, 2, None, 0.0, "diverged")]
    steady = [grid_record("standard", s, 1e-3, 2, 0.70, 0.7) for s in (0, 1)]
    assert [row["settings"]["optim.lr"] for row in candidates(lucky + steady)] == [1e-3, 1e-2]
    assert candidates(lucky + steady)[1]["failed"] == 1
    big = [grid_record("standard", s, 1e-3, 4, 0.70, 0.7, params=400) for s in (0, 1)]
    assert candidates(big + steady)[0]["settings"] == {"model.depth": 2}  # equal means: fewer parameters
    low = [grid_record("standard", s, lr, 2, val, 1.0, mode="min") for s, (lr, val) in enumerate([(1e-3, 0.5), (3e-3, 0.2)])]
    assert candidates(low)[0]["settings"] == {"optim.lr": 3e-3}  # a loss: lower is better


def test_by_variant_each_variant_gets_its_own_choice(tmp_path):
    scores = {("standard", 1e-3): 0.8, ("standard", 3e-3): 0.7, ("quest", 1e-3): 0.6, ("quest", 3e-3): 0.9}
    for (variant, lr), val in scores.items():
        for seed in (0, 1):
            write_record(tmp_path / f"{variant}-{lr}-{seed}", grid_record(variant, seed, lr, 2, val, 0.5))
    ranked = candidates([read_record(p) for p in tmp_path.rglob("record.json")], by=("variant",))
    assert {group[-1]: row["settings"] for group, row in chosen(ranked).items()} == {
        "standard": {"optim.lr": 1e-3}, "quest": {"optim.lr": 3e-3}}
    out = tmp_path / "SELECTION.md"
    assert cli(["select", str(tmp_path), "--by", "variant", "-o", str(out), "--json", str(tmp_path / "s.json")]) == 0
    text = out.read_text()
    assert "| chosen | optim.lr=0.001 | 0.8000 |" in text and "| chosen | optim.lr=0.003 | 0.9000 |" in text
    assert len(json.loads((tmp_path / "s.json").read_text())) == 4
    assert cli(["select", str(tmp_path / "nothing")]) == 2


def test_an_archive_reads_as_its_runs_with_the_trajectory_thinned(tmp_path):
    """`quest archive`: the copy aggregates and selects as the runs do; a long trajectory keeps 17 steps,
    its first (the initial sharpness) and last among them; the launch log comes along."""
    from runners.results.frame import load_runs
    from runners.runs.export import thin

    trajectory = Trajectory(step=list(range(0, 1000, 10)), layers={"a": {"entropy": [float(i) for i in range(100)]}})
    thinned = thin(trajectory)
    assert len(thinned.step) == 17 and thinned.step[0] == 0 and thinned.step[-1] == 990
    assert thinned.layers["a"]["entropy"][-1] == 99.0
    runs = tmp_path / "runs"
    for seed in (0, 1):
        write_record(runs / f"a-{seed}", make_record("standard", seed, {"mse": 1.0 + seed}, trajectory=trajectory,
                                                     config={"optim": {"lr": 1e-3}}))
    (runs / "launches.jsonl").write_text('{"command": "quest sweep x"}\n')
    assert cli(["archive", str(runs), str(tmp_path / "copy")]) == 0
    copy = tmp_path / "copy"
    assert (copy / "launches.jsonl").read_text() == '{"command": "quest sweep x"}\n'
    pd.testing.assert_frame_equal(load_runs(runs).drop(columns="run_dir"), load_runs(copy).drop(columns="run_dir"))


def test_an_archive_leaves_out_a_run_still_in_progress(tmp_path, capsys):
    """A sweep writes a classifier's record before adding its robustness: a run whose lock another process
    holds is not copied until it is let go, and the lock files are neither copied nor created."""
    from runners.runs.rundir import claimed, lock_path

    runs = tmp_path / "runs"
    for seed in (0, 1):
        write_record(runs / f"a-{seed}", make_record("standard", seed, {"mse": 1.0}))
    with claimed(runs / "a-1") as mine:  # as the worker adding its robustness holds it
        assert mine
        assert cli(["archive", str(runs), str(tmp_path / "copy")]) == 0
        assert "1 runs still in progress left out" in capsys.readouterr().out
        assert sorted(p.name for p in (tmp_path / "copy").iterdir()) == ["a-0"]
    assert cli(["archive", str(runs), str(tmp_path / "copy")]) == 0
    assert "in progress" not in capsys.readouterr().out
    assert sorted(p.name for p in (tmp_path / "copy").iterdir()) == ["a-0", "a-1"]
    assert not lock_path(runs / "a-0").exists()  # the probe creates no lock file


def lr_grid(scores):
    """``{lr: [score per seed]}`` as the margin's grid: seeds 0, 1, ... in order."""
    return {lr: dict(enumerate(values)) for lr, values in scores.items()}


def test_a_margin_inside_the_seed_noise_is_within_noise_and_the_curve_finds_the_vertex():
    import math

    from runners.runs.margins import WITHIN_NOISE, margin
    # validation is a parabola in log(lr) peaking at 2e-3, with seed noise larger than the gap between 1e-3 and 3e-3
    peak = lambda lr: 0.9 - 0.05 * math.log(lr / 2e-3) ** 2
    noise = [0.03, -0.02, 0.01, -0.02]
    m = margin(lr_grid({lr: [peak(lr) + e * (1 if lr == 1e-3 else -1) for e in noise] for lr in (3.33e-4, 1e-3, 3e-3, 9e-3)}))
    assert m.best == 3e-3 and m.runner_up == 1e-3 and m.seeds == 4 and not m.edge
    assert m.verdict == WITHIN_NOISE and m.low < 0 < m.high
    exact = margin(lr_grid({lr: [peak(lr)] * 4 for lr in (3.33e-4, 1e-3, 3e-3, 9e-3)}))
    assert exact.curve == 2e-3 and exact.chosen == 2e-3  # the parabola through its three best points is the curve
    assert 1e-3 <= m.curve_low <= m.curve <= m.curve_high <= 9e-3


def test_a_clear_margin_is_decided_and_a_best_value_at_the_end_of_the_grid_is_an_edge():
    from runners.runs.margins import DECIDED, margin
    m = margin(lr_grid({1e-3: [0.50, 0.52, 0.51], 3e-3: [0.60, 0.63, 0.61], 9e-3: [0.70, 0.72, 0.74]}))
    assert m.best == 9e-3 and m.verdict == DECIDED and m.low > 0
    assert m.edge and m.curve is None and m.chosen == 9e-3  # nothing says the curve stops rising past 9e-3
    assert "edge of the grid" in m.describe()


def test_beside_a_diverged_value_the_best_grid_value_stands():
    from runners.runs.margins import DECIDED, margin
    worst = float("-inf")
    m = margin(lr_grid({1e-3: [0.5, 0.5], 3e-3: [0.6, 0.62], 9e-3: [0.9, worst]}))
    assert m.best == 3e-3 and m.runner_up == 1e-3 and not m.edge  # the diverged 9e-3 brackets the choice
    assert m.curve is None and m.chosen == 3e-3  # no parabola through a diverged run
    lost = margin(lr_grid({3e-3: [0.6, 0.62], 9e-3: [0.9, worst]}))
    assert lost.best == 3e-3 and lost.verdict == DECIDED  # its runner-up did not finish one seed


def test_quest_select_prints_each_choice_margin(tmp_path, capsys):
    for seed, lr, val in [(0, 1e-3, 0.70), (1, 1e-3, 0.72), (0, 3e-3, 0.71), (1, 3e-3, 0.74), (0, 9e-3, 0.60), (1, 9e-3, 0.65)]:
        write_record(tmp_path / f"run{seed}-{lr}", grid_record("standard", seed, lr, 2, val, 0.5))
    assert cli(["select", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "| 0.003 vs 0.001 | +0.0150 [" in out and "within noise" in out
    assert "select: a / d / study: optim.lr=0.003 (within noise)" in out
