"""The counting domain's config: its typed ``data``, ``model`` and ``task`` sections and its defaults of the shared
ones (in the project: ``domains/counting/config.py``). Its presets are in counting.yaml.

Each field is its key: its type (a range from ``common.schema``: ``Positive`` at least 1, ``Seed``, ``Fraction``
in [0, 1], ...), its default, and below it what it means. The config reference page shows them as written here.
"""
from typing import Literal

from common.schema import Fraction, Optim, Positive, RunConfig, Seed, Trainer
from common.sections import Encoder, Loader
from common.typed import Model

DATASETS = ("generated",)  # the names data.dataset may take; their loaders: data.LOADERS


class Data(Loader):
    """The generated sequences and their split (``data.py``), after the loader's keys that domains share
    (``common.sections.Loader``: batch_size, num_workers)."""

    dataset: Literal[DATASETS] = "generated"
    """Generated sequences (the only dataset here; a name in ``DATASETS``)."""
    vocab: Positive = 4
    """Tokens are drawn uniformly from 0 to vocab - 1; the label counts the zeros."""
    length: Positive = 12
    """Tokens per sequence; the classes are the counts 0 to length."""
    train_size: Positive = 2048
    val_size: Positive = 256
    test_size: Positive = 256
    split_seed: Seed = 0
    """Every split is drawn from its own seed derived from this one, never from the run's seed."""


class Task(Model):
    """``common.task.ClassificationTask``'s keyword arguments."""

    label_smoothing: Fraction = 0.0


class CountingConfig(RunConfig):
    """Count how often token 0 occurs in a sequence of random tokens: a classifier over the counts."""

    data: Data = Data(batch_size=64)
    model: Encoder = Encoder(dim=32, depth=2, heads=2)
    """``CountingNet``'s keyword arguments (``model.py``): a shared section, with this domain's defaults."""
    task: Task = Task()
    optim: Optim = Optim(lr=0.003)
    trainer: Trainer = Trainer(max_epochs=10)
