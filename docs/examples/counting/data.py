"""The counting domain's data: a loader (dataset name -> splits) and the datamodule that calls it."""
import torch
from torch.utils.data import TensorDataset

from common.data import SPLITS, SplitDataModule

from .config import Data


def generated(data: Data) -> dict[str, TensorDataset]:
    """The loader: ``data`` (the run's typed ``data`` section) -> {"train", "val", "test"} datasets of (tokens,
    count). Each split is drawn from its own seed, derived from ``data.split_seed`` and never from the run's seed,
    so every seed and variant of a study meets the same test set and no test sequence is a training one."""
    splits = {}
    for index, split in enumerate(SPLITS):
        generator = torch.Generator().manual_seed(data.split_seed * len(SPLITS) + index)
        size = getattr(data, f"{split}_size")
        tokens = torch.randint(data.vocab, (size, data.length), generator=generator)
        splits[split] = TensorDataset(tokens, (tokens == 0).sum(1))
    return splits


class CountingData(SplitDataModule):
    """Sets what a datamodule must: ``datasets`` (each split), ``classes`` (label names, in label order; the
    task's ``num_classes`` is their number) and ``describe_split`` (the record's ``split``)."""

    def __init__(self, data: Data):
        super().__init__(data.batch_size, num_workers=data.num_workers)
        self.datasets = LOADERS[data.dataset](data)
        self.classes = [str(count) for count in range(data.length + 1)]  # 0 to length zeros
        rule = f"generated per split: seed 3 x split_seed {data.split_seed} + 0, 1, 2 for train, val, test"
        self.describe_split("generated", rule, {split: range(len(self.datasets[split])) for split in SPLITS},
                            drawn_from=data.split_seed)


LOADERS = {"generated": generated}  # data.dataset -> its loader
