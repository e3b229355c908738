"""Segmentation domain: metrics with ignore pixels, the ADE20K layout and its label shift, bad input,
sliding-window inference, corruptions, every attention variant, and a smoke run."""
import math
from pathlib import Path

import numpy as np
import pytest
import pytorch_lightning as pl
import torch
from omegaconf import OmegaConf
from PIL import Image

from common.attention import VARIANTS
from common.data import DataError
from domains.segmentation import build
from domains.segmentation.data import SegmentationDataModule

ROOT = Path(__file__).resolve().parents[1]


def compose(*overrides: str, preset: str = "smoke", cache_dir: Path | str = "/nonexistent"):
    """base.yaml <- segmentation.yaml <- preset <- overrides, as the runner composes them."""
    domain = OmegaConf.load(ROOT / "configs/domain/segmentation.yaml")
    presets = domain.pop("presets")
    cfg = OmegaConf.merge(OmegaConf.load(ROOT / "configs/base.yaml"), domain, presets[preset],
                          OmegaConf.from_dotlist(list(overrides)))
    cfg.domain, cfg.cache_dir = "segmentation", str(cache_dir)
    return cfg


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("segmentation-cache")


def test_miou_and_pixel_accuracy_against_hand_computed_example_with_ignore():
    _, task = build(compose())
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
    datamodule = SegmentationDataModule(compose("data.dataset=ade20k", f"data.root={tmp_path}").data, tmp_path, 0)
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
    cfg = compose(*args).data
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
        SegmentationDataModule(compose("data.dataset=ade20k", f"data.root={tmp_path}/none").data, tmp_path, 0).setup()


@pytest.mark.parametrize("decoder", ["mask", "linear"])
def test_sliding_window_equals_plain_inference_at_crop_size(decoder):
    _, task = build(compose(f"model.decoder={decoder}", "model.window_stride=16"))
    net = task.net.eval()
    images = torch.rand(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.allclose(net.sliding_window(images), net(images), atol=1e-6)
        # Larger (and patch-misaligned) images: interpolated positions, overlapping windows, full coverage.
        large = torch.rand(2, 3, 50, 41)
        assert net.sliding_window(large).shape == (2, 11, 50, 41)
        assert net(large).shape == (2, 11, 50, 41)


def test_corruptions_are_deterministic_per_seed():
    images = torch.rand(2, 3, 32, 32)
    runs = {}
    for seed in (0, 0, 1):
        _, task = build(compose(f"seed={seed}", "data.robustness.severities=[5]"))
        runs.setdefault(seed, []).append(list(task.corrupted(images, batch_idx=3)))
    names = [name for name, _ in task.conditions]
    assert names == list(compose().data.robustness.corruptions)  # one severity each
    for i, name in enumerate(names):
        assert torch.equal(runs[0][0][i], runs[0][1][i]), name
        assert runs[0][0][i].shape == images.shape and not torch.equal(runs[0][0][i], images), name
        if name.endswith("noise"):
            assert not torch.equal(runs[0][0][i], runs[1][0][i]), name
    other_batch = list(task.corrupted(images, batch_idx=4))
    assert not torch.equal(other_batch[names.index("gaussian_noise")], runs[1][0][names.index("gaussian_noise")])


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_attention_variant_trains_in_encoder_and_decoder(variant):
    _, task = build(compose(f"attention.variant={variant}"))
    logits = task.net(torch.rand(2, 3, 32, 32))
    torch.nn.functional.cross_entropy(logits, torch.randint(0, 11, (2, 32, 32))).backward()
    attention_layers = [m for m in task.net.modules() if type(m).__name__ == "MultiheadAttention"]
    assert len(attention_layers) == 2 and all(m.variant.name == variant for m in attention_layers)
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in task.net.encoder.parameters())


def test_digit_scenes_are_cached_and_seeded(cache_dir):
    first = SegmentationDataModule(compose().data, cache_dir, seed=0)
    first.setup()
    images, masks = first.datasets["train"].images, first.datasets["train"].masks
    assert images.shape == (8, 3, 48, 48) and images.dtype == torch.uint8
    assert set(masks.unique().tolist()) <= set(range(11)) and (masks > 0).any()
    assert len(list((cache_dir / "segmentation").glob("digits-seed0-*.pt"))) == 1
    other = SegmentationDataModule(compose().data, cache_dir, seed=1)
    other.setup()
    assert not torch.equal(other.datasets["train"].images, images)


def test_smoke_run_logs_clean_and_corrupted_miou(cache_dir):
    datamodule, task = build(compose(cache_dir=cache_dir))
    trainer = pl.Trainer(**OmegaConf.to_container(compose().trainer), logger=False, enable_checkpointing=False,
                         enable_model_summary=False)
    trainer.fit(task, datamodule)
    assert math.isfinite(float(trainer.callback_metrics["val/miou"]))
    trainer.test(task, datamodule, verbose=False)
    metrics = trainer.callback_metrics
    for key in ("test/miou", "test/acc", "test/miou_corrupt", "test/miou_jpeg_compression", "test/iou_background"):
        assert math.isfinite(float(metrics[key])), key


def test_quest_train_smoke(tmp_path, cache_dir):
    train = pytest.importorskip("runners.train").train
    record = train(["domain=segmentation", "preset=smoke", "attention=quest", f"output_dir={tmp_path}",
                    f"cache_dir={cache_dir}"])
    assert record["status"] == "ok"
    assert math.isfinite(record["metrics"]["test/miou"]) and math.isfinite(record["metrics"]["test/miou_corrupt"])


@pytest.mark.parametrize("preset", ["smoke", "demo", "study", "paper"])
def test_presets_pass_the_runner_schema_and_build(preset):
    config = pytest.importorskip("runners.config")
    from common.registry import discover

    discover("domains")
    cfg = config.compose(["domain=segmentation", f"preset={preset}", "attention=qknorm_hs"])
    datamodule, task = build(cfg)
    if preset == "paper":  # Seg-T/16: 12 layers of width 192 and 3 heads, 512 crops in 16-pixel patches
        assert len(task.net.encoder.layers) == 12 and task.net.pos_embed.shape == (1, 192, 32, 32)
        with pytest.raises(DataError, match="does not exist"):
            datamodule.setup()
