"""Scores of trivial predictors, logged beside a model's so that every table can say whether the model
learned anything (``<metric>_baseline``). Each is a torchmetrics ``Metric``: it sees the targets of every
batch, ignores the predictions, and its state is summed over DDP ranks like any other metric's. Each says
which way is better (``higher_is_better``, as torchmetrics' own do) and what it predicts (``description``,
which the run record keeps for the results tables)."""
from __future__ import annotations

import torch
from torch import Tensor
from torchmetrics import Metric


class MajorityClassAccuracy(Metric):
    """Accuracy of always predicting the split's most frequent class: the best constant classifier on
    the targets seen, so a conservative baseline (at least the accuracy of the training set's majority
    class, or of chance)."""

    full_state_update = False
    higher_is_better = True
    description = "always the most frequent class"

    def __init__(self, num_classes: int):
        super().__init__()
        self.add_state("counts", torch.zeros(num_classes, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, preds: Tensor, target: Tensor) -> None:
        self.counts += torch.bincount(target.flatten().long(), minlength=len(self.counts))

    def compute(self) -> Tensor:
        return self.counts.max() / self.counts.sum().clamp_min(1)


class MeanPredictorError(Metric):
    """Mean absolute error of predicting ``center`` (the training targets' mean) for every target."""

    full_state_update = False
    higher_is_better = False
    description = "the training targets' mean for every target"

    def __init__(self, center: Tensor):
        super().__init__()
        self.register_buffer("center", center.float())
        self.add_state("abs_error", torch.zeros(()), dist_reduce_fx="sum")
        self.add_state("count", torch.zeros((), dtype=torch.long), dist_reduce_fx="sum")

    def update(self, preds: Tensor, target: Tensor) -> None:
        self.abs_error += (target - self.center).abs().sum()
        self.count += target.numel()

    def compute(self) -> Tensor:
        return self.abs_error / self.count.clamp_min(1)


class MajorityClassIoU(MajorityClassAccuracy):
    """Mean IoU of labelling every pixel with the split's most frequent class (background, usually): that
    class's IoU is its share of the labelled pixels, every other class present scores 0, and the mean runs
    over the classes present. Pixels at ``ignore_index`` are left out."""

    description = "every pixel the most frequent class"

    def __init__(self, num_classes: int, ignore_index: int | None = None):
        super().__init__(num_classes)
        self.ignore_index = ignore_index

    def update(self, preds: Tensor, target: Tensor) -> None:
        labelled = target if self.ignore_index is None else target[target != self.ignore_index]
        super().update(preds, labelled)

    def compute(self) -> Tensor:
        return super().compute() / (self.counts > 0).sum().clamp_min(1)


class UnigramCrossEntropy(MajorityClassAccuracy):
    """Cross-entropy in nats per token of the best constant predictive distribution, the split's own token
    frequencies: their entropy, -Σ p log p (what a language model scores before it uses any context)."""

    higher_is_better = False
    description = "the unigram distribution of the split's tokens (their entropy)"

    def compute(self) -> Tensor:
        p = self.counts[self.counts > 0].double() / self.counts.sum()
        return -(p * p.log()).sum()
