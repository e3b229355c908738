"""Generated retrieval sequences: the toy task of the paper's mechanism study.

A sample is a sequence of N tokens x_i = [k_i ; e(y_i)]: a key part k_i in R^p and the one-hot
encoding e(y_i) of a label y_i drawn uniformly from C classes. One token, the answer, sits at a
uniform random position; the target is its label, so a model must find the answer token and read
its label. Non-answer key parts are N(0, I), the answer's is N(0, Sigma), wider (answer_std > 1):
in every sample the answer is the token whose key lies outside the distribution of the others. That
is the robust signal, and the only one on unbiased samples.

The shortcut: with probability p_bias a sample is biased, and its answer's key part is instead
N(b, bias_std² I) around one vector b (norm bias_norm, drawn once from bias_seed) shared by all
biased samples. A model can solve those by mapping keys near b to keys of large norm, which win
every query's attention; that does nothing for unbiased samples, so held-out accuracy on unbiased
samples tells whether a model learned the robust solution or took the shortcut. Variants that
normalise keys cannot grow a key's norm, so the shortcut is closed to them.

The answer's covariance. With Sigma = answer_std² I (``answer_kappa`` 1, the default) the answer's key is
out of distribution by its norm only: its direction is uniform on the sphere, like any distractor's, so a
model that normalises keys cannot tell the answer from a distractor by its key. ``answer_kappa`` > 1 gives
Sigma = answer_std² U diag(λ) Uᵀ, a spectrum of condition number κ: λ geometric from λ_max to λ_max/κ, scaled
to mean 1 so that tr Sigma = p·answer_std² whatever κ (the isotropic design's trace: the answer's mean squared
key norm is the same at every κ), U a rotation drawn once from ``answer_basis_seed`` (the signal is in no
coordinate axis). The answer's direction then leans towards U's leading columns: a signal in the direction
that a normalised key keeps, and one that grows with κ (``direction_oracles`` measures both readings).
"""
from __future__ import annotations

import zlib

import numpy as np
import torch
from scipy.stats import ortho_group
from torch.utils.data import DataLoader, RandomSampler, TensorDataset

from common.data import SPLITS, SplitDataModule

from .config import Data


def bias_vector(key_dim: int, norm: float, seed: int) -> torch.Tensor:
    b = torch.randn(key_dim, generator=torch.Generator().manual_seed(seed))
    return b * (norm / b.norm())


def answer_spectrum(key_dim: int, kappa: float) -> torch.Tensor:
    """The eigenvalues λ of Sigma / answer_std², largest first: geometric with λ_max / λ_min = ``kappa``, mean 1."""
    spectrum = kappa ** -torch.linspace(0, 1, key_dim, dtype=torch.float64)
    return (spectrum / spectrum.mean()).float()


def answer_shape(key_dim: int, kappa: float, seed: int) -> torch.Tensor | None:
    """A with Sigma = answer_std² A Aᵀ: U diag(√λ), U a Haar-random rotation from ``seed``; None at κ = 1
    (Sigma = answer_std² I: the answer is drawn exactly as in the isotropic task)."""
    if kappa == 1:
        return None
    rotation = torch.from_numpy(ortho_group.rvs(key_dim, random_state=np.random.default_rng(seed))).float()
    return rotation * answer_spectrum(key_dim, kappa).sqrt()


def make_retrieval(n: int, *, num_tokens: int, key_dim: int, num_classes: int, answer_std: float,
                   p_bias: float, bias: torch.Tensor, bias_std: float, generator: torch.Generator,
                   shape: torch.Tensor | None = None):
    """Returns inputs [n, N, p + C], labels [n], biased flags [n], answer positions [n]. Unbiased answers'
    keys are N(0, answer_std² A Aᵀ) with A = ``shape`` (None: the identity)."""
    keys = torch.randn(n, num_tokens, key_dim, generator=generator)
    labels = torch.randint(num_classes, (n, num_tokens), generator=generator)
    answer = torch.randint(num_tokens, (n,), generator=generator)
    biased = torch.rand(n, generator=generator) < p_bias
    robust = answer_std * torch.randn(n, key_dim, generator=generator)
    if shape is not None:
        robust = robust @ shape.T
    shortcut = bias + bias_std * torch.randn(n, key_dim, generator=generator)
    rows = torch.arange(n)
    keys[rows, answer] = torch.where(biased[:, None], shortcut, robust)
    x = torch.cat([keys, torch.nn.functional.one_hot(labels, num_classes).float()], dim=-1)
    return x, labels[rows, answer], biased, answer


def task_spec(data: Data) -> dict:
    """``make_retrieval``'s task arguments from a ``data`` config, but for p_bias (the answer's shape and b
    drawn from their seeds)."""
    spec = data.model_dump(include={"num_tokens", "key_dim", "num_classes", "answer_std", "bias_std"})
    return {**spec, "bias": bias_vector(data.key_dim, data.bias_norm, data.bias_seed),
            "shape": answer_shape(data.key_dim, data.answer_kappa, data.answer_basis_seed)}


def generated(data: Data, seed: int) -> dict[str, TensorDataset]:
    """Train, validation and test sets of ``data.<split>_size`` samples (inputs, labels, biased flags,
    answer positions), drawn in turn from one generator seeded by the run seed."""
    spec, generator = task_spec(data), torch.Generator().manual_seed(seed)
    return {split: TensorDataset(*make_retrieval(getattr(data, f"{split}_size"), p_bias=data.p_bias,
                                                 generator=generator, **spec)) for split in SPLITS}


class RetrievalDataModule(SplitDataModule):
    """The ``data.dataset`` of ``LOADERS``; every split is biased with probability p_bias,
    and the task's metrics separate biased from unbiased samples.

    The training order comes from a generator of the sampler's own, seeded by the run seed, rather than
    from the global generator that model initialisation and Lightning draw from too (or the loader's,
    which its iterator draws a seed from): the order is then a function of the seed alone, and
    ``runners.runs.ensemble`` replays it exactly.

    ``data``: the domain's typed ``data`` section (``domains.retrieval.config.Data``)."""

    def __init__(self, data: Data, seed: int):
        super().__init__(data.batch_size, eval_batch_size=data.eval_batch_size)
        self.data, self.seed = data, seed
        self.input_dim = data.key_dim + data.num_classes

    def setup(self, stage: str | None = None) -> None:
        if not self.datasets:
            self.datasets = LOADERS[self.data.dataset](self.data, self.seed)

    def train_dataloader(self) -> DataLoader:
        self.loader("train")  # the shared checks (an empty split is an error)
        order = torch.Generator().manual_seed(zlib.crc32(f"{self.seed}/train-order".encode()))
        train = self.datasets["train"]
        return DataLoader(train, batch_size=self.batch_size, sampler=RandomSampler(train, generator=order))


def shortcut_oracles(data: Data, bias_norm: float, n: int = 20000, seed: int = 0) -> dict[str, float]:
    """How strongly a shortcut of norm ``bias_norm`` conflicts with the robust rule, on ``n`` biased samples
    drawn as the task draws them: the accuracy of the "largest-norm token" oracle (the robust rule: the answer
    is the token whose key is out of distribution), of the "nearest-to-b" oracle (the shortcut: the token
    whose key is nearest b), and the share of samples on which they pick different tokens. Where they
    mostly agree, taking the shortcut costs nothing the norm rule would not also give."""
    spec = task_spec(data.model_copy(update={"bias_norm": bias_norm}))
    x, _, _, answer = make_retrieval(n, p_bias=1.0, generator=torch.Generator().manual_seed(seed), **spec)
    keys = x[..., :data.key_dim]
    largest, nearest = keys.norm(dim=-1).argmax(1), (keys - spec["bias"]).norm(dim=-1).argmin(1)
    return {"bias_norm": bias_norm, "largest_norm_acc": (largest == answer).float().mean().item(),
            "nearest_b_acc": (nearest == answer).float().mean().item(),
            "disagree": (largest != nearest).float().mean().item()}


def direction_oracles(data: Data, n: int = 20000, seed: int = 0) -> dict[str, float]:
    """What the answer's key tells on ``n`` unbiased samples drawn as the task draws them: the accuracy of the
    "largest key norm" oracle (the norm reading) and of the best direction-only oracle, which sees the unit
    vectors x̂ alone and picks the token of least x̂ᵀ Sigma⁻¹ x̂ (the answer's direction has the angular
    central Gaussian density ∝ (x̂ᵀ Sigma⁻¹ x̂)^(-p/2), a distractor's is uniform: the likelihood-ratio choice).
    At κ = 1 every direction is equally likely under both, and the direction oracle is at chance, 1/N."""
    spec = task_spec(data)
    x, _, _, answer = make_retrieval(n, p_bias=0.0, generator=torch.Generator().manual_seed(seed), **spec)
    keys = x[..., :data.key_dim]
    shape = spec["shape"] if spec["shape"] is not None else torch.eye(data.key_dim)
    directional = (keys @ torch.linalg.inv(shape).T).norm(dim=-1) / keys.norm(dim=-1)  # √(x̂ᵀ Sigma⁻¹ x̂) · answer_std
    return {"answer_kappa": data.answer_kappa, "chance": 1 / data.num_tokens,
            "largest_norm_acc": (keys.norm(dim=-1).argmax(1) == answer).float().mean().item(),
            "direction_acc": (directional.argmin(1) == answer).float().mean().item()}


# data.dataset -> its loader (config.DATASETS names them)
LOADERS = {"generated": generated}
