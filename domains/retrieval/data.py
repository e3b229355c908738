"""Generated retrieval sequences: the toy task of the paper's mechanism study.

A sample is a sequence of N tokens x_i = [k_i ; e(y_i)]: a key part k_i in R^p and the one-hot
encoding e(y_i) of a label y_i drawn uniformly from C classes. One token, the answer, sits at a
uniform random position; the target is its label, so a model must find the answer token and read
its label. Non-answer key parts are N(0, I), the answer's is N(0, answer_std² I) with answer_std > 1:
in every sample the answer is the token whose key lies outside the distribution of the others. That
is the robust signal, and the only one on unbiased samples.

The shortcut: with probability p_bias a sample is biased, and its answer's key part is instead
N(b, bias_std² I) around one vector b (norm bias_norm, drawn once from bias_seed) shared by all
biased samples. A model can solve those by mapping keys near b to keys of large norm, which win
every query's attention; that does nothing for unbiased samples, so held-out accuracy on unbiased
samples tells whether a model learned the robust solution or took the shortcut. Variants that
normalise keys cannot grow a key's norm, so the shortcut is closed to them.
"""
from __future__ import annotations

import zlib

import torch
from torch.utils.data import DataLoader, RandomSampler, TensorDataset

from common.data import SPLITS, SplitDataModule
from common.registry import load

from . import DATASETS


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


def generated(data: dict, seed: int) -> dict[str, TensorDataset]:
    """Train, validation and test sets of ``data.<split>_size`` samples (inputs, labels, biased flags,
    answer positions), drawn in turn from one generator seeded by the run seed."""
    spec = {key: data[key] for key in ("num_tokens", "key_dim", "num_classes", "answer_std", "p_bias", "bias_std")}
    bias = bias_vector(data["key_dim"], data["bias_norm"], data["bias_seed"])
    generator = torch.Generator().manual_seed(seed)
    return {split: TensorDataset(*make_retrieval(data[f"{split}_size"], bias=bias, generator=generator, **spec))
            for split in SPLITS}


class RetrievalDataModule(SplitDataModule):
    """The ``data.dataset`` of the package's ``DATASETS``; every split is biased with probability p_bias,
    and the task's metrics separate biased from unbiased samples.

    The training order comes from a generator of the sampler's own, seeded by the run seed, rather than
    from the global generator that model initialisation and Lightning draw from too (or the loader's,
    which its iterator draws a seed from): the order is then a function of the seed alone, and
    ``runners.sweeps.stacked`` replays it exactly."""

    def __init__(self, data: dict, seed: int):
        super().__init__(data["batch_size"], eval_batch_size=data["eval_batch_size"])
        self.data, self.seed = data, seed
        self.input_dim = data["key_dim"] + data["num_classes"]

    def setup(self, stage: str | None = None) -> None:
        if not self.datasets:
            self.datasets = load(DATASETS[self.data["dataset"]])(self.data, self.seed)

    def train_dataloader(self) -> DataLoader:
        self.loader("train")  # the shared checks (an empty split is an error)
        order = torch.Generator().manual_seed(zlib.crc32(f"{self.seed}/train-order".encode()))
        train = self.datasets["train"]
        return DataLoader(train, batch_size=self.batch_size, sampler=RandomSampler(train, generator=order))


def shortcut_oracles(data: dict, bias_norm: float, n: int = 20000, seed: int = 0) -> dict[str, float]:
    """How strongly a shortcut of norm ``bias_norm`` conflicts with the robust rule, on ``n`` biased samples
    drawn as the task draws them: the accuracy of the "largest-norm token" oracle (the robust rule: the answer
    is the token whose key is out of distribution), of the "nearest-to-b" oracle (the shortcut: the token
    whose key is nearest b), and the share of samples on which they pick different tokens. Where they
    mostly agree, taking the shortcut costs nothing the norm rule would not also give."""
    spec = {key: data[key] for key in ("num_tokens", "key_dim", "num_classes", "answer_std", "bias_std")}
    bias = bias_vector(data["key_dim"], bias_norm, data["bias_seed"])
    x, _, _, answer = make_retrieval(n, p_bias=1.0, bias=bias, generator=torch.Generator().manual_seed(seed), **spec)
    keys = x[..., :data["key_dim"]]
    largest, nearest = keys.norm(dim=-1).argmax(1), (keys - bias).norm(dim=-1).argmin(1)
    return {"bias_norm": bias_norm, "largest_norm_acc": (largest == answer).float().mean().item(),
            "nearest_b_acc": (nearest == answer).float().mean().item(),
            "disagree": (largest != nearest).float().mean().item()}
