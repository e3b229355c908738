"""Generated retrieval sequences (DESIGN.md §3, the paper's toy task).

A sample is N tokens x_i = [key part in R^p ; one-hot label of C classes]. Non-answer key parts are
N(0, I); the answer, at a uniform random position, has key part N(0, answer_std² I): out of
distribution in every sample, the robust signal. With probability p_bias the answer's key part is
instead N(b, bias_std² I) for one vector b shared by all biased samples: a shortcut a model can take
by growing the biased answer's key norm. The target is the answer's label.
"""
from __future__ import annotations

import torch
from torch.utils.data import TensorDataset

from common.data import SplitDataModule


def bias_vector(key_dim: int, norm: float, seed: int) -> torch.Tensor:
    b = torch.randn(key_dim, generator=torch.Generator().manual_seed(seed))
    return b * (norm / b.norm())


def make_retrieval(n: int, *, num_tokens: int, key_dim: int, num_classes: int, answer_std: float,
                   p_bias: float, bias: torch.Tensor, bias_std: float, generator: torch.Generator):
    """Returns inputs [n, N, p + C], labels [n], biased flags [n], answer positions [n]."""
    keys = torch.randn(n, num_tokens, key_dim, generator=generator)
    labels = torch.randint(num_classes, (n, num_tokens), generator=generator)
    answer = torch.randint(num_tokens, (n,), generator=generator)
    biased = torch.rand(n, generator=generator) < p_bias
    robust = answer_std * torch.randn(n, key_dim, generator=generator)
    shortcut = bias + bias_std * torch.randn(n, key_dim, generator=generator)
    rows = torch.arange(n)
    keys[rows, answer] = torch.where(biased[:, None], shortcut, robust)
    x = torch.cat([keys, torch.nn.functional.one_hot(labels, num_classes).float()], dim=-1)
    return x, labels[rows, answer], biased, answer


class RetrievalDataModule(SplitDataModule):
    """Train, validation and test sets drawn from the same generator (biased with probability
    p_bias); metrics separate biased from unbiased samples, so held-out unbiased accuracy is the score."""

    def __init__(self, *, dataset: str, num_tokens: int, key_dim: int, num_classes: int, answer_std: float,
                 p_bias: float, bias_norm: float, bias_std: float, bias_seed: int, train_size: int,
                 val_size: int, test_size: int, batch_size: int, seed: int):
        super().__init__(batch_size)
        self.sizes = {"train": train_size, "val": val_size, "test": test_size}
        self.input_dim = key_dim + num_classes
        self.spec = dict(num_tokens=num_tokens, key_dim=key_dim, num_classes=num_classes, answer_std=answer_std,
                         p_bias=p_bias, bias=bias_vector(key_dim, bias_norm, bias_seed), bias_std=bias_std)
        self.seed = seed

    def setup(self, stage: str | None = None) -> None:
        if self.datasets:
            return
        generator = torch.Generator().manual_seed(self.seed)
        for split, n in self.sizes.items():
            x, y, biased, answer = make_retrieval(n, generator=generator, **self.spec)
            self.datasets[split] = TensorDataset(x, y, biased, answer)
