"""ImageNet-ReaL, ImageNet-C and ImageNet-A (domains/vision/imagenet.py) on tiny trees in the datasets' own
layouts, scored by a model whose predictions follow from the images' colours, so every number can be worked
out by hand; and `quest imagenet` on a smoke run trained on such a tree."""
import json

import pytest
import torch
from conftest import CreatesAFile
from PIL import Image
from torch import nn

from common.data import DataError
from common.records import read_record
from domains.vision.config import Data
from domains.vision.imagenet import (
    ALEXNET_ERRORS,
    CORRUPTIONS,
    SEVERITIES,
    Classifier,
    corruption_errors,
    evaluate_imagenet_a,
    evaluate_imagenet_c,
    evaluate_real,
)

WNIDS = ["n01440764", "n01443537", "n01484850"]  # the first three ImageNet classes, in sorted order
RED, GREEN, BLUE = (255, 0, 0), (0, 255, 0), (0, 0, 255)
DATA = Data(channels=3, image_size=32, crop_pct=0.875, eval_batch_size=4, num_workers=0)
# AlexNet's ImageNet-C errors averaged over the severities, as google-research/augmix imagenet.py lists them.
AUGMIX_ALEXNET_ERR = [0.886428, 0.894468, 0.922640, 0.819880, 0.826268, 0.785948, 0.798360, 0.866816, 0.826572,
                      0.819324, 0.564592, 0.853204, 0.646056, 0.717840, 0.606500]


class ColourModel(nn.Module):
    """Logits are the mean red, green and blue of an image (classes 0, 1, 2), plus ``favour`` for class 2."""

    def __init__(self, favour: float = 0.0):
        super().__init__()
        self.mix = nn.Linear(3, 3)
        nn.init.eye_(self.mix.weight)
        nn.init.constant_(self.mix.bias, 0.0)
        self.mix.bias.data[2] = favour

    def forward(self, images):
        return self.mix(images.mean((2, 3)))


def colour_classifier(favour: float = 0.0) -> Classifier:
    return Classifier(ColourModel(favour).eval(), WNIDS, DATA)


def write_image(path, colour, size=(40, 30)):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, colour).save(path)


def write_folders(root, images: dict[str, list[tuple]], suffix=".JPEG"):
    """``images``: the colours of each wnid folder's images, saved as 0.JPEG, 1.JPEG, ..."""
    for wnid, colours in images.items():
        for i, colour in enumerate(colours):
            write_image(root / wnid / f"{i}{suffix}", colour)


# Validation images by ReaL entry (file ILSVRC2012_val_<entry + 1>): folder, colour (so the prediction) and
# ReaL labels. The folders hold the entries out of file-name order, so only matching by name scores right.
VAL = {0: (2, BLUE, [1]),     # predicted 2: right by the folder, wrong by ReaL
       1: (0, GREEN, []),     # no ReaL label: left out
       2: (1, GREEN, [0, 1]),  # predicted 1: one of two acceptable labels
       3: (2, RED, [0]),      # predicted 0: wrong by the folder, right by ReaL
       4: (0, RED, [0]),
       5: (1, BLUE, [1])}


def write_val(root, entries=VAL):
    for entry, (folder, colour, _) in entries.items():
        write_image(root / WNIDS[folder] / f"ILSVRC2012_val_{entry + 1:08d}.JPEG", colour)


def write_real(path, entries=VAL):
    path.write_text(json.dumps([labels for _, (_, _, labels) in sorted(entries.items())]))


def test_real_accuracy_over_images_with_labels_matched_by_file_name(tmp_path):
    write_val(tmp_path / "val")
    write_real(tmp_path / "real.json")
    results = evaluate_real(colour_classifier(), tmp_path / "real.json", tmp_path / "val")
    # ReaL: entries 2, 3, 4 of the five labelled ones; the folders: entries 0, 2, 4 of six.
    assert results == {"real_acc": 3 / 5, "real_images": 5, "real_val_acc": 3 / 6}
    # The first image of each folder by name: entries 1 (unlabelled), 2 (right) and 0 (wrong).
    first = evaluate_real(colour_classifier(), tmp_path / "real.json", tmp_path / "val", max_per_class=1)
    assert first["real_acc"] == 1 / 2 and first["real_images"] == 2


def test_real_errors(tmp_path):
    write_val(tmp_path / "val")
    classifier, real = colour_classifier(), tmp_path / "real.json"
    real.write_text(json.dumps([[0]] * 5))
    with pytest.raises(DataError, match="has 5 entries, none for this image"):
        evaluate_real(classifier, real, tmp_path / "val")
    real.write_text(json.dumps([[7]] * 6))
    with pytest.raises(DataError, match="names class 7, outside the run's 3 classes"):
        evaluate_real(classifier, real, tmp_path / "val")
    real.write_text(json.dumps({"ILSVRC2012_val_00000001.JPEG": [0]}))
    with pytest.raises(DataError, match="not ReaL's format"):
        evaluate_real(classifier, real, tmp_path / "val")
    write_real(real)
    write_image(tmp_path / "val" / WNIDS[0] / "photo.JPEG", RED)
    with pytest.raises(DataError, match="photo.JPEG: not an ILSVRC2012 validation file name"):
        evaluate_real(classifier, real, tmp_path / "val")


def test_alexnet_table_averages_to_the_published_errors():
    assert list(ALEXNET_ERRORS) == list(CORRUPTIONS)
    means = [sum(errors) / len(errors) for errors in ALEXNET_ERRORS.values()]
    assert means == pytest.approx(AUGMIX_ALEXNET_ERR, abs=1e-9)


def test_mce_normalises_each_corruption_by_alexnet_summed_over_severities():
    # CE = (0.2 + 0.4) / (AlexNet's 0.4 at severity 1 + 0.8 at severity 3): the table is indexed by severity.
    summary = corruption_errors({"fog": {1: 0.2, 3: 0.4}}, ["fog"], {"fog": (0.4, 0.9, 0.8)})
    assert summary == pytest.approx({"c_mce": 50.0, "c_ce_fog": 50.0, "c_error_mean": 0.3})


# ImageNet-C tree: per corruption and severity, one image per wnid; a wrong colour is a wrong prediction.
RIGHT = {WNIDS[0]: [RED], WNIDS[1]: [GREEN], WNIDS[2]: [BLUE]}
ONE_WRONG = {WNIDS[0]: [RED], WNIDS[1]: [GREEN], WNIDS[2]: [RED]}
ALL_WRONG = {WNIDS[0]: [GREEN], WNIDS[1]: [BLUE], WNIDS[2]: [RED]}
TREE = {"gaussian_noise": {1: RIGHT, 2: ONE_WRONG}, "fog": {1: ONE_WRONG, 2: ALL_WRONG},
        "spatter": {1: ALL_WRONG, 2: ALL_WRONG}}  # spatter: an extra corruption, reported but not in mCE
SMALL_ALEXNET = {"gaussian_noise": (0.5, 0.5), "fog": (0.25, 0.75)}


def write_imagenet_c(root, tree=TREE):
    for corruption, severities in tree.items():
        for severity, images in severities.items():
            write_folders(root / corruption / str(severity), images)


def test_imagenet_c_errors_and_mce(tmp_path):
    write_imagenet_c(tmp_path)
    results = evaluate_imagenet_c(colour_classifier(), tmp_path, corruptions=["gaussian_noise", "fog"],
                                  extras=["spatter", "saturate"], severities=[1, 2], alexnet=SMALL_ALEXNET)
    # CE: gaussian noise (0 + 1/3) / (0.5 + 0.5) = 1/3, fog (1/3 + 1) / (0.25 + 0.75) = 4/3; mCE their mean.
    assert results == pytest.approx({
        "c_ce_gaussian_noise": 100 / 3, "c_ce_fog": 400 / 3, "c_mce": 250 / 3,
        "c_error_mean": (1 / 6 + 2 / 3) / 2,
        "c_error_gaussian_noise_s1": 0.0, "c_error_gaussian_noise_s2": 1 / 3,
        "c_error_fog_s1": 1 / 3, "c_error_fog_s2": 1.0, "c_error_spatter_s1": 1.0, "c_error_spatter_s2": 1.0,
        "c_images": 18})
    with pytest.raises(DataError, match="lacks fog/3/"):
        evaluate_imagenet_c(colour_classifier(), tmp_path, corruptions=["fog"], extras=[], severities=[1, 2, 3],
                            alexnet=SMALL_ALEXNET)


def test_imagenet_a_restricts_the_argmax_to_its_classes(tmp_path):
    # Class 2 (absent from this ImageNet-A) tops every logit vector; among classes 0 and 1 the colour decides.
    write_folders(tmp_path / "a", {WNIDS[0]: [RED, RED, GREEN], WNIDS[1]: [GREEN]}, suffix=".jpg")
    assert colour_classifier(favour=2.0).model(torch.ones(1, 3, 4, 4)).argmax() == 2
    results = evaluate_imagenet_a(colour_classifier(favour=2.0), tmp_path / "a")
    assert results == {"a_acc": 3 / 4, "a_images": 4}
    write_folders(tmp_path / "a", {"n99999999": [RED]}, suffix=".jpg")
    with pytest.raises(DataError, match="1 class folder.*the run was not trained on, e.g. n99999999"):
        evaluate_imagenet_a(colour_classifier(), tmp_path / "a")


def test_quest_imagenet_adds_the_suites_to_the_record(tmp_path, capsys):
    from runners.cli import main
    from runners.runs.training import train

    write_folders(tmp_path / "imagenet" / "train", {wnid: [RED, GREEN, BLUE, RED] for wnid in WNIDS})
    write_val(tmp_path / "imagenet" / "val")
    write_real(tmp_path / "real.json")
    write_imagenet_c(tmp_path / "c", {c: dict.fromkeys(SEVERITIES, ONE_WRONG) for c in CORRUPTIONS})
    write_folders(tmp_path / "a", {WNIDS[0]: [RED], WNIDS[2]: [BLUE]}, suffix=".jpg")
    record = train(["domain=vision", "preset=smoke", "attention=standard", f"output_dir={tmp_path / 'runs'}",
                    f"cache_dir={tmp_path / 'cache'}", "data.dataset=imagefolder", f"data.root={tmp_path / 'imagenet'}",
                    "data.image_size=32", "model.patch_size=8", "data.channels=3", "data.mean=[0.5,0.5,0.5]",
                    "data.std=[0.25,0.25,0.25]"])
    assert record.status == "ok"
    run_dir = next((tmp_path / "runs").glob("vision/standard/seed*"))

    assert main(["imagenet", str(run_dir), "--real", str(tmp_path / "real.json"), "--imagenet-c", str(tmp_path / "c"),
                 "--max-per-class", "1"]) == 0
    assert "ImageNet-C     mCE" in capsys.readouterr().out
    saved = read_record(run_dir).imagenet
    assert saved["real_images"] == 2 and saved["c_images"] == 15 * 5 * 3  # ReaL: the first image of each folder
    errors = {c: {s: saved[f"c_error_{c}_s{s}"] for s in SEVERITIES} for c in CORRUPTIONS}
    assert saved["c_mce"] == pytest.approx(corruption_errors(errors, CORRUPTIONS, ALEXNET_ERRORS)["c_mce"])

    assert main(["imagenet", str(run_dir), "--imagenet-a", str(tmp_path / "a")]) == 0  # adds to the record
    saved = read_record(run_dir).imagenet
    assert saved["a_images"] == 2 and "c_mce" in saved and "real_acc" in saved
    assert main(["imagenet", str(run_dir), "--imagenet-c", str(tmp_path / "a")]) == 2  # not ImageNet-C's layout
    assert main(["imagenet", str(tmp_path / "missing"), "--imagenet-a", str(tmp_path / "a")]) == 2
    with pytest.raises(SystemExit):
        main(["imagenet", str(run_dir)])  # no suite given
    marker = tmp_path / "ran-code"  # a checkpoint crafted to run code is refused, not run
    torch.save({"state_dict": {}, "payload": CreatesAFile(marker)}, run_dir / "checkpoints" / "best.ckpt")
    assert main(["imagenet", str(run_dir), "--imagenet-a", str(tmp_path / "a")]) == 2 and not marker.exists()
