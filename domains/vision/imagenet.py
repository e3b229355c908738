"""ImageNet's evaluation suites for a trained classifier, read from their on-disk formats.

- ImageNet-ReaL (Beyer et al. 2020, google-research/reassessed-imagenet): ``real.json`` is a JSON list with
  one entry per ILSVRC2012 validation image in file-name order (``ILSVRC2012_val_00000001.JPEG`` is entry
  0), each the list of acceptable class indices. ReaL accuracy is the share of the images with a non-empty
  list whose top-1 prediction is in it; images with an empty list are left out.
- ImageNet-C (Hendrycks & Dietterich 2019): ``<root>/<corruption>/<severity 1..5>/<wnid>/*.JPEG``. The
  corruption error CE_c = Σ_s E(c, s) / Σ_s E_AlexNet(c, s) over the severities, from top-1 errors E;
  mCE is its mean over the 15 benchmark corruptions. The 4 extra corruptions, where present, are reported
  but stay out of mCE, as in the paper.
- ImageNet-A (Hendrycks et al. 2021): ``<root>/<wnid>/*.jpg`` over 200 of the 1000 classes. A prediction is
  the argmax over the logits of those 200 classes only, as the paper evaluates 1000-class models.

Labels are the run's class indices: its classes are the sorted wnid folders of its train/, the order in
which ReaL numbers the 1000 classes too, so ReaL applies to runs that trained on all of them. A wnid the
run lacks is a ``DataError``. Images go through the run's evaluation transform (resize, centre crop), as
AugMix's ImageNet-C evaluation does. ``max_per_class`` keeps the first images of each class by file name.

Results are flat name -> number maps, as a run record's numeric fields are: accuracies and errors as
fractions; CE and mCE in percent (AlexNet = 100), as the literature reports them.
"""
from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader

from common.data import DataError, class_folder_files, require_path
from common.files import MiB, read_json

from .config import Data
from .data import IMAGE_EXTENSIONS, ImageFiles, eval_transform

CORRUPTIONS = ("gaussian_noise", "shot_noise", "impulse_noise", "defocus_blur", "glass_blur", "motion_blur",
               "zoom_blur", "snow", "frost", "fog", "brightness", "contrast", "elastic_transform", "pixelate",
               "jpeg_compression")
EXTRA_CORRUPTIONS = ("speckle_noise", "gaussian_blur", "spatter", "saturate")
SEVERITIES = (1, 2, 3, 4, 5)
# AlexNet's top-1 error on ImageNet-C at severities 1..5: the normaliser of CE (Hendrycks & Dietterich 2019).
# Per severity as in UCSC-VLAA/RobustCNN timm/utils/imagenet_c.py; their means over the severities are the
# per-corruption errors that google-research/augmix imagenet.py takes from hendrycks/robustness ("Raw AlexNet
# errors", 0.886428 for gaussian_noise ...), which tests/test_imagenet.py checks.
ALEXNET_ERRORS = {
    "gaussian_noise": (0.69528, 0.82542, 0.93554, 0.98138, 0.99452),
    "shot_noise": (0.71224, 0.85108, 0.93574, 0.98182, 0.99146),
    "impulse_noise": (0.78374, 0.89808, 0.94870, 0.98720, 0.99548),
    "defocus_blur": (0.65624, 0.73202, 0.85036, 0.91364, 0.94714),
    "glass_blur": (0.64308, 0.75054, 0.88806, 0.91622, 0.93344),
    "motion_blur": (0.58430, 0.70048, 0.82108, 0.89750, 0.92638),
    "zoom_blur": (0.70008, 0.76992, 0.80784, 0.84198, 0.87198),
    "snow": (0.71726, 0.88392, 0.86468, 0.91870, 0.94952),
    "frost": (0.61390, 0.79734, 0.88790, 0.89942, 0.93430),
    "fog": (0.67474, 0.76050, 0.84378, 0.87260, 0.94500),
    "brightness": (0.45140, 0.48502, 0.54048, 0.62166, 0.72440),
    "contrast": (0.64548, 0.76150, 0.88874, 0.97760, 0.99270),
    "elastic_transform": (0.52596, 0.70116, 0.55686, 0.64076, 0.80554),
    "pixelate": (0.52218, 0.54620, 0.73728, 0.87092, 0.91262),
    "jpeg_compression": (0.51002, 0.54718, 0.57294, 0.65458, 0.74778),
}
REAL_FILE_NAME = re.compile(r"ILSVRC2012_val_(\d{8})\.JPEG", re.IGNORECASE)

Samples = list[tuple[Path, int]]  # image files with the run's label of their class folder


class Classifier(NamedTuple):
    """A trained classifier as these evaluations take it: ``model`` (in eval mode) maps images in [0, 1] to
    logits over ``classes`` (wnids, in label order); ``data`` is its run's data section, whose evaluation
    transform, channels and batch size the images get."""

    model: nn.Module
    classes: list[str]
    data: Data


def class_samples(root: Path, classes: list[str], max_per_class: int | None = None) -> Samples:
    """The images under ``root/<wnid>/``, labelled with the run's index of their wnid: all of them, or the
    first ``max_per_class`` of each wnid by file name. A wnid the run was not trained on is a DataError."""
    files, wnids = class_folder_files(root, IMAGE_EXTENSIONS)
    unknown = sorted(set(wnids) - set(classes))
    if unknown:
        raise DataError(f"{root}: {len(unknown)} class folder(s) the run was not trained on, e.g. {unknown[0]}")
    label_of = {wnid: label for label, wnid in enumerate(classes)}
    taken = dict.fromkeys(range(len(wnids)), 0)
    samples = []
    for path, folder in files:
        if max_per_class is None or taken[folder] < max_per_class:
            taken[folder] += 1
            samples.append((path, label_of[wnids[folder]]))
    return samples


def labels_of(samples: Samples) -> Tensor:
    return torch.tensor([label for _, label in samples])


def predict(classifier: Classifier, samples: Samples, among: list[int] | None = None) -> Tensor:
    """The top-1 class of each sample, in order: the argmax over all logits, or over the classes ``among``."""
    model, data = classifier.model, classifier.data
    device = next(model.parameters()).device
    loader = DataLoader(ImageFiles(samples, data.channels, eval_transform(data)), batch_size=data.eval_batch_size,
                        num_workers=data.num_workers)
    subset = None if among is None else torch.tensor(among, device=device)
    predictions = []
    with torch.inference_mode():
        for images, _ in loader:
            logits = model(images.to(device))
            predictions.append(logits.argmax(-1) if subset is None else subset[logits[:, subset].argmax(-1)])
    return torch.cat(predictions).cpu()


def accuracy(predictions: Tensor, labels: Tensor) -> float:
    return int((predictions == labels).sum()) / len(labels)


# --- ImageNet-ReaL -----------------------------------------------------------------------------------

def read_real(path: str | Path) -> list[list[int]]:
    """ReaL's ``real.json`` (read as data: ``common.files``): one list of class indices per validation image."""
    labels = read_json(path, "ReaL labels file", 64 * MiB)  # 50,000 short lists: about 1 MiB
    if not isinstance(labels, list) or not all(
            isinstance(entry, list) and all(type(c) is int for c in entry) for entry in labels):
        raise DataError(f"{path}: not ReaL's format (a JSON list holding a list of class indices per image)")
    return labels


def real_labels(samples: Samples, real: list[list[int]], num_classes: int) -> list[list[int]]:
    """The ReaL labels of validation images, found by file name: ILSVRC2012_val_<n>.JPEG is entry n - 1."""
    found = []
    for path, _ in samples:
        match = REAL_FILE_NAME.fullmatch(path.name)
        if match is None:
            raise DataError(f"{path}: not an ILSVRC2012 validation file name (ILSVRC2012_val_<8 digits>.JPEG)")
        entry = int(match[1]) - 1
        if not 0 <= entry < len(real):
            raise DataError(f"{path}: real.json has {len(real)} entries, none for this image")
        outside = [c for c in real[entry] if not 0 <= c < num_classes]
        if outside:
            raise DataError(f"real.json entry {entry} names class {outside[0]}, outside the run's {num_classes} classes "
                            "(ReaL numbers the 1000 ImageNet classes: the run must have trained on all of them)")
        found.append(real[entry])
    return found


def real_accuracy(predictions: Tensor, labels: list[list[int]]) -> float:
    """The share of the images with a non-empty ReaL list whose prediction is in it."""
    hits = [int(p) in acceptable for p, acceptable in zip(predictions.tolist(), labels) if acceptable]
    if not hits:
        raise DataError("no evaluated validation image has a ReaL label")
    return sum(hits) / len(hits)


def evaluate_real(classifier: Classifier, real: str | Path, val: str | Path,
                  max_per_class: int | None = None) -> dict[str, float]:
    """``real_acc``; ``real_images``, the images it counts; ``real_val_acc``, top-1 accuracy against the
    original labels (the class folders) of all evaluated images, for comparison."""
    samples = class_samples(require_path(val, "ImageNet val folder"), classifier.classes, max_per_class)
    labels = real_labels(samples, read_real(real), len(classifier.classes))
    predictions = predict(classifier, samples)
    return {"real_acc": real_accuracy(predictions, labels), "real_images": sum(map(bool, labels)),
            "real_val_acc": accuracy(predictions, labels_of(samples))}


# --- ImageNet-C ---------------------------------------------------------------------------------------

def corruption_errors(errors: Mapping[str, Mapping[int, float]], corruptions: Sequence[str],
                      alexnet: Mapping[str, Sequence[float]]) -> dict[str, float]:
    """ImageNet-C's summary of top-1 errors ``errors[c][s]`` (fractions) over ``corruptions``: each
    ``c_ce_<c>`` = 100 Σ_s E(c, s) / Σ_s E_AlexNet(c, s) over the severities evaluated, where
    ``alexnet[c][s - 1]`` is AlexNet's E(c, s); ``c_mce``, their mean; ``c_error_mean``, the unnormalised
    mean error (over corruptions of the mean over severities)."""
    ce = {c: sum(errors[c].values()) / sum(alexnet[c][s - 1] for s in errors[c]) for c in corruptions}
    mean_errors = [sum(errors[c].values()) / len(errors[c]) for c in corruptions]
    return {"c_mce": 100 * sum(ce.values()) / len(ce), "c_error_mean": sum(mean_errors) / len(mean_errors),
            **{f"c_ce_{c}": 100 * value for c, value in ce.items()}}


def evaluate_imagenet_c(classifier: Classifier, root: str | Path, max_per_class: int | None = None, *,
                        corruptions: Sequence[str] = CORRUPTIONS, extras: Sequence[str] = EXTRA_CORRUPTIONS,
                        severities: Sequence[int] = SEVERITIES,
                        alexnet: Mapping[str, Sequence[float]] = ALEXNET_ERRORS) -> dict[str, float]:
    """The top-1 error ``c_error_<c>_s<s>`` at every severity of each of ``corruptions`` (all needed) and of
    the ``extras`` present under ``root``, ``corruption_errors`` over ``corruptions``, and ``c_images``."""
    root = require_path(root, "ImageNet-C root")
    errors: dict[str, dict[int, float]] = {}
    images = 0
    for corruption in (*corruptions, *(c for c in extras if (root / c).is_dir())):
        errors[corruption] = {}
        for severity in severities:
            folder = root / corruption / str(severity)
            if not folder.is_dir():
                raise DataError(f"ImageNet-C root {root} lacks {corruption}/{severity}/")
            samples = class_samples(folder, classifier.classes, max_per_class)
            errors[corruption][severity] = 1 - accuracy(predict(classifier, samples), labels_of(samples))
            images += len(samples)
    per_severity = {f"c_error_{c}_s{s}": error for c, by_severity in errors.items() for s, error in by_severity.items()}
    return {**corruption_errors(errors, corruptions, alexnet), **per_severity, "c_images": images}


# --- ImageNet-A ---------------------------------------------------------------------------------------

def evaluate_imagenet_a(classifier: Classifier, root: str | Path, max_per_class: int | None = None) -> dict[str, float]:
    """``a_acc``, with predictions restricted to the classes whose folders ``root`` holds; ``a_images``."""
    samples = class_samples(require_path(root, "ImageNet-A root"), classifier.classes, max_per_class)
    labels = labels_of(samples)
    predictions = predict(classifier, samples, among=sorted(set(labels.tolist())))
    return {"a_acc": accuracy(predictions, labels), "a_images": len(samples)}
