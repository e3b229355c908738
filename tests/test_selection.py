"""`quest select`: the candidates of a grid ranked on validation, never on test; a diverged or failed run
counts as the worst score; ties to the smaller model; one choice per variant with --by variant."""
import json

import pandas as pd

from common.records import RunRecord, write_record
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
            write_record(tmp_path / f"{variant}-{lr}-{seed}", RunRecord(**grid_record(variant, seed, lr, 2, val, 0.5)))
    ranked = candidates([json.loads(p.read_text()) for p in tmp_path.rglob("record.json")], by=("variant",))
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

    trajectory = {"step": list(range(0, 1000, 10)), "layers": {"a": {"entropy": [float(i) for i in range(100)]}}}
    thinned = thin(trajectory)
    assert len(thinned["step"]) == 17 and thinned["step"][0] == 0 and thinned["step"][-1] == 990
    assert thinned["layers"]["a"]["entropy"][-1] == 99.0
    runs = tmp_path / "runs"
    for seed in (0, 1):
        write_record(runs / f"a-{seed}", RunRecord(**make_record("standard", seed, {"mse": 1.0 + seed}, trajectory=trajectory,
                                                      config={"optim": {"lr": 1e-3}})))
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
        write_record(runs / f"a-{seed}", RunRecord(**make_record("standard", seed, {"mse": 1.0})))
    with claimed(runs / "a-1") as mine:  # as the worker adding its robustness holds it
        assert mine
        assert cli(["archive", str(runs), str(tmp_path / "copy")]) == 0
        assert "1 runs still in progress left out" in capsys.readouterr().out
        assert sorted(p.name for p in (tmp_path / "copy").iterdir()) == ["a-0"]
    assert cli(["archive", str(runs), str(tmp_path / "copy")]) == 0
    assert "in progress" not in capsys.readouterr().out
    assert sorted(p.name for p in (tmp_path / "copy").iterdir()) == ["a-0", "a-1"]
    assert not lock_path(runs / "a-0").exists()  # the probe creates no lock file
