"""The trivial baselines of common/metrics.py against hand computations, accumulated over two batches."""
import math

import pytest
import torch

from common.metrics import MajorityClassAccuracy, MeanPredictorError, UnigramCrossEntropy


def test_majority_class_accuracy_counts_every_batch():
    metric = MajorityClassAccuracy(4)
    metric.update(torch.zeros(3), torch.tensor([2, 2, 1]))
    metric.update(torch.zeros(2), torch.tensor([2, 0]))
    assert metric.compute().item() == pytest.approx(3 / 5)


def test_mean_predictor_error_uses_the_given_centre_per_target():
    metric = MeanPredictorError(torch.tensor([1.0, 10.0]))
    metric.update(torch.zeros(2, 2), torch.tensor([[0.0, 10.0], [3.0, 14.0]]))
    assert metric.compute().item() == pytest.approx((1 + 0 + 2 + 4) / 4)


def test_unigram_cross_entropy_is_the_entropy_of_the_token_frequencies():
    metric = UnigramCrossEntropy(256)
    metric.update(None, torch.tensor([[0, 0], [1, 3]], dtype=torch.uint8))
    assert metric.compute().item() == pytest.approx(-(0.5 * math.log(0.5) + 2 * 0.25 * math.log(0.25)))
