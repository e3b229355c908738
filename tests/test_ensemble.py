"""The ensemble trainer: a run trained among others gets the record `quest train` gives it (ok and diverged
runs, a learnable attention gain, clipping, weight decay, several epochs and probe steps, AdamW and SGD),
runs group by everything but seed, learning rate and weight decay, settings it cannot replay are refused
before anything runs, reruns skip recorded runs, and workers share a sweep."""
import textwrap

import pytest

from common.errors import ConfigError
from common.records import find_records, read_record
from runners.commands import ensemble
from runners.config import compose
from runners.runs import training as train
from runners.sweeps import stacked
from runners.sweeps.progress import Progress
from runners.sweeps.stacked import check_replayable, chunks, plan

pytestmark = pytest.mark.usefixtures("threaded_workers")

# Two epochs of four steps, a probe every third step: the replay crosses an epoch and several probes.
SHORT = ["data.train_size=256", "data.batch_size=64", "trainer.max_epochs=2", "probes.every_n_steps=3",
         "optim.weight_decay=0.1", "trainer.enable_progress_bar=false"]


def write_sweep(tmp_path, variants, seeds, lrs, extra=()) -> str:
    path = tmp_path / "sweep.yaml"
    path.write_text(textwrap.dedent(f"""
        domains: [retrieval]
        variants: {list(variants)}
        seeds: {list(seeds)}
        preset: smoke
        output_dir: {tmp_path / 'ensemble'}
        overrides: {SHORT + list(extra)}
        grid:
          optim.lr: {list(lrs)}
    """))
    return str(path)


def records(root) -> dict[tuple, dict]:
    found = (read_record(p) for p in find_records(root))
    return {(r["variant"], r["seed"], r["config"]["optim"]["lr"]): r for r in found}


def test_each_run_gets_the_record_quest_train_gives_it(tmp_path):
    sweep = write_sweep(tmp_path, ["standard", "qknorm"], [0, 1], [3e-2, 1e4])
    assert ensemble.main([sweep]) == 0
    trained = records(tmp_path / "ensemble")
    assert len(trained) == 8
    for variant, seed, lr in (("standard", 0, 3e-2), ("qknorm", 1, 3e-2), ("standard", 1, 1e4)):
        single = train.train(["domain=retrieval", "preset=smoke", f"attention={variant}", f"seed={seed}",
                              f"optim.lr={lr}", f"output_dir={tmp_path / 'single'}", *SHORT])
        mine = trained[(variant, seed, lr)]
        for field in ("status", "metrics", "best_val", "probes", "divergence", "params"):
            assert mine[field] == single[field], (variant, seed, lr, field)
    assert trained[("standard", 1, 1e4)]["status"] == "diverged"  # the replay covers divergence too
    assert any((tmp_path / "ensemble").rglob("metrics.csv")) and not any((tmp_path / "ensemble").rglob("*.ckpt"))


def test_another_optimiser_replays_too(tmp_path):
    """Each run's optimiser is the one its `quest train` run builds (common.task.build_optimizer), so SGD
    with momentum replays as AdamW does."""
    sgd = ["optim.name=sgd", "optim.nesterov=false"]
    assert ensemble.main([write_sweep(tmp_path, ["quest"], [0, 1], [3e-2], extra=sgd)]) == 0
    single = train.train(["domain=retrieval", "preset=smoke", "attention=quest", "seed=1", "optim.lr=3e-2",
                          f"output_dir={tmp_path / 'single'}", *SHORT, *sgd])
    mine = records(tmp_path / "ensemble")[("quest", 1, 3e-2)]
    assert mine["status"] == single["status"] == "ok"
    for field in ("metrics", "best_val", "probes"):
        assert mine[field] == single[field], field


def test_runs_group_by_everything_but_seed_learning_rate_and_weight_decay(tmp_path):
    base = ["domain=retrieval", "preset=smoke", f"output_dir={tmp_path}"]
    runs = [base + [f"attention={v}", f"seed={s}", f"optim.lr={lr}", f"optim.weight_decay={wd}"]
            for v in ("standard", "quest") for s in (0, 1) for lr in (1e-3, 1e-2) for wd in (0.0, 0.1)]
    runs.append(base + ["attention=quest", "model.hidden=8"])
    pieces = chunks(plan(runs, Progress(runs), lambda run_dir: None), size=5)
    sizes = sorted((p[0].cfg.attention.variant, p[0].cfg.model.hidden, len(p)) for p in pieces)
    assert sizes == [("quest", 8, 1), ("quest", 32, 4), ("quest", 32, 4), ("standard", 32, 4), ("standard", 32, 4)]


@pytest.mark.parametrize("setting", ["trainer.max_steps=5", "trainer.limit_train_batches=0.5",
                                     "trainer.precision=bf16-mixed"])
def test_settings_it_cannot_replay_are_refused_before_anything_runs(tmp_path, setting):
    with pytest.raises(ConfigError, match="does not replay"):
        check_replayable(compose(["domain=retrieval", "preset=smoke", setting]))
    sweep = write_sweep(tmp_path, ["quest"], [0], [1e-2], extra=[setting])
    assert ensemble.main([sweep]) == 2
    assert not find_records(tmp_path)


def test_reruns_train_only_what_has_no_record_and_workers_share_a_sweep(tmp_path, monkeypatch):
    sweep = write_sweep(tmp_path, ["standard", "quest"], [0, 1], [1e-2])
    assert ensemble.main([sweep, "--workers", "2"]) == 0
    first = records(tmp_path / "ensemble")
    assert len(first) == 4 and {r["status"] for r in first.values()} == {"ok"}
    trained = []
    monkeypatch.setattr(stacked, "train_chunk", lambda members: trained.append(len(members)) or [])
    assert ensemble.main([sweep]) == 0 and trained == []  # every run is recorded: nothing to train
    (find_records(tmp_path / "ensemble")[0]).unlink()
    ensemble.main([sweep])
    assert trained == [1]
