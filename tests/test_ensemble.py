"""The ensemble trainer: a run trained among others gets the record `quest train` gives it (ok and diverged
runs, a learnable attention gain, clipping, weight decay, several epochs and probe steps), its optimiser and
clipping are torch's to the bit, runs group by everything but seed, learning rate and weight decay,
settings it cannot replay are refused before anything runs, reruns skip recorded runs, and workers share
a sweep."""
import textwrap

import pytest
import torch

from common.errors import ConfigError
from common.records import RunRecord, find_records, read_record
from runners.commands import ensemble
from runners.config import compose
from runners.runs import training as train
from runners.runs.replayable import check_replayable
from runners.runs.stacked_adamw import StackedAdamW, clip_grad_norms_
from runners.sweeps import ensemble as ensemble_sweep
from runners.sweeps.bookkeeping import plan
from runners.sweeps.ensemble import chunks
from runners.sweeps.progress import Progress

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


def records(root) -> dict[tuple, RunRecord]:
    found = (read_record(p) for p in find_records(root))
    return {(r.variant, r.seed, r.setting("optim.lr")): r for r in found}


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
            assert getattr(mine, field) == getattr(single, field), (variant, seed, lr, field)
    assert trained[("standard", 1, 1e4)].status == "diverged"  # the replay covers divergence too
    assert any((tmp_path / "ensemble").rglob("metrics.csv")) and not any((tmp_path / "ensemble").rglob("*.ckpt"))


def test_stacked_adamw_and_clipping_are_torchs_to_the_bit():
    torch.manual_seed(0)
    shapes = {"w": (5, 3), "b": (3,)}
    lrs, decays = [1e-2, 3e-3], [0.1, 0.0]
    single = [{name: torch.randn(shape) for name, shape in shapes.items()} for _ in lrs]
    stacked = {name: torch.stack([p[name] for p in single]) for name in shapes}
    optimisers = []
    for params, lr, wd in zip(single, lrs, decays):
        tensors = [p.requires_grad_() for p in params.values()]
        optimisers.append(torch.optim.AdamW([{"params": tensors[:1], "weight_decay": wd},
                                             {"params": tensors[1:], "weight_decay": 0.0}], lr=lr))
    mine = StackedAdamW(stacked, {"w"}, lrs, decays, (0.9, 0.999))
    for step in range(5):
        grads = {name: 10 * torch.randn(len(lrs), *shape) for name, shape in shapes.items()}
        for e, (params, optimiser) in enumerate(zip(single, optimisers)):
            for name, p in params.items():
                p.grad = grads[name][e].clone()
            torch.nn.utils.clip_grad_norm_(list(params.values()), 1.0)
            for group in optimiser.param_groups:
                group["lr"] = lrs[e] * 0.5**step  # a schedule, as LambdaLR sets it
            optimiser.step()
        clip_grad_norms_(grads, ["w", "b"], 1.0)
        mine.step(stacked, grads, 0.5**step)
    for e, params in enumerate(single):
        assert all(torch.equal(stacked[name][e], params[name].detach()) for name in shapes)


def test_runs_group_by_everything_but_seed_learning_rate_and_weight_decay(tmp_path):
    base = ["domain=retrieval", "preset=smoke", f"output_dir={tmp_path}"]
    runs = [base + [f"attention={v}", f"seed={s}", f"optim.lr={lr}", f"optim.weight_decay={wd}"]
            for v in ("standard", "quest") for s in (0, 1) for lr in (1e-3, 1e-2) for wd in (0.0, 0.1)]
    runs.append(base + ["attention=quest", "model.hidden=8"])
    pieces = chunks(plan(runs, Progress(runs), lambda run_dir: None), size=5)
    sizes = sorted((p[0].cfg.attention.variant, p[0].cfg.model.hidden, len(p)) for p in pieces)
    assert sizes == [("quest", 8, 1), ("quest", 32, 4), ("quest", 32, 4), ("standard", 32, 4), ("standard", 32, 4)]


@pytest.mark.parametrize("setting", ["optim.name=sgd", "trainer.max_steps=5", "trainer.limit_train_batches=0.5",
                                     "trainer.precision=bf16-mixed", "compile.enabled=true"])
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
    assert len(first) == 4 and {r.status for r in first.values()} == {"ok"}
    trained = []
    monkeypatch.setattr(ensemble_sweep, "train_chunk", lambda members: trained.append(len(members)) or [])
    assert ensemble.main([sweep]) == 0 and trained == []  # every run is recorded: nothing to train
    (find_records(tmp_path / "ensemble")[0]).unlink()
    ensemble.main([sweep])
    assert trained == [1]
