"""The point-cloud domain's config: its typed ``data``, ``model`` and ``task`` sections and its defaults of the
shared ones. Its presets are in configs/domain/pointcloud.yaml."""
from typing import Annotated, Literal

from pydantic import Field

from common.schema import Fraction, NonNegative, Optim, Positive, Robustness, RunConfig, Trainer
from common.sections import GroupedSplit, Loader, Transformer
from common.typed import Model

DATASETS = ("shapes", "modelnet", "folder")  # their loaders: data.LOADERS

Scale = Annotated[list[Annotated[float, Field(gt=0)]], Field(min_length=2, max_length=2)]  # [low, high] factors
Shares = Annotated[list[Fraction], Field(min_length=2, max_length=2)]  # [low, high]


class Shapes(Model):
    """The generated default: open3d shapes of every class, drawn per split."""

    train_per_class: Positive = 100
    val_per_class: Positive = 20
    test_per_class: Positive = 40
    scale: Scale = [0.6, 1.4]
    """Random per-axis (non-uniform) scale."""
    rotation: Literal["z", "full"] = "z"
    """z: a random turn about the vertical axis (upright shapes, like ModelNet); full: SO(3)."""
    crop_prob: Fraction = 0.5
    """The chance of a partial view: points beyond a random plane removed."""
    crop_keep: Shares = [0.6, 0.9]
    """The share of the surface a partial view keeps."""
    poisson_prob: Fraction = 0.5
    """Poisson-disk sampling, else uniform."""
    noise: NonNegative = 0.01
    """Gaussian noise, relative to the shape's radius."""


class Augment(Model):
    """Training only, on the device."""

    scale: Scale = [0.67, 1.5]
    """Per axis."""
    shift: NonNegative = 0.2
    jitter_sigma: NonNegative = 0.01
    jitter_clip: NonNegative = 0.05
    dropout_max: Fraction = 0.5
    """Each cloud drops a uniform share in [0, dropout_max] of its points."""


class Data(Loader, GroupedSplit):
    """The clouds: generated shapes, ModelNet10/40 or any class-per-folder mesh tree, sampled and normalised to the
    unit sphere."""

    dataset: Literal[DATASETS] = "shapes"
    """shapes (generated, offline), modelnet (<class>/{train,test}/*.off) or folder (<class>/*)."""
    root: str | None = None
    """modelnet / folder: the dataset folder."""
    num_points: Positive = 1024
    """Points per cloud (meshes are sampled to this once and cached)."""
    val_fraction: Fraction = 0.1
    """modelnet / folder: validation carved from the training files (when no val/ ships). modelnet uses its
    <class>/{train,test}/ folders; folder uses split folders <root>/{train,val,test}/<class>/* as shipped (no test/:
    val is also the test set), else splits one <class>/* tree by the fractions."""
    test_fraction: Fraction = 0.2
    """folder without split folders: the held-out test share."""
    shapes: Shapes = Shapes()
    augment: Augment = Augment()


class Net(Transformer):
    """``domains.pointcloud.model.PointTransformer``'s keyword arguments."""

    num_groups: Positive = 64
    """Farthest-point centres = tokens."""
    group_size: Positive = 32
    """Nearest neighbours per centre."""
    tokenizer_hidden: Positive = 64
    """The mini-PointNet's widths: hidden, 2x, 4x."""
    pos_hidden: Positive = 128
    """The hidden width of the MLP that embeds each centre's coordinates."""
    head_hidden: Positive = 256
    """The classifier's hidden width (its input: the tokens' max and mean, 2 x dim)."""
    head_dropout: Fraction = 0.5
    """Before the classifier's last layer."""
    drop_path: Fraction = 0.0
    """Stochastic depth at the last layer (linear from 0)."""


class Jitter(Model):
    """Gaussian noise on every coordinate, clipped."""

    sigma: NonNegative = 0.02
    clip: NonNegative = 0.05


class PointDropout(Model):
    ratio: Fraction = 0.5
    """The share of each cloud's points dropped (their slots refilled with kept points)."""


class Perturbations(Model):
    """Test-time conditions, each reported as test/acc_<condition> (the same noise for every variant)."""

    jitter: Jitter = Jitter()
    dropout: PointDropout = PointDropout()


class Task(Model):
    """``domains.pointcloud.model.PointCloudTask``'s keyword arguments."""

    label_smoothing: Fraction = 0.0
    perturbations: Perturbations = Perturbations()


class PointcloudConfig(RunConfig):
    """Point-cloud classification: a Point-MAE-style patch transformer (farthest-point groups -> mini-PointNet
    tokens -> transformer) on generated open3d shapes, ModelNet10/40 or any class-per-folder mesh tree."""

    task: Task = Task()
    optim: Optim = Optim(lr=5.0e-4, weight_decay=0.05, warmup_steps=50)
    trainer: Trainer = Trainer(max_epochs=20)
    data: Data = Data()
    model: Net = Net()
    robustness: Robustness = Robustness(input_range=None, eps=[0.01, 0.02, 0.05], severities=[1], max_samples=200)
    """``quest robustness <run dir>``: L-inf attacks on the coordinates, which are unbounded (clouds are normalised
    to the unit sphere); eps in units of its radius. Image corruptions do not apply; jitter and point dropout are
    task.perturbations."""
