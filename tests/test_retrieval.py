"""Retrieval domain: the generated answer and shortcut distributions, seeding, the biased/unbiased
accuracies, test/success and the answer-key-norm probes."""
import pytest
import pytorch_lightning as pl
import torch

from common.registry import get_domain
from domains.retrieval.data import bias_vector, make_retrieval
from runners.config import build_config, compose

SPEC = dict(num_tokens=12, key_dim=6, num_classes=5, answer_std=2.5, p_bias=0.5, bias_std=0.316)


def sample(n=4000, seed=0):
    bias = bias_vector(SPEC["key_dim"], 4.0, seed=7)
    return bias, make_retrieval(n, bias=bias, generator=torch.Generator().manual_seed(seed), **SPEC)


def build(*overrides: str):
    cfg = compose(["domain=retrieval", "preset=smoke", *overrides])
    return cfg, get_domain("retrieval").build(build_config(cfg))


def test_answer_tokens_follow_their_distributions():
    bias, (x, y, biased, answer) = sample()
    rows = torch.arange(len(x))
    keys = x[..., :SPEC["key_dim"]]
    labels = x[..., SPEC["key_dim"]:].argmax(-1)
    assert torch.equal(y, labels[rows, answer])  # the target is the answer token's label
    assert abs(biased.float().mean().item() - 0.5) < 0.03
    unbiased_answers, biased_answers = keys[rows, answer][~biased], keys[rows, answer][biased]
    assert abs(unbiased_answers.std().item() - 2.5) < 0.1
    assert (biased_answers.mean(0) - bias).abs().max() < 0.05 and abs(biased_answers.std(0).mean() - 0.316) < 0.03
    others = torch.ones_like(keys[..., 0], dtype=torch.bool)
    others[rows, answer] = False
    assert abs(keys[others].std().item() - 1.0) < 0.02
    assert torch.allclose(bias.norm(), torch.tensor(4.0))


def test_generation_is_deterministic_per_seed():
    assert all(torch.equal(a, b) for a, b in zip(sample(seed=3)[1], sample(seed=3)[1]))
    assert not torch.equal(sample(seed=3)[1][0], sample(seed=4)[1][0])


def test_accuracy_counts_unbiased_samples_and_acc_biased_the_biased_ones():
    _, (_, task) = build()
    preds = torch.tensor([0, 1, 2, 3, 4, 0])
    labels = torch.tensor([0, 1, 0, 3, 4, 0])  # the unbiased samples 0..2 get one wrong, the biased 3..5 none
    biased = torch.tensor([0, 0, 0, 1, 1, 1])
    task.test_metrics.update(preds, torch.stack([labels, biased], dim=1))
    scores = task.test_metrics.compute()
    assert scores["test/acc"].item() == pytest.approx(2 / 3) and scores["test/acc_biased"].item() == 1.0
    task.val_metrics.update(preds, torch.stack([labels, torch.zeros_like(biased)], dim=1))
    assert task.val_metrics.compute()["val/acc_biased"].isnan()  # no biased sample: no score, not 0


def test_success_threshold_and_answer_key_norms_are_logged(tmp_path):
    cfg, (datamodule, task) = build("task.success_threshold=0.0")
    assert task.success_threshold == 0.0
    trainer = pl.Trainer(**cfg.trainer, logger=False, enable_checkpointing=False, enable_model_summary=False,
                         default_root_dir=tmp_path)
    trainer.fit(task, datamodule)
    for name in ("biased", "unbiased"):
        assert trainer.callback_metrics[f"probe/answer_key_norm_{name}"] > 0, name
    trainer.test(task, datamodule, verbose=False)
    metrics = trainer.callback_metrics
    assert metrics["test/success"] == 1.0  # any accuracy reaches a threshold of 0
    assert 0.0 <= metrics["test/acc"] <= 1.0 and 0.0 <= metrics["test/acc_biased"] <= 1.0
