"""The tuned protocol of a sweep file (`select:`): selection runs on their own seeds, a grid extended where the
choice sits on its edge, the choice frozen in selection.json, then the confirmation, and the aggregation that
labels each run "same recipe" or "tuned"."""
import json
import math

import pytest
from test_sweep import fake_record, write_spec

from common.records import read_record, write_record
from runners.commands import sweep
from runners.config import run_directory
from runners.results import frame as results_runs
from runners.sweeps.spec import load_sweep

pytestmark = pytest.mark.usefixtures("threaded_workers", "toy_domain")

BEST_LR = {"standard": 1e-3, "quest": 8e-3}  # where each variant's fake validation error is lowest


@pytest.fixture
def scored_run(monkeypatch):
    """The runner replaced by one whose validation error is |log2(lr / BEST_LR[variant])| plus a seed's jitter:
    selection must find each variant's rate, extending the grid towards quest's."""
    made = []

    def run(cfg, **options):
        made.append((cfg.attention.variant, cfg.seed, cfg.optim.lr, str(run_directory(cfg))))
        error = abs(math.log2(cfg.optim.lr / BEST_LR[cfg.attention.variant])) + 1e-3 * cfg.seed
        record = fake_record(cfg, "ok", config={"optim": {"lr": cfg.optim.lr}}, primary_metric="mse", mode="min",
                             best_val={"value": error, "epoch": 0}, dataset="random", preset="demo")
        record.metrics = {"test/mse": error}
        write_record(run_directory(cfg), record)
        return record

    monkeypatch.setattr("runners.runs.training.run", run)
    return made


def tuned_spec(tmp_path, **select):
    return write_spec(tmp_path, variants=["standard", "quest"], seeds=[0],
                      select={"seeds": [100, 101], "scale": {"optim.lr": [0.5, 1, 2]}, "extend": 2,
                              "confirm_seeds": [0, 1], **select})


def test_selection_then_confirmation(tmp_path, scored_run, capsys):
    assert sweep.main([tuned_spec(tmp_path)]) == 0
    selection = json.loads((tmp_path / "runs" / "selection.json").read_text())
    assert selection["recipe"] == {"toy": {"optim.lr": 1e-3}}
    # standard's best is the recipe's 1e-3, inside the grid; quest's 8e-3 is two steps past its top edge (2e-3)
    assert selection["chosen"]["toy"] == {"standard": {"optim.lr": 1e-3}, "quest": {"optim.lr": 8e-3}}
    selected = [(v, s, lr) for v, s, lr, where in scored_run if "/select/" in where]
    assert {s for _, s, _ in selected} == {100, 101}
    assert sorted({lr for v, _, lr in selected if v == "quest"}) == [5e-4, 1e-3, 2e-3, 4e-3, 8e-3]
    assert sorted({lr for v, _, lr in selected if v == "standard"}) == [5e-4, 1e-3, 2e-3]
    confirmed = sorted((v, s, lr) for v, s, lr, where in scored_run if "/select/" not in where)
    # the recipe's runs (seed 0, both variants at 1e-3), then the tuned ones; standard's tuned seed 0 is its
    # recipe run (the same config), made once
    assert confirmed == [("quest", 0, 1e-3), ("quest", 0, 8e-3), ("quest", 1, 8e-3),
                         ("standard", 0, 1e-3), ("standard", 1, 1e-3)]
    table = results_runs.load_runs(tmp_path / "runs")
    labelled = sorted(zip(table["variant"], table["seed"], table["protocol"]))
    assert labelled == [("quest", 0, "same recipe"), ("quest", 0, "tuned"), ("quest", 1, "tuned"),
                        ("standard", 0, "same recipe"), ("standard", 0, "tuned"), ("standard", 1, "tuned")]
    # the choice stands: a second launch makes nothing and keeps selection.json as it is, byte for byte
    scored_run.clear()
    kept = json.dumps(selection)  # on one line, unlike the written file
    (tmp_path / "runs" / "selection.json").write_text(kept)
    assert sweep.main([tuned_spec(tmp_path)]) == 0
    assert scored_run == [] and (tmp_path / "runs" / "selection.json").read_text() == kept


def test_extension_stops_at_its_count_and_ties_go_to_the_earlier_value(tmp_path, scored_run, monkeypatch):
    monkeypatch.setitem(BEST_LR, "standard", math.sqrt(2) * 1e-3)  # 1e-3 and 2e-3 score alike
    assert sweep.main([tuned_spec(tmp_path, extend=1)]) == 0
    chosen = json.loads((tmp_path / "runs" / "selection.json").read_text())["chosen"]["toy"]
    assert chosen["quest"] == {"optim.lr": 4e-3}  # one step past the edge, still improving: the last tried
    assert chosen["standard"] == {"optim.lr": 1e-3}


def test_selection_runs_are_not_attacked_and_dry_run_lists_the_stage(tmp_path, scored_run, capsys):
    path = tuned_spec(tmp_path)
    assert sweep.main([path, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.count("/select ") == 12 and "the confirmation runs follow once every choice is made" in out
    assert scored_run == []


@pytest.mark.parametrize("select, problem", [
    ({"seeds": [100], "scale": {"optim.lr": []}}, "scale must map config keys to non-empty lists"),
    ({"seeds": [100], "scale": {"optim.lr": [0, 1]}}, "positive multiples"),
    ({"seeds": [], "scale": {"optim.lr": [1]}}, "seeds must be a non-empty list"),
    ({"seeds": [100], "scale": {"optim.lr": [1], "optim.weight_decay": [1]}, "extend": 1}, "0 where more than one"),
    ({"seeds": [100], "scale": {"optim.lr": [1]}, "grid": 3}, "unknown key(s) grid"),
    ({"seeds": [0], "scale": {"optim.lr": [1]}}, "selection seeds [0] are also seeds of the comparison"),
    ({"use": "runs/fair", "seeds": [100]}, "use takes another sweep's choices: seeds belong to that sweep"),
    ({"variants": ["quest", "questt"], "use": "runs/fair"}, "variants has unknown variant questt"),
])
def test_a_select_section_it_cannot_mean_is_one_line(toy_domain, tmp_path, select, problem):
    with pytest.raises(Exception, match="select: ") as err:
        load_sweep(write_spec(tmp_path, select=select))
    assert problem in str(err.value)


def test_a_key_both_scaled_and_in_the_grid_is_one_line(toy_domain, tmp_path):
    """The choice would override the grid's value in every cell: refused as the file is read."""
    with pytest.raises(Exception, match="select: scales optim.lr, which the grid varies"):
        load_sweep(write_spec(tmp_path, grid={"optim.lr": [1e-3, 2e-3]}, select={"seeds": [100], "scale": {"optim.lr": [1]}}))


def test_a_failed_selection_run_scores_worst(tmp_path, monkeypatch, scored_run):
    """quest's best rate fails on one seed: counted as the worst score, never dropped, so it is not chosen."""
    from runners.runs import training

    scored = training.run

    def failing(cfg, **options):
        record = scored(cfg, **options)
        if cfg.attention.variant == "quest" and math.isclose(cfg.optim.lr, 2e-3) and cfg.seed == 101:
            record.fail("RuntimeError: broken")
            write_record(run_directory(cfg), record)
        return record

    monkeypatch.setattr("runners.runs.training.run", failing)
    assert sweep.main([tuned_spec(tmp_path, extend=0)]) in (0, 1)
    chosen = json.loads((tmp_path / "runs" / "selection.json").read_text())["chosen"]["toy"]
    assert chosen["quest"] == {"optim.lr": 1e-3}
    assert all(read_record(p.parent).status in ("ok", "failed") for p in (tmp_path / "runs").rglob("record.json"))


def test_a_sweep_can_use_another_sweeps_choices(tmp_path, scored_run):
    """`use:` skips selection: the other sweep's choices, this sweep's recipe (here another init-like override)."""
    assert sweep.main([tuned_spec(tmp_path)]) == 0
    scored_run.clear()
    (tmp_path / "second").mkdir()
    other = write_spec(tmp_path / "second", variants=["standard", "quest"], seeds=[0],
                       overrides=[f"cache_dir={tmp_path / 'cache'}", "task.nan_after=-1"],
                       select={"use": str(tmp_path / "runs"), "confirm_seeds": [0], "label": "another init"})
    assert sweep.main([other]) == 0
    borrowed = json.loads((tmp_path / "second" / "runs" / "selection.json").read_text())
    assert borrowed["chosen"]["toy"] == {"standard": {"optim.lr": 1e-3}, "quest": {"optim.lr": 8e-3}}
    assert borrowed["from"] == str(tmp_path / "runs" / "selection.json") and borrowed["label"] == "another init"
    assert not any("/select/" in where for *_, where in scored_run)
    assert sorted((v, lr) for v, _, lr, _ in scored_run) == [("quest", 1e-3), ("quest", 8e-3), ("standard", 1e-3)]
    labels = set(results_runs.load_runs(tmp_path / "second" / "runs")["protocol"])
    assert labels == {"same recipe, another init", "tuned, another init"}


def test_using_choices_that_do_not_exist_is_a_one_line_error(tmp_path, scored_run, capsys):
    from runners.cli import main as cli

    path = write_spec(tmp_path, select={"use": str(tmp_path / "nowhere")})
    assert cli(["sweep", path]) == 2
    assert "selection.json does not exist; run that sweep's selection first" in capsys.readouterr().err


def test_a_sweep_sharing_another_ones_output_dir_and_choices_is_a_one_line_error(tmp_path, scored_run, capsys):
    """Two sweep files borrowing choices for different variants into one folder: the second would find the first's
    selection.json, which has no choice for its variants."""
    from runners.cli import main as cli

    assert sweep.main([tuned_spec(tmp_path)]) == 0
    specs = []
    for variant in ("quest", "standard"):
        (tmp_path / variant).mkdir()
        specs.append(write_spec(tmp_path / variant, variants=[variant], seeds=[0], output_dir=str(tmp_path / "shared"),
                                select={"use": str(tmp_path / "runs"), "recipe": False}))
    first, second = specs
    assert cli(["sweep", first, "--dry-run"]) == 0
    assert cli(["sweep", second, "--dry-run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "has no choice for toy/standard" in err and "output_dir of its own" in err


def test_tuned_runs_fill_the_grid_and_recipe_false_leaves_the_recipe_out(tmp_path, scored_run):
    assert sweep.main([tuned_spec(tmp_path)]) == 0
    scored_run.clear()
    (tmp_path / "grid").mkdir()
    path = write_spec(tmp_path / "grid", variants=["standard", "quest"], seeds=[0], grid={"data.n": [64, 32]},
                      select={"use": str(tmp_path / "runs"), "recipe": False, "confirm_seeds": [3]})
    assert sweep.main([path]) == 0
    assert sorted((v, s, lr) for v, s, lr, _ in scored_run) == [("quest", 3, 8e-3)] * 2 + [("standard", 3, 1e-3)] * 2
    labels = results_runs.load_runs(tmp_path / "grid" / "runs")["protocol"]
    assert set(labels) == {"tuned"} and len(labels) == 4


def test_without_confirm_seeds_the_tuned_runs_take_the_sweeps_seeds(tmp_path, scored_run):
    """The scaling sweep's shape: another sweep's choices, no recipe runs, no confirm_seeds of its own."""
    assert sweep.main([tuned_spec(tmp_path)]) == 0
    scored_run.clear()
    (tmp_path / "scaling").mkdir()
    path = write_spec(tmp_path / "scaling", variants=["standard", "quest"], seeds=[20, 21],
                      select={"use": str(tmp_path / "runs"), "recipe": False})
    assert sweep.main([path]) == 0
    assert sorted((v, s, lr) for v, s, lr, _ in scored_run) == [("quest", 20, 8e-3), ("quest", 21, 8e-3),
                                                                ("standard", 20, 1e-3), ("standard", 21, 1e-3)]


COMPLETE = {"keys": ["optim.lr"], "seeds": [100], "recipe_seeds": [], "confirm_seeds": [0], "variants": ["quest"],
            "recipe": {"toy": {"optim.lr": 1e-3}}, "chosen": {"toy": {"quest": {"optim.lr": 1e-3}}}}


@pytest.mark.parametrize("text", ["{broken", '{"keys": []}', "[1]", json.dumps({**COMPLETE, "note": "a key it lacks"}),
                                  json.dumps({**COMPLETE, "seeds": ["100"]})])
def test_a_broken_selection_file_is_one_line_for_the_sweep_and_the_aggregation(tmp_path, scored_run, capsys, text):
    from runners.cli import main as cli

    path = tuned_spec(tmp_path)
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "selection.json").write_text(text)
    assert cli(["sweep", path]) == 2
    assert "selection.json: not a" in capsys.readouterr().err and scored_run == []
    write_record(tmp_path / "runs" / "r", fake_record(load_sweep_cfg(), "ok"))
    assert cli(["aggregate", str(tmp_path / "runs"), "-o", str(tmp_path / "R.md"), "--no-plots"]) == 2
    assert "delete it to choose again" in capsys.readouterr().err


def load_sweep_cfg():
    from runners.config import compose

    return compose(["domain=toy", "attention=quest", "seed=0"])


def test_the_curve_rule_chooses_between_grid_values_and_says_where_the_grid_cannot_decide(tmp_path, scored_run, monkeypatch,
                                                                                          capsys):
    """standard's best rate lies between 1e-3 and 2e-3 (the two score alike: within noise), quest's past the
    extension's reach (an edge): the curve's vertex for one, the edge value, said as such, for the other."""
    monkeypatch.setitem(BEST_LR, "standard", math.sqrt(2) * 1e-3)
    assert sweep.main([tuned_spec(tmp_path, extend=1, rule="curve")]) == 0
    selection = json.loads((tmp_path / "runs" / "selection.json").read_text())
    standard, quest = selection["margins"]["toy"]["standard"], selection["margins"]["toy"]["quest"]
    assert selection["rule"] == "curve" and standard["verdict"] == "within noise" and not standard["edge"]
    assert 1e-3 < selection["chosen"]["toy"]["standard"]["optim.lr"] == standard["curve"] < 2e-3
    assert quest["edge"] and quest["curve"] is None and selection["chosen"]["toy"]["quest"] == {"optim.lr": 4e-3}
    out = capsys.readouterr().out
    assert "select: toy / quest: optim.lr=0.004 (curve rule); best 0.004 vs 0.002" in out and "edge of the grid" in out
    tuned = {(v, lr) for v, s, lr, where in scored_run if "/select/" not in where and s == 1}
    assert tuned == {("standard", standard["curve"]), ("quest", 4e-3)}  # the confirmation runs at the choices


def test_a_variant_tuned_but_not_among_the_sweeps_variants_is_chosen_for_and_not_confirmed(tmp_path, scored_run):
    path = write_spec(tmp_path, variants=["standard"], seeds=[0],
                      select={"variants": ["standard", "quest"], "seeds": [100, 101], "scale": {"optim.lr": [0.5, 1, 2]},
                              "extend": 2, "confirm_seeds": [0, 1], "recipe": False})
    assert sweep.main([path]) == 0
    chosen = json.loads((tmp_path / "runs" / "selection.json").read_text())["chosen"]["toy"]
    assert set(chosen) == {"standard", "quest"}
    confirmed = {(v, s) for v, s, lr, where in scored_run if "/select/" not in where}
    assert confirmed == {("standard", 0), ("standard", 1)}
