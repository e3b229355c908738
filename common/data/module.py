"""``SplitDataModule``, the Lightning datamodule every domain's datamodule derives from."""
from __future__ import annotations

from collections.abc import Callable, Iterable

import pytorch_lightning as pl
from torch.utils.data import DataLoader, Dataset, Sampler

from common.data.cache import short_hash
from common.errors import DataError


class SplitDataModule(pl.LightningDataModule):
    """A datamodule whose constructor or ``setup`` fills ``self.datasets`` with its "train", "val" and "test"
    datasets; the loaders follow from that. Evaluation keeps every sample (no ``drop_last``), and only
    training shuffles (from the global seed, which the runner sets). ``loader_class`` may be PyG's DataLoader."""

    loader_class = DataLoader
    classes: list[str] = []  # class names, in label order, where the data has classes
    split_info: dict | None = None  # set with ``describe_split``; the run record keeps it as ``split``

    def describe_split(self, source: str, rule: str, members: dict[str, Iterable], *, drawn_from: int | None = None) -> None:
        """Say how the splits were made: ``source`` is ``shipped`` (the dataset's own split), ``random``,
        ``grouped``, ``ordered`` (cut in the data's order, e.g. time) or ``generated``; ``rule`` says how (a seed, a
        file pattern, a group key); ``members`` names each split's samples (file paths relative to the root, row
        or sample ids). Two runs share a test set exactly when their test hashes agree.

        Generated data has no names of its own: its samples are numbered 0, 1, 2, ... in every split, so the
        numbers alone would give val and test one hash, whatever the seed. Pass ``drawn_from``, the seed the
        samples were generated from (``data.split_seed``): each split's hash then covers the split's name and that
        seed with its numbers, so it tells val from test and changes with the seed."""
        def digest(split: str, ids: Iterable) -> str:
            named = sorted(map(str, ids))
            return short_hash(named if drawn_from is None else {"split": split, "seed": drawn_from, "ids": named}, 12)

        self.split_info = {"source": source, "rule": rule,
                           "hash": {split: digest(split, ids) for split, ids in members.items()}}

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    def __init__(self, batch_size: int, *, eval_batch_size: int | None = None, num_workers: int = 0,
                 collate_fn: Callable | None = None):
        super().__init__()
        self.batch_size, self.eval_batch_size = batch_size, eval_batch_size or batch_size
        self.num_workers, self.collate_fn = num_workers, collate_fn
        self.datasets: dict[str, Dataset] = {}

    def loader(self, split: str, sampler: Sampler | None = None, collate_fn: Callable | None = None) -> DataLoader:
        """The split's loader: shuffled for training unless a ``sampler`` orders it; workers kept alive
        between epochs; batches in pinned memory when the trainer runs on a GPU, so the copy to it overlaps
        the step. ``collate_fn`` replaces the datamodule's own for this loader."""
        if len(self.datasets[split]) == 0:
            raise DataError(f"the {split} split is empty; use more data or other split fractions")
        train = split == "train"
        on_gpu = self.trainer is not None and self.trainer.strategy.root_device.type == "cuda"
        return self.loader_class(self.datasets[split], batch_size=self.batch_size if train else self.eval_batch_size,
                                 shuffle=train and sampler is None, sampler=sampler, drop_last=False,
                                 num_workers=self.num_workers, persistent_workers=self.num_workers > 0,
                                 pin_memory=on_gpu, collate_fn=collate_fn or self.collate_fn)

    def train_dataloader(self) -> DataLoader:
        return self.loader("train")

    def augment_batch(self, batch):
        """Training augmentation run on a whole batch on the training device, after the copy there: the
        data-preparation work that would otherwise hold up the loader workers (none by default)."""
        return batch

    def on_after_batch_transfer(self, batch, dataloader_idx: int):
        return self.augment_batch(batch) if self.trainer is not None and self.trainer.training else batch

    def val_dataloader(self) -> DataLoader:
        return self.loader("val")

    def test_dataloader(self) -> DataLoader:
        return self.loader("test")
