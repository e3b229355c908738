"""The data of a chunk of runs (``runners.runs.chunk``): each seed's splits stacked once, which the runs index by
their seed, and each seed's train order, drawn as Lightning draws it."""
from __future__ import annotations

import itertools
import logging

import torch
from torch import Tensor
from torch.utils.data import TensorDataset

from common.errors import ConfigError

log = logging.getLogger(__name__)


class StackedData:
    """Each seed's splits stacked once ([seeds, samples, ...]) and its train loader; ``members`` (each with a
    ``cfg`` and the ``datamodule`` its domain built) index them by their seed's ``slot``."""

    def __init__(self, members: list):
        seeds = list(dict.fromkeys(m.cfg.seed for m in members))
        self.slot = torch.tensor([seeds.index(m.cfg.seed) for m in members])
        modules = [next(m for m in members if m.cfg.seed == seed).datamodule for seed in seeds]
        for module in modules:
            module.setup("fit")
        self.splits = {split: _stack_split(modules, split) for split in ("train", "val", "test")}
        self.train_loaders = [module.train_dataloader() for module in modules]
        if any(getattr(loader.sampler, "generator", False) is None for loader in self.train_loaders):
            log.warning("ensemble: the train loader draws its order from the global generator; runs will not "
                        "see the order quest train gives them")
        self.eval_batches = {split: list(getattr(modules[0], f"{split}_dataloader")().batch_sampler)
                             for split in ("val", "test")}
        self.steps_per_epoch = len(self.train_loaders[0])

    def epoch(self):
        """The next epoch's training batches: per step, the sample indices [members, batch] of each member."""
        orders = [_epoch_order(loader) for loader in self.train_loaders]
        for batch_idx in range(self.steps_per_epoch):
            yield torch.stack([torch.as_tensor(order[batch_idx]) for order in orders])[self.slot]

    def batch(self, split: str, index: Tensor, which: Tensor) -> tuple[Tensor, ...]:
        """The samples ``index`` [members, batch] of ``split`` for the members ``which``."""
        slot = self.slot[which][:, None]
        return tuple(t[slot, index] for t in self.splits[split])


def _epoch_order(loader) -> list[list[int]]:
    """The index batches of the loader's next epoch. Lightning takes ``len(loader)`` batches and never asks
    for more, so a sampler that would draw again on being asked (torch's RandomSampler draws a last, empty
    permutation) does not; taking exactly as many keeps its generator where Lightning leaves it."""
    return list(itertools.islice(iter(loader.batch_sampler), len(loader)))


def _stack_split(modules: list, split: str) -> tuple[Tensor, ...]:
    """A split's tensors of every datamodule, stacked: [datamodules, samples, ...]."""
    datasets = [module.datasets[split] for module in modules]
    if not all(isinstance(d, TensorDataset) for d in datasets):
        raise ConfigError(f"the ensemble trainer needs in-memory TensorDatasets; the {split} split is "
                          f"{type(datasets[0]).__name__}")
    return tuple(torch.stack(parts) for parts in zip(*(d.tensors for d in datasets)))
