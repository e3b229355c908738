"""The retrieval domain's config: its typed ``data``, ``model`` and ``task`` sections and its defaults of the shared
ones. Its presets are in configs/domain/retrieval.yaml."""
from typing import Annotated, Literal

from pydantic import Field

from common.schema import Count, Fraction, NonNegative, Optim, Positive, Probes, RunConfig, Seed, Trainer
from common.typed import Model

DATASETS = ("generated",)  # their loaders: data.LOADERS


class Data(Model):
    """The generated task (``domains.retrieval.data``). Sigma = answer_std² I by default (answer keys spread wider
    than the N(0, I) distractors, their directions uniform like a distractor's: a key-normalising variant cannot
    see the answer); b has norm bias_norm, drawn once from bias_seed and shared by all biased samples. With 8 tokens
    of 8 key dimensions and answer_std 3, picking the token of largest key norm finds the answer of 98.9% of
    unbiased samples (the ceiling of the robust solution), well above the success threshold of 0.9."""

    dataset: Literal[DATASETS] = "generated"
    """The task as this section describes it, generated from its seeds."""
    num_tokens: Positive = 8
    """N."""
    key_dim: Positive = 8
    """p."""
    num_classes: Positive = 8
    """C."""
    answer_std: NonNegative = 3.0
    """The answer key's RMS std per dimension: tr Sigma = key_dim · answer_std² at every answer_kappa."""
    answer_kappa: Annotated[float, Field(ge=1)] = 1.0
    """Sigma's condition number: 1 is the isotropic task (direction carries no signal); > 1 gives
    Sigma = answer_std² U diag(λ) Uᵀ, λ geometric from λ_max to λ_max / answer_kappa with mean 1 (the scale rule:
    the isotropic design's trace, fixed before any run), U a random rotation."""
    answer_basis_seed: Seed = 4321
    """U's seed (scipy's Haar-random rotation)."""
    p_bias: Fraction = 0.5
    """The share of samples whose answer key is biased (the shortcut)."""
    bias_norm: NonNegative = 4.0
    """|b|."""
    bias_std: NonNegative = 0.316
    """Biased answers ~ N(b, 0.1 I)."""
    bias_seed: Seed = 1234
    """Draws b."""
    train_size: Positive = 8192
    """Samples generated for each split (each split from its own seed)."""
    val_size: Positive = 2048
    test_size: Positive = 4096
    batch_size: Positive = 32
    """Samples per training step; evaluation takes eval_batch_size."""
    eval_batch_size: Positive = 256
    """Samples per validation and test step (no gradients: larger than batch_size fits)."""


class Net(Model):
    """The model (``domains.retrieval.model``): the form and the keyword arguments of its network."""

    form: Literal["full_token", "faithful"] = "full_token"
    """full_token: q, k, v linear maps (with biases) of the whole token [x^k ; x^v], read out by a token MLP averaged
    over tokens (the design RESULTS.md's study ran) | faithful: the paper's task (FaithfulRetrievalNet): q and k
    from x^k without biases, the one-hot x^v as values, no readout weights."""
    heads: Positive = 1
    """full_token."""
    hidden: Count = 32
    """full_token: units of the readout's token MLP (0: linear), chosen by configs/sweep/retrieval_design.yaml."""
    qk_dim: Positive = 8
    """faithful: channels of q and k."""
    qk_input: Literal["key", "token"] = "key"
    """faithful: q and k projected from key (x^k, the paper) | token (the whole token: an ablation)."""
    qk_bias: bool = False
    """faithful: biases on the q and k projections (true: an ablation)."""


class Task(Model):
    success_threshold: Fraction = 0.9
    """Unbiased test accuracy a run must reach to count as a success (test/success)."""


class RetrievalConfig(RunConfig):
    """The paper's retrieval mechanism study: retrieve the label of an out-of-distribution answer token, with a
    key-norm shortcut on some of the samples."""

    task: Task = Task()
    optim: Optim = Optim(lr=1.8e-2, weight_decay=0.01, warmup_steps=0)
    """A cell of the study's grid: the one whose key-norm curves the report draws."""
    trainer: Trainer = Trainer(max_epochs=4)
    probes: Probes = Probes(every_n_steps=50)
    data: Data = Data()
    model: Net = Net()
