"""Segmentation domain: metrics with ignore pixels, the ADE20K layout and its label shift, bad input,
sliding-window inference, corruption conditions and their summaries, the digit-scene cache, and the
presets."""
import math
from pathlib import Path

import numpy as np
import pytest
import pytorch_lightning as pl
import torch
from PIL import Image

from common.data import DataError
from common.registry import get_domain
from common.robustness import corrupt
from common.task import perturbation_generator
from domains.segmentation.data import SegmentationDataModule
from runners.config import build_config, compose


def config(*overrides: str, preset: str = "smoke", cache_dir: Path | str = "/nonexistent"):
    """The BuildConfig of a segmentation run, composed as the runner composes it."""
    return build_config(compose(["domain=segmentation", f"preset={preset}", f"cache_dir={cache_dir}", *overrides]))


def build(*overrides: str, **kwargs):
    return get_domain("segmentation").build(config(*overrides, **kwargs))


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("segmentation-cache")


def test_miou_and_pixel_accuracy_against_hand_computed_example_with_ignore():
    _, task = build()
    target = torch.tensor([[[0, 0, 1, 1], [2, 2, 255, 255]]])
    preds = torch.tensor([[[0, 1, 1, 1], [2, 0, 0, 2]]])
    task.val_metrics.update(preds, target)
    task.class_iou.update(preds, target)
    scores = task.val_metrics.compute()
    # Six labelled pixels. Class 0: TP 1, FP 1, FN 1 -> 1/3; class 1: TP 2, FP 1 -> 2/3;
    # class 2: TP 1, FN 1 -> 1/2 (its prediction on an ignored pixel is no false positive).
    # Classes 3..10 appear nowhere and do not enter the mean.
    assert scores["val/miou"].item() == pytest.approx((1 / 3 + 2 / 3 + 1 / 2) / 3)
    assert scores["val/acc"].item() == pytest.approx(4 / 6)
    assert task.class_iou.compute()[:3].tolist() == pytest.approx([1 / 3, 2 / 3, 1 / 2])


def write_pair(image_dir: Path, mask_dir: Path, stem: str, labels: np.ndarray, image_size=None, suffix=".jpg"):
    image_dir.mkdir(parents=True, exist_ok=True)
    mask_dir.mkdir(parents=True, exist_ok=True)
    height, width = image_size or labels.shape
    pixels = np.random.default_rng(0).integers(0, 256, (height, width, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(image_dir / f"{stem}{suffix}")
    Image.fromarray(labels.astype(np.uint8), mode="L").save(mask_dir / f"{stem}.png")


def ade_labels(height=20, width=24):
    return (np.arange(height * width).reshape(height, width) % 151).astype(np.uint8)  # 0..150


def test_ade20k_layout_loads_with_zero_label_reduced(tmp_path):
    root = tmp_path / "ADEChallengeData2016"
    labels = ade_labels()
    for split in ("training", "validation"):
        for i in range(2):
            write_pair(root / "images" / split, root / "annotations" / split, f"ADE_{split}_{i:08d}", labels)
    datamodule = SegmentationDataModule(config("data.dataset=ade20k", f"data.root={tmp_path}").data, tmp_path, 0)
    assert datamodule.num_classes == 150 and datamodule.ignore_index == 255
    datamodule.setup()
    image, mask = datamodule.datasets["test"][0]
    expected = torch.from_numpy(labels.astype(np.int64))
    expected = torch.where(expected == 0, 255, expected - 1)  # 0 -> ignore, 1..150 -> 0..149
    assert image.shape == (3, 20, 24) and image.dtype == torch.float32 and 0 <= image.min() and image.max() <= 1
    assert torch.equal(mask.as_subclass(torch.Tensor), expected)
    images, masks = next(iter(datamodule.train_dataloader()))
    assert images.shape == (2, 3, 32, 32) and masks.shape == (2, 32, 32)  # crops of the smoke preset
    assert set(masks.unique().tolist()) <= set(range(150)) | {255}


def test_folder_pairs_reject_bad_input_naming_the_file(tmp_path):
    args = ("data.dataset=folder", f"data.root={tmp_path}", "data.num_classes=5", "data.split=[0.0,0.0,1.0]")
    cfg = config(*args).data
    labels = np.array([[0, 1], [4, 255]])
    write_pair(tmp_path / "images", tmp_path / "masks", "good", labels, suffix=".png")
    datamodule = SegmentationDataModule(cfg, tmp_path, 0)
    datamodule.setup()
    assert torch.equal(datamodule.datasets["test"][0][1].as_subclass(torch.Tensor), torch.from_numpy(labels))

    write_pair(tmp_path / "images", tmp_path / "masks", "outside", np.array([[0, 7], [1, 2]]), suffix=".png")
    write_pair(tmp_path / "images", tmp_path / "masks", "resized", labels, image_size=(3, 2), suffix=".png")
    datamodule = SegmentationDataModule(cfg, tmp_path, 0)
    datamodule.setup()
    files = {pair[0].stem: i for i, pair in enumerate(datamodule.datasets["test"].pairs)}
    with pytest.raises(DataError, match=r"outside\.png: label 7 outside 0\.\.4"):
        datamodule.datasets["test"][files["outside"]]
    with pytest.raises(DataError, match=r"resized\.png: mask size"):
        datamodule.datasets["test"][files["resized"]]

    (tmp_path / "images" / "orphan.jpg").write_bytes((tmp_path / "images" / "good.png").read_bytes())
    with pytest.raises(DataError, match=r"orphan\.jpg: missing mask"):
        SegmentationDataModule(cfg, tmp_path, 0).setup()
    with pytest.raises(DataError, match="does not exist"):
        SegmentationDataModule(config("data.dataset=ade20k", f"data.root={tmp_path}/none").data, tmp_path, 0).setup()


@pytest.mark.parametrize("decoder", ["mask", "linear"])
def test_sliding_window_equals_plain_inference_at_crop_size(decoder):
    _, task = build(f"model.decoder={decoder}", "model.window_stride=16")
    net = task.net.eval()
    images = torch.rand(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.allclose(net.sliding_window(images), net(images), atol=1e-6)
        # Larger (and patch-misaligned) images: interpolated positions, overlapping windows, full coverage.
        large = torch.rand(2, 3, 50, 41)
        assert net.sliding_window(large).shape == (2, 11, 50, 41)
        assert net(large).shape == (2, 11, 50, 41)


def test_corruption_conditions_perturb_with_the_condition_generator_and_summarise_by_corruption():
    _, task = build("task.perturbations.corruptions=[gaussian_noise,contrast]", "task.perturbations.severities=[1,5]")
    assert task.perturbations == {"gaussian_noise_1": {"name": "gaussian_noise", "severity": 1},
                                  "gaussian_noise_5": {"name": "gaussian_noise", "severity": 5},
                                  "contrast_1": {"name": "contrast", "severity": 1},
                                  "contrast_5": {"name": "contrast", "severity": 5}}
    images = torch.rand(2, 3, 32, 32)
    for condition, settings in task.perturbations.items():
        ours, reference = (perturbation_generator(0, 3, condition, images.device) for _ in range(2))
        expected = corrupt(images, settings["name"], settings["severity"], reference)
        assert torch.equal(task.perturb(images, condition, settings, ours), expected), condition
    scores = dict(zip(task.perturbations, torch.tensor([0.4, 0.2, 0.8, 0.6])))
    summary = {name: float(value) for name, value in task.summarize_perturbed(scores).items()}
    assert summary == pytest.approx({"miou_corrupt": 0.5, "miou_gaussian_noise": 0.3, "miou_contrast": 0.7})


def test_the_variant_runs_in_encoder_and_decoder():
    _, task = build("attention.variant=qknorm_ds")
    attention_layers = [m for m in task.net.modules() if type(m).__name__ == "MultiheadAttention"]
    assert len(attention_layers) == 2 and all(m.variant.name == "qknorm_ds" for m in attention_layers)


def test_digit_scenes_are_cached_and_seeded(cache_dir):
    first = SegmentationDataModule(config().data, cache_dir, seed=0)
    first.setup()
    images, masks = first.datasets["train"].images, first.datasets["train"].masks
    assert images.shape == (8, 3, 48, 48) and images.dtype == torch.uint8
    assert set(masks.unique().tolist()) <= set(range(11)) and (masks > 0).any()
    assert len(list((cache_dir / "segmentation").glob("digits-seed0-*.pt"))) == 1
    assert (cache_dir / "mnist5k.pt").exists()  # the handwriting comes from common.data.load_mnist
    other = SegmentationDataModule(config().data, cache_dir, seed=1)
    other.setup()
    assert not torch.equal(other.datasets["train"].images, images)


def test_test_epoch_logs_clean_corrupted_and_per_class_scores(cache_dir):
    datamodule, task = build(cache_dir=cache_dir)
    trainer = pl.Trainer(**compose(["domain=segmentation", "preset=smoke"]).trainer, logger=False,
                         enable_checkpointing=False, enable_model_summary=False)
    trainer.fit(task, datamodule)
    assert math.isfinite(float(trainer.callback_metrics["val/miou"]))
    trainer.test(task, datamodule, verbose=False)
    metrics = trainer.callback_metrics
    for key in ("test/miou", "test/acc", "test/miou_corrupt", "test/miou_jpeg_compression", "test/iou_background"):
        assert math.isfinite(float(metrics[key])), key


@pytest.mark.parametrize("preset", ["smoke", "demo", "study", "paper"])
def test_presets_pass_the_runner_schema_and_build(preset):
    datamodule, task = build("attention=qknorm_hs", preset=preset)
    if preset == "paper":  # Seg-T/16: 12 layers of width 192 and 3 heads, 512 crops in 16-pixel patches
        assert len(task.net.encoder.layers) == 12 and task.net.pos_embed.shape == (1, 192, 32, 32)
        with pytest.raises(DataError, match="does not exist"):
            datamodule.setup()
