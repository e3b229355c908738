"""The options a learning-rate stability protocol needs (Wortsman et al. 2023): a schedule that ends at an absolute
rate, weight decay independent of the rate, the output logits' z-loss, the peaks of the probes over training, and
QK-layernorm, the field's own fix, as a variant."""
import math
from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch

from common.attention import VARIANTS, MultiheadAttention, get_variant
from common.errors import ConfigError
from common.schema import Optim
from common.task import ClassificationTask, Task, build_optimizer, lr_schedule, z_loss
from runners.cli import main as cli
from runners.config import compose, run_directory
from runners.runs.training import train


def test_min_lr_ends_the_schedule_at_a_rate_whatever_lr_is():
    for lr in (3e-4, 1e-2, 1.0):
        cosine = lr_schedule(Optim(lr=lr, min_lr=1e-5, min_lr_ratio=0.5), 100)
        assert cosine(100) * lr == pytest.approx(1e-5) and cosine(0) == 1.0  # min_lr_ratio is not read
    assert lr_schedule(Optim(lr=1e-6, min_lr=1e-5), 100)(100) == 1.0  # never above lr: a constant rate


def test_independent_weight_decay_shrinks_each_weight_by_its_fraction_whatever_lr():
    for lr in (1e-3, 1e-1):
        weight = torch.nn.Parameter(torch.ones(2, 2))
        optim = Optim(lr=lr, weight_decay=1e-2, independent_weight_decay=True, schedule="constant")
        optimizer, _ = build_optimizer([("w", weight)], {"w"}, optim, 10)
        weight.grad = torch.zeros_like(weight)
        optimizer.step()
        assert weight.detach() == pytest.approx(torch.full((2, 2), 1 - 1e-2))  # lr × (1e-2 / lr)
    coupled, _ = build_optimizer([("w", torch.nn.Parameter(torch.ones(2)))], {"w"}, Optim(lr=1e-1, weight_decay=1e-2), 10)
    assert coupled.param_groups[0]["weight_decay"] == 1e-2


def test_independent_weight_decay_is_adamws_and_refused_elsewhere_in_one_line(toy_domain, run_args, capsys):
    assert cli(["train", "domain=toy", "optim.name=sgd", "optim.independent_weight_decay=true", *run_args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "optim.independent_weight_decay' needs optim.name=adamw" in err


def test_z_loss_is_the_mean_squared_log_normaliser():
    logits = torch.tensor([[0.0, 0.0], [2.0, -1.0]])
    expected = (math.log(2) ** 2 + math.log(math.exp(2) + math.exp(-1)) ** 2) / 2
    assert z_loss(logits, -1).item() == pytest.approx(expected)
    assert z_loss(logits.T, 0).item() == pytest.approx(expected)  # over the class dim it is given (segmentation: 1)


def test_z_loss_is_trained_on_but_not_logged_as_the_loss():
    net = torch.nn.Linear(3, 4)
    task = ClassificationTask(net, 4, Optim(z_loss=0.5))
    task.trainer = type("T", (), {"progress_bar_callback": None})()
    batch = (torch.randn(5, 3) * 10, torch.randint(0, 4, (5,)))
    trained = task.step(batch, "train")
    logits = net(batch[0])
    plain = torch.nn.functional.cross_entropy(logits, batch[1])
    assert task.train_loss.item() == pytest.approx(plain.item())
    assert trained.item() == pytest.approx((plain + 0.5 * z_loss(logits, -1)).item())


def test_z_loss_on_a_task_without_logits_is_refused_before_a_run_exists(toy_domain, run_args, capsys, tmp_path):
    with pytest.raises(ConfigError, match="optim.z_loss applies to output logits"):
        Task(torch.nn.Linear(2, 2), Optim(z_loss=1e-4), {})
    assert cli(["train", "domain=toy", "optim.z_loss=1e-4", *run_args]) == 2
    assert "optim.z_loss applies to output logits, and ToyTask has none" in capsys.readouterr().err


def test_the_new_options_leave_every_earlier_runs_hash_alone(toy_domain, tmp_path):
    base = ["domain=toy", f"output_dir={tmp_path}"]
    plain = run_directory(compose(base))
    assert run_directory(compose([*base, "optim.z_loss=0.0", "optim.independent_weight_decay=false"])) == plain
    assert run_directory(compose([*base, "optim.z_loss=1e-4"])) != plain


def test_a_record_keeps_the_peak_of_each_maximum_over_training(toy_domain, run_args):
    record = train(["domain=toy", "probes.every_n_steps=1", "probes.max_logit_bound=null", *run_args])
    layers = record.trajectory.layers.values()
    for stat in ("max_logit", "q_norm_max", "k_norm_max"):
        assert record.probes[f"peak_{stat}"] == pytest.approx(max(max(layer[stat]) for layer in layers))
    assert record.probes["peak_max_logit"] >= record.probes["max_logit"]


def test_qk_layernorm_bounds_its_logits_where_standard_grows_with_the_weights():
    assert "qk_layernorm" in VARIANTS and get_variant("qk_layernorm").learnable
    x = torch.randn(2, 8, 32)
    peaks = {}
    for variant in ("standard", "qk_layernorm"):
        torch.manual_seed(0)
        attention = MultiheadAttention(32, 4, variant)
        with torch.no_grad():
            attention.in_proj_weight.mul_(100)  # the projections grow, as at a high learning rate
        attention.probe.enabled = True
        attention(x)
        peaks[variant] = attention.probe.stats["max_logit"].item()
    # LN(q)·LN(k)/sqrt(d) with unit gains is at most d/sqrt(d) = sqrt(d) = 2√2 here (d = 8); standard's is not bounded
    assert peaks["qk_layernorm"] <= math.sqrt(8) + 1e-4 and peaks["standard"] > 100


@pytest.mark.parametrize("kept", ["best", "last"])
def test_test_checkpoint_picks_the_weights_the_test_split_scores(toy_domain, run_args, monkeypatch, kept):
    tested = []
    real = pl.Trainer.test

    def test(self, *args, ckpt_path=None, **kwargs):
        tested.append(ckpt_path)
        return real(self, *args, ckpt_path=ckpt_path, **kwargs)

    monkeypatch.setattr(pl.Trainer, "test", test)
    record = train(["domain=toy", f"test_checkpoint={kept}", *run_args])
    assert record.status == "ok" and [Path(path).name for path in tested] == [f"{kept}.ckpt"]
