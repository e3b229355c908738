"""Segmentation data: digit scenes composed from real MNIST handwriting (embedded default), ADE20K in
its ADEChallengeData2016 layout, and any folder of images with label masks.

Splits never follow the training seed. ADE20K and a folder dataset with split folders
(``<root>/{train,val,test}/{images,masks}/`` or CamVid's ``<root>/{train,trainannot,val,valannot,test,
testannot}/``) are used as shipped; a single images + masks folder pair is split by ``data.split`` from
``data.split_seed``, at random or grouped by ``data.group_pattern`` (e.g. the video a frame comes from).
Before training, a sample of each split's masks is checked against ``num_classes`` and the ignore index.

``LOADERS`` (at the end) maps each ``data.dataset`` name to its source: a class that knows the class
names at once (the model is built from them) and reads or generates the data only at ``setup``. Stored samples are
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
from torch import Tensor
from torch.utils.data import Dataset
from torchvision import tv_tensors
from torchvision.transforms import v2

from common.data import (
    SPLITS,
    DataError,
    Split,
    SplitDataModule,
    cached,
    grouping,
    load_mnist,
    named,
    read_image,
    require_path,
    seeded_split,
    shipped_split,
    short_hash,
    split_folders,
    split_names,
)
from common.files import MAX_DOCUMENT_BYTES, read_text

from .augment import DeviceAugment
from .config import Data

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
                   ink_style: str, max_overlap: float, placement_tries: int,
                   generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """``count`` scenes: ``digits_per_image`` digits (ink in [0, 1]) drawn from ``digits`` at random
    sizes and positions, each inked as ``ink_style`` says (``config.INKS``), overlapping earlier digits' regions
    by at most ``max_overlap`` (``placement_tries`` positions are tried). Strokes are widened by
    ``dilate`` pixels (of the 28-pixel original) to draw the digit and by ``label_dilate`` to label it: a
    digit is an object region of digit+1 around its strokes, not a hairline that a patch-resolution
    segmenter could never trace. Everything else is 0 (background)."""
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
            patch = image[:, window[0], window[1]]
            if ink_style == "colour":  # a cyclic shift of at least 0.3 per channel keeps it visible on its background
                colour = (patch.mean(dim=(1, 2)) + 0.3 + 0.4 * torch.rand(3, generator=generator)) % 1.0
            else:
                colour = 0.15 * torch.rand(3, generator=generator)
            image[:, window[0], window[1]] = patch * (1 - ink) + colour[:, None, None] * ink
            masks[i][window][region > 0.5] = int(labels[pick]) + 1
        images[i] = (image * 255).round().to(torch.uint8)
    return images, masks


def digit_scenes(data: Data, cache_dir: Path) -> dict[str, tuple[Tensor, Tensor]]:
    """Train/val/test scenes; each split draws from its own digits, so test handwriting is unseen. The
    digit pools and the scenes follow from ``data.split_seed``."""
    mnist = load_mnist(cache_dir)
    digits, labels = mnist["images"][:, 0].float() / 255, mnist["labels"]
    pools = seeded_split(len(digits), tuple(data.split), data.split_seed)
    generator = torch.Generator().manual_seed(data.split_seed)
    scenes = data.scenes
    return {
        stage: compose_scenes(digits[pool], labels[pool], getattr(scenes, stage), scenes.image_size,
                              scenes.digits_per_image, scenes.digit_size, scenes.dilate, scenes.label_dilate,
                              scenes.texture, scenes.ink, scenes.max_overlap, scenes.placement_tries, generator)
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
    """``split`` (training | validation) of ADEChallengeData2016 at ``root``."""
    return image_mask_pairs(root / "images" / split, root / "annotations" / split)


def read_labels(mask_path: Path, reduce_zero_label: bool, ignore_index: int) -> Tensor:
    """A mask's labels [H, W] (long). ``reduce_zero_label`` (ADE20K): 0 (unlabelled) becomes
    ``ignore_index`` and every other label moves down by one."""
    labels = np.asarray(read_image(mask_path, None))
    if labels.ndim != 2:
        raise DataError(f"{mask_path}: mask must have one channel of labels, found shape {labels.shape}")
    labels = torch.from_numpy(labels.astype(np.int64))
    if reduce_zero_label:
        labels = torch.where((labels == 0) | (labels == ignore_index), ignore_index, labels - 1)
    return labels


def stray_labels(labels: Tensor, num_classes: int, ignore_index: int) -> Tensor:
    """The distinct labels that are neither a class nor ``ignore_index``."""
    values = labels.unique()
    return values[((values < 0) | (values >= num_classes)) & (values != ignore_index)]


def check_labels(pairs: list[tuple[Path, Path]], count: int, num_classes: int, ignore_index: int,
                 reduce_zero_label: bool) -> None:
    """Read ``count`` masks spread evenly over ``pairs`` and fail in one line, before any training, if one
    holds a label that is neither a class nor the ignore index (a wrong num_classes or ignore index would
    otherwise fail mid-run, or, for a label past the ignore index, never)."""
    picks = sorted({round(i) for i in np.linspace(0, len(pairs) - 1, min(count, len(pairs)))})
    bad = [(pairs[i][1], stray) for i in picks
           if len(stray := stray_labels(read_labels(pairs[i][1], reduce_zero_label, ignore_index),
                                        num_classes, ignore_index))]
    if bad:
        path, stray = bad[0]
        raise DataError(f"{path}: label {int(stray[0])} is neither a class (0..{num_classes - 1}) nor the ignore "
                        f"index {ignore_index} ({len(bad)} of {len(picks)} masks checked); set data.num_classes "
                        f"(or data.class_names) and data.ignore_index to the dataset's")


class FileSegmentation(Dataset):
    """Image/mask files, read with PIL; masks as ``read_labels`` gives them."""

    def __init__(self, pairs: list[tuple[Path, Path]], num_classes: int, ignore_index: int,
                 reduce_zero_label: bool, transform):
        self.pairs, self.num_classes, self.ignore_index = pairs, num_classes, ignore_index
        self.reduce_zero_label, self.transform = reduce_zero_label, transform

    def __len__(self) -> int:
        return len(self.pairs)

    def load(self, index: int) -> tuple[Tensor, Tensor]:
        image_path, mask_path = self.pairs[index]
        labels = read_labels(mask_path, self.reduce_zero_label, self.ignore_index)
        image = read_image(image_path, "RGB")
        if image.size != (labels.shape[1], labels.shape[0]):
            raise DataError(f"{mask_path}: mask size {tuple(labels.shape[::-1])} differs from image "
                            f"{image_path.name} size {image.size}")
        stray = stray_labels(labels, self.num_classes, self.ignore_index)
        if len(stray):
            raise DataError(f"{mask_path}: label {int(stray[0])} outside 0..{self.num_classes - 1} "
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


def train_transform(data: Data) -> v2.Compose:
    jitter, fill = data.jitter, {tv_tensors.Image: 0, tv_tensors.Mask: data.ignore_index}
    return v2.Compose([
        RandomScale(data.scale_range, data.resize),
        v2.RandomCrop(data.crop_size, pad_if_needed=True, fill=fill),
        v2.RandomHorizontalFlip() if data.flip else v2.Identity(),
        v2.ToDtype({tv_tensors.Image: torch.float32, "others": None}, scale=True),
        v2.ColorJitter(jitter.brightness, jitter.contrast, jitter.saturation, jitter.hue),
    ])


def stored_as_float() -> v2.ToDtype:
    """Images as stored, in [0, 1]: what the loader hands on when the device augments (``DeviceAugment``)."""
    return v2.ToDtype({tv_tensors.Image: torch.float32, "others": None}, scale=True)


def eval_transform(data: Data) -> v2.Compose:
    """Evaluation images at ``data.eval_resize`` (short side), or as stored when it is None."""
    resize = [v2.Resize(data.eval_resize)] if data.eval_resize is not None else []
    return v2.Compose(resize + [stored_as_float()])


class PadCollate:
    """Stack samples of different sizes by padding to the largest (image 0, mask ``ignore_index``); with
    ``sizes``, also each sample's (height, width) before padding, which ``DeviceAugment`` needs."""

    def __init__(self, ignore_index: int, sizes: bool = False):
        self.ignore_index, self.sizes = ignore_index, sizes

    def __call__(self, samples):
        height = max(image.shape[-2] for image, _ in samples)
        width = max(image.shape[-1] for image, _ in samples)
        pad = lambda x, fill: F.pad(x, (0, width - x.shape[-1], 0, height - x.shape[-2]), value=fill)  # noqa: E731
        images = torch.stack([pad(image.as_subclass(Tensor), 0.0) for image, _ in samples])
        masks = torch.stack([pad(mask.as_subclass(Tensor), self.ignore_index) for _, mask in samples]).long()
        if self.sizes:
            return images, masks, torch.tensor([image.shape[-2:] for image, _ in samples])
        return images, masks


# ---------------------------------------------------------------- the datasets

class DigitScenes:
    """The embedded default: scenes generated from ``data.split_seed`` (``digit_scenes``), cached by
    their settings."""

    def __init__(self, data: Data, cache_dir: Path):
        self.data, self.cache_dir = data, cache_dir
        self.class_names = list(DIGIT_CLASSES)

    def load(self, transforms: dict) -> tuple[dict[str, Dataset], Split]:
        seed = self.data.split_seed
        key = short_hash({**self.data.scenes.model_dump(), "split": self.data.split})
        name = f"digits-seed{seed}-{key}"
        scenes = cached(self.cache_dir / "segmentation" / f"{name}.pt", lambda: digit_scenes(self.data, self.cache_dir))
        split = Split("random", f"MNIST handwriting pools: fractions {self.data.split} at random, split seed "
                                f"{seed}; each split's scenes composed from its pool",
                      {s: [f"{name}/{s}/{i}" for i in range(len(scenes[s][0]))] for s in SPLITS})
        return {s: TensorSegmentation(*scenes[s], transforms[s]) for s in SPLITS}, split


def numbered_classes(count: int) -> list[str]:
    """Class names for classes known only by number, zero-padded so that their metric keys sort in order."""
    return [f"{c:0{len(str(count - 1))}d}" for c in range(count)]


class FolderPairs:
    """Images with label masks of the same stem (``.png``) under ``data.root``, in split folders used as
    shipped (``<split>/<image_dir>`` + ``<split>/<mask_dir>``, or CamVid's ``<split>`` + ``<split>annot``), or
    in one ``<image_dir>`` + ``<mask_dir>`` pair split by ``data.split``. Labels 0..num_classes-1, named by
    ``data.class_names`` (a file of one name per line, relative to the root) or by number."""

    name = "folder"

    def __init__(self, data: Data, cache_dir: Path):
        self.data = data
        names, count = self.read_class_names(), self.count_classes()
        if names is None and count is None:
            raise DataError("the folder dataset needs data.num_classes or data.class_names (a file of class names)")
        if names is not None and count is not None and len(names) != count:
            raise DataError(f"{self.data.class_names}: {len(names)} class names for {count} classes")
        self.class_names = names or numbered_classes(count)

    def count_classes(self) -> int | None:
        """The number of classes, where the config or the dataset fixes it."""
        return self.data.num_classes

    def read_class_names(self) -> list[str] | None:
        """The names in ``data.class_names`` (a path relative to ``data.root``, or absolute), if given."""
        if self.data.class_names is None:
            return None
        path = Path(self.data.root or ".") / Path(self.data.class_names).expanduser()
        names = [line.strip() for line in read_text(path, "class names file", MAX_DOCUMENT_BYTES).splitlines()]
        names = [name for name in names if name]
        if not names or len(set(names)) < len(names):
            raise DataError(f"{path}: needs one distinct class name per line, in label order")
        return names

    def reduce_zero_label(self) -> bool:
        return self.data.reduce_zero_label

    def split_pairs(self, root: Path) -> dict[str, list[tuple[Path, Path]]]:
        """The pairs of each split folder (``split_folders``), in either layout; empty when there are none."""
        pairs = {}
        image_dir, mask_dir = self.data.image_dir, self.data.mask_dir
        for split, folder in split_folders(root).items():
            if (folder / image_dir).is_dir():
                pairs[split] = image_mask_pairs(folder / image_dir, folder / mask_dir)
            elif (root / f"{split}annot").is_dir():
                pairs[split] = image_mask_pairs(folder, root / f"{split}annot")
            else:
                raise DataError(f"split folder {folder} has neither {image_dir}/ + {mask_dir}/ inside nor "
                                f"{split}annot/ beside it")
        return pairs

    def pairs(self, root: Path) -> tuple[Split, dict[str, tuple[Path, Path]]]:
        """How the pairs split (members: image paths relative to the root) and each member's pair."""
        data, shipped = self.data, self.split_pairs(root)
        groups = grouping(data)
        if shipped:
            members = {split: list(named(pairs, root)) for split, pairs in shipped.items()}
            split = shipped_split(members, None, data.split, data.split_seed, groups)
            return split, {name: pair for pairs in shipped.values() for name, pair in named(pairs, root).items()}
        pair_of = named(image_mask_pairs(root / data.image_dir, root / data.mask_dir), root)
        return split_names(list(pair_of), data.split, data.split_seed, groups), pair_of

    def load(self, transforms: dict) -> tuple[dict[str, Dataset], Split]:
        if self.data.root is None:
            raise DataError(f"data.root must point at the {self.name} files (nothing is downloaded)")
        split, pair_of = self.pairs(require_path(self.data.root, "data.root"))
        num_classes, ignore, reduce = len(self.class_names), self.data.ignore_index, self.reduce_zero_label()
        datasets = {}
        for name in SPLITS:
            pairs = [pair_of[member] for member in split.members[name]]
            check_labels(pairs, self.data.label_check, num_classes, ignore, reduce)
            datasets[name] = FileSegmentation(pairs, num_classes, ignore, reduce, transforms[name])
        return datasets, split


class ADE20K(FolderPairs):
    """ADEChallengeData2016 (``data.root`` is that folder or its parent): 150 classes, label 0
    (unlabelled) ignored; its validation set is also the test set (the test labels are not public)."""

    name = "ade20k"

    def count_classes(self) -> int:
        return ADE20K_CLASSES

    def reduce_zero_label(self) -> bool:
        return True

    def pairs(self, root: Path) -> tuple[Split, dict[str, tuple[Path, Path]]]:
        if (root / "ADEChallengeData2016").is_dir():
            root = root / "ADEChallengeData2016"
        found = {split: named(ade20k_pairs(root, folder), root)
                 for split, folder in (("train", "training"), ("val", "validation"))}
        split = shipped_split({split: list(pairs) for split, pairs in found.items()},
                              "ADEChallengeData2016 training/ validation/", self.data.split, self.data.split_seed)
        return split, {name: pair for pairs in found.values() for name, pair in pairs.items()}


# ---------------------------------------------------------------- the data module

class SegmentationDataModule(SplitDataModule):
    """``data.dataset`` names one of ``LOADERS``; ``num_classes``, ``ignore_index``
    and ``class_names`` are known before ``setup`` so the model can be built first. The data, and so the
    split, depend on ``data`` alone."""

    def __init__(self, data: Data, cache_dir: str | Path):
        super().__init__(data.batch_size, num_workers=data.num_workers, collate_fn=PadCollate(data.ignore_index))
        self.data, self.ignore_index = data, data.ignore_index
        self.device_augment = DeviceAugment(data) if data.augment_on == "device" else None
        self.source = LOADERS[data.dataset](data, Path(cache_dir))
        self.class_names = self.source.class_names

    def train_dataloader(self):
        if self.device_augment is None:
            return super().train_dataloader()
        return self.loader("train", collate_fn=PadCollate(self.ignore_index, sizes=True))

    def augment_batch(self, batch):
        return batch if self.device_augment is None else self.device_augment(*batch)

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def setup(self, stage: str | None = None) -> None:
        if self.datasets:
            return
        evaluate = eval_transform(self.data)
        train = train_transform(self.data) if self.device_augment is None else stored_as_float()
        transforms = {"train": train, "val": evaluate, "test": evaluate}
        self.datasets, split = self.source.load(transforms)
        self.describe_split(*split)


# data.dataset -> its loader (config.DATASETS names them)
LOADERS = {"digits": DigitScenes, "ade20k": ADE20K, "folder": FolderPairs}
