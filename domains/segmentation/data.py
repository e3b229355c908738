"""Segmentation data: digit scenes composed from real MNIST handwriting (embedded default), ADE20K in
its ADEChallengeData2016 layout, and any images-folder + masks-folder pair.

``DATASETS`` maps each ``data.dataset`` name to its source: a class that knows the class names at once
(the model is built from them) and reads or generates the data only at ``setup``. Stored samples are
``(image uint8 [3, H, W], mask long [H, W])``; labels run over 0..num_classes-1 and ``ignore_index``
marks pixels that count nowhere (the padding of crops and batches included). Batches are float images
in [0, 1]: the model normalises, and test-time corruptions act on [0, 1].
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch import Tensor
from torch.utils.data import Dataset
from torchvision import tv_tensors
from torchvision.transforms import v2

from common.data import SPLITS, DataError, SplitDataModule, cached, load_mnist, require_path, seeded_split, short_hash

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp")
DIGIT_CLASSES = ("background",) + tuple(str(d) for d in range(10))  # label = digit + 1
ADE20K_CLASSES = 150


# ---------------------------------------------------------------- embedded default: digit scenes

def texture(size: int, strength: float, generator: torch.Generator) -> Tensor:
    """A random background in [0, 1]: a base colour plus low-frequency colour noise and oriented
    stripes whose amplitudes scale with ``strength``."""
    rand = lambda *shape: torch.rand(shape, generator=generator)  # noqa: E731
    cells = int(torch.randint(2, 9, (1,), generator=generator))
    noise = F.interpolate(rand(1, 3, cells, cells), size=(size, size), mode="bicubic", align_corners=False)[0]
    angle, period, phase = rand(1) * math.pi, size / (1 + rand(1) * 7), rand(1) * 2 * math.pi
    y, x = torch.meshgrid(torch.arange(size), torch.arange(size), indexing="ij")
    stripes = torch.sin(2 * math.pi * (x * angle.cos() + y * angle.sin()) / period + phase)
    return (rand(3, 1, 1) * 0.6 + 0.2 + strength * (noise - 0.5 + 0.5 * rand(3, 1, 1) * stripes)).clamp(0, 1)


def compose_scenes(digits: Tensor, labels: Tensor, count: int, image_size: int, digits_per_image: tuple[int, int],
                   digit_size: tuple[int, int], dilate: int, label_dilate: int, texture_strength: float,
                   max_overlap: float, placement_tries: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """``count`` scenes: ``digits_per_image`` digits (ink in [0, 1]) drawn from ``digits`` at random
    sizes and positions, each in its own colour far from the background under it, overlapping earlier
    digits' regions by at most ``max_overlap`` (``placement_tries`` positions are tried). Strokes are
    widened by ``dilate`` pixels (of the 28-pixel original) to draw the digit and by ``label_dilate`` to
    label it: a digit is an object region of digit+1 around its strokes, not a hairline that a
    patch-resolution segmenter could never trace. Everything else is 0 (background)."""
    widen = lambda x, r: F.max_pool2d(x[:, None], 2 * r + 1, stride=1, padding=r)[:, 0] if r else x  # noqa: E731
    digits, regions = widen(digits, dilate), widen(digits, label_dilate)
    randint = lambda lo, hi: int(torch.randint(lo, hi + 1, (1,), generator=generator))  # noqa: E731
    images = torch.empty(count, 3, image_size, image_size, dtype=torch.uint8)
    masks = torch.zeros(count, image_size, image_size, dtype=torch.uint8)
    for i in range(count):
        image = texture(image_size, texture_strength, generator)
        for _ in range(randint(*digits_per_image)):
            pick = randint(0, len(digits) - 1)
            size = min(randint(*digit_size), image_size)
            ink, region = F.interpolate(torch.stack([digits[pick], regions[pick]])[None], size=(size, size),
                                        mode="bilinear", antialias=True, align_corners=False)[0]
            # Digits may touch but not hide each other: occlusion by a same-looking stroke is unlearnable.
            for _ in range(placement_tries):
                top, left = randint(0, image_size - size), randint(0, image_size - size)
                window = (slice(top, top + size), slice(left, left + size))
                if (masks[i][window][region > 0.5] > 0).float().mean() <= max_overlap:
                    break
            else:
                continue  # no room left: this scene gets fewer digits
            # A cyclic shift of at least 0.3 per channel keeps the ink visible on its background.
            patch = image[:, window[0], window[1]]
            colour = (patch.mean(dim=(1, 2)) + 0.3 + 0.4 * torch.rand(3, generator=generator)) % 1.0
            image[:, window[0], window[1]] = patch * (1 - ink) + colour[:, None, None] * ink
            masks[i][window][region > 0.5] = int(labels[pick]) + 1
        images[i] = (image * 255).round().to(torch.uint8)
    return images, masks


def digit_scenes(data: dict, cache_dir: Path, seed: int) -> dict[str, tuple[Tensor, Tensor]]:
    """Train/val/test scenes; each split draws from its own digits, so test handwriting is unseen."""
    mnist = load_mnist(cache_dir)
    digits, labels = mnist["images"][:, 0].float() / 255, mnist["labels"]
    pools = seeded_split(len(digits), tuple(data["split"]), seed)
    generator = torch.Generator().manual_seed(seed)
    scenes = data["scenes"]
    return {
        stage: compose_scenes(digits[pool], labels[pool], scenes[stage], scenes["image_size"],
                              tuple(scenes["digits_per_image"]), tuple(scenes["digit_size"]), scenes["dilate"],
                              scenes["label_dilate"], scenes["texture"], scenes["max_overlap"],
                              scenes["placement_tries"], generator)
        for stage, pool in zip(SPLITS, pools)
    }


class TensorSegmentation(Dataset):
    def __init__(self, images: Tensor, masks: Tensor, transform):
        self.images, self.masks, self.transform = images, masks, transform

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int):
        return self.transform(tv_tensors.Image(self.images[index]), tv_tensors.Mask(self.masks[index].long()))


# ---------------------------------------------------------------- files on disk: ADE20K and folder pairs

def image_mask_pairs(image_dir: Path, mask_dir: Path) -> list[tuple[Path, Path]]:
    """Every image of ``image_dir`` with the ``.png`` mask of the same stem in ``mask_dir``."""
    found = require_path(image_dir, "image folder").iterdir()
    images = sorted(p for p in found if p.suffix.lower() in IMAGE_EXTENSIONS)
    require_path(mask_dir, "mask folder")
    if not images:
        raise DataError(f"image folder {image_dir} has no images ({'/'.join(IMAGE_EXTENSIONS)})")
    pairs = []
    for image in images:
        mask = mask_dir / f"{image.stem}.png"
        if not mask.exists():
            raise DataError(f"{image}: missing mask {mask}")
        pairs.append((image, mask))
    return pairs


def ade20k_pairs(root: Path, split: str) -> list[tuple[Path, Path]]:
    """``split`` (training | validation) of ADEChallengeData2016; ``root`` is that folder or its parent."""
    if (root / "ADEChallengeData2016").is_dir():
        root = root / "ADEChallengeData2016"
    return image_mask_pairs(root / "images" / split, root / "annotations" / split)


class FileSegmentation(Dataset):
    """Image/mask files, read with PIL. ``reduce_zero_label`` (ADE20K): 0 (unlabelled) becomes
    ``ignore_index`` and every other label moves down by one."""

    def __init__(self, pairs: list[tuple[Path, Path]], num_classes: int, ignore_index: int,
                 reduce_zero_label: bool, transform):
        self.pairs, self.num_classes, self.ignore_index = pairs, num_classes, ignore_index
        self.reduce_zero_label, self.transform = reduce_zero_label, transform

    def __len__(self) -> int:
        return len(self.pairs)

    def load(self, index: int) -> tuple[Tensor, Tensor]:
        image_path, mask_path = self.pairs[index]
        try:
            image = Image.open(image_path).convert("RGB")
            mask = Image.open(mask_path)
            labels = np.asarray(mask)
        except OSError as err:
            raise DataError(f"{image_path} / {mask_path}: unreadable ({err})") from err
        if labels.ndim != 2:
            raise DataError(f"{mask_path}: mask must have one channel of labels, found shape {labels.shape}")
        if image.size != mask.size:
            raise DataError(f"{mask_path}: mask size {mask.size} differs from image {image_path.name} "
                            f"size {image.size}")
        labels = torch.from_numpy(labels.astype(np.int64))
        if self.reduce_zero_label:
            labels = torch.where((labels == 0) | (labels == self.ignore_index), self.ignore_index, labels - 1)
        bad = ((labels < 0) | (labels >= self.num_classes)) & (labels != self.ignore_index)
        if bad.any():
            raise DataError(f"{mask_path}: label {int(labels[bad][0])} outside 0..{self.num_classes - 1} "
                            f"(ignore index {self.ignore_index})")
        return v2.functional.pil_to_tensor(image), labels

    def __getitem__(self, index: int):
        image, labels = self.load(index)
        return self.transform(tv_tensors.Image(image), tv_tensors.Mask(labels))


# ---------------------------------------------------------------- augmentation and batching

class RandomScale(v2.Transform):
    """Resize by a factor drawn from ``scale_range``, relative to a short side of ``short`` (None: the
    stored size); masks are resized with nearest neighbours."""

    def __init__(self, scale_range: tuple[float, float], short: int | None):
        super().__init__()
        self.scale_range, self.short = scale_range, short

    def make_params(self, flat_inputs):
        height, width = v2.query_size(flat_inputs)
        factor = float(torch.empty(1).uniform_(*self.scale_range))
        if self.short is not None:
            factor *= self.short / min(height, width)
        return {"size": [max(1, round(height * factor)), max(1, round(width * factor))]}

    def transform(self, inpt, params):
        return v2.functional.resize(inpt, params["size"])


def train_transform(data: dict) -> v2.Compose:
    jitter, fill = data["jitter"], {tv_tensors.Image: 0, tv_tensors.Mask: data["ignore_index"]}
    return v2.Compose([
        RandomScale(tuple(data["scale_range"]), data["resize"]),
        v2.RandomCrop(data["crop_size"], pad_if_needed=True, fill=fill),
        v2.RandomHorizontalFlip() if data["flip"] else v2.Identity(),
        v2.ToDtype({tv_tensors.Image: torch.float32, "others": None}, scale=True),
        v2.ColorJitter(jitter["brightness"], jitter["contrast"], jitter["saturation"], jitter["hue"]),
    ])


def eval_transform(data: dict) -> v2.Compose:
    resize = [v2.Resize(data["resize"])] if data["resize"] is not None else []
    return v2.Compose(resize + [v2.ToDtype({tv_tensors.Image: torch.float32, "others": None}, scale=True)])


class PadCollate:
    """Stack samples of different sizes by padding to the largest (image 0, mask ``ignore_index``)."""

    def __init__(self, ignore_index: int):
        self.ignore_index = ignore_index

    def __call__(self, samples):
        height = max(image.shape[-2] for image, _ in samples)
        width = max(image.shape[-1] for image, _ in samples)
        pad = lambda x, fill: F.pad(x, (0, width - x.shape[-1], 0, height - x.shape[-2]), value=fill)  # noqa: E731
        images = torch.stack([pad(image.as_subclass(Tensor), 0.0) for image, _ in samples])
        masks = torch.stack([pad(mask.as_subclass(Tensor), self.ignore_index) for _, mask in samples])
        return images, masks.long()


# ---------------------------------------------------------------- the datasets

class DigitScenes:
    """The embedded default: scenes generated per seed (``digit_scenes``) and cached by their settings."""

    def __init__(self, data: dict, cache_dir: Path, seed: int):
        self.data, self.cache_dir, self.seed = data, cache_dir, seed
        self.class_names = list(DIGIT_CLASSES)

    def load(self, transforms: dict) -> dict[str, Dataset]:
        key = short_hash({**self.data["scenes"], "split": self.data["split"]})
        path = self.cache_dir / "segmentation" / f"digits-seed{self.seed}-{key}.pt"
        scenes = cached(path, lambda: digit_scenes(self.data, self.cache_dir, self.seed))
        return {split: TensorSegmentation(*scenes[split], transforms[split]) for split in SPLITS}


class FolderPairs:
    """Images of ``<root>/<image_dir>`` with their masks in ``<root>/<mask_dir>``, split by seed into
    ``data.split``; labels 0..data.num_classes-1, 0 ignored with ``data.reduce_zero_label``."""

    name = "folder"

    def __init__(self, data: dict, cache_dir: Path, seed: int):
        self.data, self.seed = data, seed
        self.class_names = [str(c) for c in range(self.count_classes())]

    def count_classes(self) -> int:
        if self.data["num_classes"] is None:
            raise DataError("data.num_classes must be set for the folder dataset")
        return self.data["num_classes"]

    def reduce_zero_label(self) -> bool:
        return self.data["reduce_zero_label"]

    def pairs(self, root: Path) -> dict[str, list[tuple[Path, Path]]]:
        everything = image_mask_pairs(root / self.data["image_dir"], root / self.data["mask_dir"])
        splits = seeded_split(len(everything), tuple(self.data["split"]), self.seed)
        return {split: [everything[i] for i in idx] for split, idx in zip(SPLITS, splits)}

    def load(self, transforms: dict) -> dict[str, Dataset]:
        if self.data["root"] is None:
            raise DataError(f"data.root must point at the {self.name} files (nothing is downloaded)")
        pairs = self.pairs(require_path(self.data["root"]))
        return {split: FileSegmentation(pairs[split], len(self.class_names), self.data["ignore_index"],
                                        self.reduce_zero_label(), transforms[split]) for split in SPLITS}


class ADE20K(FolderPairs):
    """ADEChallengeData2016 (``data.root`` is that folder or its parent): 150 classes, label 0
    (unlabelled) ignored."""

    name = "ade20k"

    def count_classes(self) -> int:
        return ADE20K_CLASSES

    def reduce_zero_label(self) -> bool:
        return True

    def pairs(self, root: Path) -> dict[str, list[tuple[Path, Path]]]:
        # ADE20K's test labels are not public: validation is the test set (as in every paper).
        train, val = ade20k_pairs(root, "training"), ade20k_pairs(root, "validation")
        return {"train": train, "val": val, "test": val}


DATASETS = {"digits": DigitScenes, "ade20k": ADE20K, "folder": FolderPairs}


# ---------------------------------------------------------------- the data module

class SegmentationDataModule(SplitDataModule):
    """``data["dataset"]`` names one of ``DATASETS``; ``num_classes``, ``ignore_index`` and
    ``class_names`` are known before ``setup`` so the model can be built first."""

    def __init__(self, data: dict, cache_dir: str | Path, seed: int):
        super().__init__(data["batch_size"], num_workers=data["num_workers"],
                         collate_fn=PadCollate(data["ignore_index"]))
        self.data, self.ignore_index = data, data["ignore_index"]
        self.source = DATASETS[data["dataset"]](data, Path(cache_dir), seed)
        self.class_names = self.source.class_names

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def setup(self, stage: str | None = None) -> None:
        if self.datasets:
            return
        evaluate = eval_transform(self.data)
        self.datasets = self.source.load({"train": train_transform(self.data), "val": evaluate, "test": evaluate})
