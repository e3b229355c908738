"""Segmentation domain: metrics with ignore pixels, the ADE20K layout and its label shift, the folder
loader's split layouts (shipped split folders, CamVid, random, grouped; none following the training seed),
class names, the label check before training, native-resolution evaluation, bad input, sliding-window
inference, corruption conditions and their summaries, the digit-scene cache, the presets, and the encoder
started from a finished vision run (``model.init_from``)."""
import logging
import math
from pathlib import Path

import numpy as np
import pytest
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from PIL import Image

from common.data import SPLITS, DataError
from common.errors import ConfigError
from common.perturbations import CORRUPTIONS, corrupt
from common.registry import get_domain
from common.task import perturbation_generator
from domains.segmentation.data import SegmentationDataModule
from runners.cli import main as cli
from runners.config import compose, run_directory
from runners.runs.training import train


def config(*overrides: str, preset: str = "smoke", cache_dir: Path | str = "/nonexistent"):
    """The config of a segmentation run, composed as the runner composes it."""
    return compose(["domain=segmentation", f"preset={preset}", f"cache_dir={cache_dir}", *overrides])


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
    datamodule = SegmentationDataModule(config("data.dataset=ade20k", f"data.root={tmp_path}").data, tmp_path)
    assert datamodule.num_classes == 150 and datamodule.ignore_index == 255
    assert datamodule.class_names[:2] == ["000", "001"] and datamodule.class_names[-1] == "149"
    datamodule.setup()
    assert datamodule.split_info["source"] == "shipped"  # training/ and validation/, validation also the test set
    assert datamodule.split_info["hash"]["val"] == datamodule.split_info["hash"]["test"]
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
    datamodule = SegmentationDataModule(cfg, tmp_path)
    datamodule.setup()
    assert torch.equal(datamodule.datasets["test"][0][1].as_subclass(torch.Tensor), torch.from_numpy(labels))

    write_pair(tmp_path / "images", tmp_path / "masks", "outside", np.array([[0, 7], [1, 2]]), suffix=".png")
    write_pair(tmp_path / "images", tmp_path / "masks", "resized", labels, image_size=(3, 2), suffix=".png")
    with pytest.raises(DataError, match=r"outside\.png: label 7 is neither a class \(0\.\.4\) nor the ignore index 255 "
                                        r"\(1 of 3 masks checked\)"):
        SegmentationDataModule(cfg, tmp_path).setup()  # the check before training
    datamodule = SegmentationDataModule(config(*args, "data.label_check=0").data, tmp_path)
    datamodule.setup()
    files = {pair[0].stem: i for i, pair in enumerate(datamodule.datasets["test"].pairs)}
    with pytest.raises(DataError, match=r"outside\.png: label 7 outside 0\.\.4"):  # and while reading
        datamodule.datasets["test"][files["outside"]]
    with pytest.raises(DataError, match=r"resized\.png: mask size"):
        datamodule.datasets["test"][files["resized"]]

    (tmp_path / "images" / "orphan.jpg").write_bytes((tmp_path / "images" / "good.png").read_bytes())
    with pytest.raises(DataError, match=r"orphan\.jpg: missing mask"):
        SegmentationDataModule(cfg, tmp_path).setup()
    with pytest.raises(DataError, match="does not exist"):
        SegmentationDataModule(config("data.dataset=ade20k", f"data.root={tmp_path}/none").data, tmp_path).setup()
    with pytest.raises(DataError, match="needs data.num_classes or data.class_names"):
        SegmentationDataModule(config("data.dataset=folder", f"data.root={tmp_path}").data, tmp_path)


def folder_datamodule(root, *overrides, seed=0):
    """The folder dataset's datamodule as a run of training seed ``seed`` builds it, set up."""
    datamodule, _ = build("data.dataset=folder", f"data.root={root}", "data.num_classes=3", f"seed={seed}",
                          *overrides, cache_dir=root / "cache")
    datamodule.setup()
    return datamodule


def split_members(datamodule) -> dict[str, list[str]]:
    return {split: sorted(image.name for image, _ in datamodule.datasets[split].pairs) for split in SPLITS}


def write_scenes(image_dir, mask_dir, stems):
    for stem in stems:
        write_pair(image_dir, mask_dir, stem, np.full((6, 8), sum(map(ord, stem)) % 3), suffix=".png")


@pytest.mark.parametrize("layout", ["split folders", "camvid"])
def test_folder_split_folders_are_used_as_shipped(tmp_path, layout):
    stems = {"train": ["a0", "a1", "a2", "a3"], "val": ["b0", "b1"], "test": ["c0", "c1", "c2"]}
    for split, names in stems.items():
        if layout == "camvid":  # <root>/{train,trainannot,val,valannot,test,testannot}/
            write_scenes(tmp_path / split, tmp_path / f"{split}annot", names)
        else:
            write_scenes(tmp_path / split / "images", tmp_path / split / "masks", names)
    datamodule = folder_datamodule(tmp_path)
    assert split_members(datamodule) == {split: [f"{n}.png" for n in names] for split, names in stems.items()}
    assert datamodule.split_info["source"] == "shipped"
    assert folder_datamodule(tmp_path, seed=1).split_info == datamodule.split_info  # not the training seed's


def test_folder_without_val_folder_carves_val_out_of_train(tmp_path):
    write_scenes(tmp_path / "train" / "images", tmp_path / "train" / "masks", [f"a{i}" for i in range(9)])
    write_scenes(tmp_path / "test" / "images", tmp_path / "test" / "masks", ["c0", "c1"])
    datamodule = folder_datamodule(tmp_path, "data.split=[0.6,0.3,0.1]")  # val: a third of train/
    found = split_members(datamodule)
    assert found["test"] == ["c0.png", "c1.png"] and len(found["val"]) == 3 and len(found["train"]) == 6
    assert split_members(folder_datamodule(tmp_path, "data.split=[0.6,0.3,0.1]", seed=1)) == found


def test_folder_pair_random_and_grouped_splits(tmp_path):
    # Frames of ten driving sequences, "<sequence>_<frame>.png" as in CamVid.
    write_scenes(tmp_path / "images", tmp_path / "masks", [f"seq{s}_{f:03d}" for s in range(10) for f in range(4)])
    random = folder_datamodule(tmp_path)
    assert random.split_info["source"] == "random" and {s: len(m) for s, m in split_members(random).items()} == \
        {"train": 32, "val": 4, "test": 4}
    assert split_members(folder_datamodule(tmp_path, seed=1)) == split_members(random)
    assert folder_datamodule(tmp_path, seed=1).split_info == random.split_info

    pattern = "data.group_pattern='(?P<group>seq\\d+)_\\d+\\.png$'"
    grouped = folder_datamodule(tmp_path, pattern)
    assert grouped.split_info["source"] == "grouped"
    sequences = {split: {name.split("_")[0] for name in names} for split, names in split_members(grouped).items()}
    assert {s: len(v) for s, v in sequences.items()} == {"train": 8, "val": 1, "test": 1}
    assert sum(map(len, sequences.values())) == len(set().union(*sequences.values()))  # none in two splits
    assert split_members(folder_datamodule(tmp_path, pattern, seed=1)) == split_members(grouped)
    with pytest.raises(DataError, match=r"images/seq0_000\.png does not match data\.group_pattern"):
        folder_datamodule(tmp_path, "data.group_pattern='(?P<group>video\\d+)'")


def test_class_names_file_names_the_per_class_scores(tmp_path):
    write_scenes(tmp_path / "images", tmp_path / "masks", [f"s{i}" for i in range(10)])
    (tmp_path / "classes.txt").write_text("road\nsky\ncar\n")
    datamodule, task = build("data.dataset=folder", f"data.root={tmp_path}", "data.class_names=classes.txt")
    assert datamodule.class_names == task.class_names == ["road", "sky", "car"] and datamodule.num_classes == 3
    with pytest.raises(DataError, match="3 class names for 4 classes"):
        build("data.dataset=folder", f"data.root={tmp_path}", "data.class_names=classes.txt", "data.num_classes=4")
    numbered, _ = build("data.dataset=folder", f"data.root={tmp_path}", "data.num_classes=12")
    assert numbered.class_names[:3] == ["00", "01", "02"] and numbered.class_names[-1] == "11"
    keys = [f"iou_{name}" for name in numbered.class_names]
    assert sorted(keys) == keys  # the per-class metric keys sort in label order


def test_wrong_ignore_index_stops_quest_train_before_training(tmp_path, run_args, capsys):
    # CamVid-style masks: 11 classes and the void label 11, but the ignore index left at 255.
    labels = np.array([[0, 3, 11], [10, 11, 2]])
    for i in range(6):
        write_pair(tmp_path / "data" / "images", tmp_path / "data" / "masks", f"f{i}", labels, suffix=".png")
    args = ["train", "domain=segmentation", "preset=smoke", "data.dataset=folder", f"data.root={tmp_path / 'data'}",
            "data.num_classes=11", "data.split=[0.5,0.25,0.25]", *run_args]
    assert cli(args) == 2
    error = capsys.readouterr().err.strip()
    assert "label 11 is neither a class (0..10) nor the ignore index 255" in error and "\n" not in error
    assert not list((tmp_path / "runs").rglob("record.json"))
    assert cli([*args, "data.ignore_index=11"]) == 0


def test_evaluation_follows_the_training_resize_unless_set_and_null_is_native(tmp_path):
    for stem in ("a", "b", "c", "d"):
        write_pair(tmp_path / "images", tmp_path / "masks", stem, np.zeros((30, 40)), suffix=".png")
    args = ("data.dataset=folder", f"data.root={tmp_path}", "data.num_classes=2", "data.split=[0.5,0.25,0.25]")
    for overrides, shape in [((), (30, 40)), (("data.resize=15",), (15, 20)), (("data.eval_resize=15",), (15, 20)),
                             (("data.resize=15", "data.eval_resize=null"), (30, 40)),
                             (("data.resize=15", "data.eval_resize=24"), (24, 32))]:
        cfg = config(*args, *overrides)
        assert cfg.data.eval_resize == (shape[0] if shape != (30, 40) else None)  # as the record's config says
        datamodule = SegmentationDataModule(cfg.data, tmp_path)
        datamodule.setup()
        image, mask = datamodule.datasets["test"][0]
        assert image.shape == (3, *shape) and mask.shape == shape, overrides


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


def test_digit_scenes_are_cached_and_drawn_from_the_split_seed(cache_dir):
    first = SegmentationDataModule(config().data, cache_dir)
    first.setup()
    images, masks = first.datasets["train"].images, first.datasets["train"].masks
    assert images.shape == (8, 3, 48, 48) and images.dtype == torch.uint8
    assert set(masks.unique().tolist()) <= set(range(11)) and (masks > 0).any()
    assert len(list((cache_dir / "segmentation").glob("digits-seed0-*.pt"))) == 1
    assert (cache_dir / "mnist5k.pt").exists()  # the handwriting comes from common.data.load_mnist
    again, _ = build("seed=1", cache_dir=cache_dir)
    again.setup()  # another training seed: the same scenes
    assert again.split_info == first.split_info and first.split_info["source"] == "random"
    assert all(torch.equal(again.datasets[s].images, first.datasets[s].images) for s in SPLITS)
    other = SegmentationDataModule(config("data.split_seed=1").data, cache_dir)
    other.setup()
    assert not torch.equal(other.datasets["train"].images, images)
    assert other.split_info["hash"]["test"] != first.split_info["hash"]["test"]


def darkest_stroke_per_digit(images, masks) -> list[float]:
    """Per digit region (scene and label) of generated scenes: its darkest pixel's brightest channel."""
    return [float(image[:, mask == label].amax(0).min()) / 255
            for image, mask in zip(images, masks) for label in mask.unique().tolist() if label > 0]


@pytest.mark.parametrize("ink", ["colour", "dark"])
def test_scene_ink_colours_every_digit_or_draws_it_dark(tmp_path, ink):
    datamodule = SegmentationDataModule(config(f"data.scenes.ink={ink}").data, tmp_path)
    datamodule.setup()
    darkest = darkest_stroke_per_digit(datamodule.datasets["train"].images, datamodule.datasets["train"].masks)
    assert len(darkest) >= 16  # several digits per scene: each digit is inked on its own
    dark = sum(value <= 0.2 for value in darkest) / len(darkest)  # fully inked pixels dark in every channel
    assert dark == 1.0 if ink == "dark" else dark < 0.25


def test_unknown_scene_ink_is_a_config_error():
    with pytest.raises(ConfigError, match="unknown data.scenes.ink='pink'; choose from colour, dark"):
        build("data.scenes.ink=pink")


def test_test_epoch_logs_clean_corrupted_and_per_class_scores(cache_dir):
    datamodule, task = build(cache_dir=cache_dir)
    trainer = pl.Trainer(**dict(compose(["domain=segmentation", "preset=smoke"]).trainer), logger=False,
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


def test_paper_preset_follows_segmenters_recipe_and_scores_every_corruption_at_five_severities():
    cfg = compose(["domain=segmentation", "preset=paper"])
    assert cfg.optim.name == "sgd" and cfg.optim.lr == 1e-3 and cfg.optim.momentum == 0.9
    assert cfg.optim.schedule == "poly" and cfg.optim.poly_power == 0.9 and cfg.trainer.max_steps == 160_000
    assert cfg.data.batch_size == 8 and cfg.data.crop_size == 512 and cfg.model.window_stride == 512
    _, task = build(preset="paper")
    assert set(task.perturbations) == {f"{name}_{severity}" for name in CORRUPTIONS for severity in range(1, 6)}
    summary = task.summarize_perturbed({condition: torch.tensor(0.25) for condition in task.perturbations})
    assert summary["miou_corrupt"] == 0.25 and {f"miou_{name}" for name in CORRUPTIONS} < set(summary)


# ---------------------------------------------------------------- encoder started from a vision run

VISION_VARIANT = "qknorm_hs"  # has learnable attention gains, which must come along


@pytest.fixture(scope="module")
def vision_run(tmp_path_factory) -> Path:
    """The directory of a tiny vision run trained through the runner on a folder of RGB images (two
    classes), shaped like the segmentation smoke model: 16 wide, one layer of two heads, 8-pixel
    patches over 32-pixel images (a 4 x 4 grid, as the smoke crop), the segmenter's normalisation."""
    root = tmp_path_factory.mktemp("vision-run")
    rng = np.random.default_rng(0)
    for label in ("circle", "square"):
        folder = root / "images" / label
        folder.mkdir(parents=True)
        for i in range(10):
            Image.fromarray(rng.integers(0, 256, (40, 40, 3), dtype=np.uint8)).save(folder / f"{i}.png")
    args = ["domain=vision", "preset=smoke", f"attention={VISION_VARIANT}", f"output_dir={root / 'runs'}",
            f"cache_dir={root / 'cache'}", "data.dataset=imagefolder", f"data.root={root / 'images'}",
            "data.channels=3", "data.image_size=32", "data.mean=[0.5,0.5,0.5]", "data.std=[0.25,0.25,0.25]",
            "model.patch_size=8", "model.depth=1", "model.mlp_ratio=4.0"]
    assert train(args).status == "ok"
    return run_directory(compose(args))


def test_init_from_a_vision_run_loads_its_encoder_and_leaves_out_cls_token_and_head(vision_run, caplog):
    state = torch.load(vision_run / "checkpoints" / "best.ckpt", weights_only=True)["state_dict"]
    with caplog.at_level(logging.INFO, logger="common.checkpoint"):
        _, task = build(f"model.init_from={vision_run}", f"attention={VISION_VARIANT}")
    net = task.net
    encoder = {f"encoder.{name}": tensor for name, tensor in net.encoder.state_dict().items()}
    assert any(name.endswith("attn.qk.gain") for name in encoder)
    for name, tensor in {**encoder, "patch_embed.weight": net.patch_embed.weight,
                         "patch_embed.bias": net.patch_embed.bias}.items():
        assert torch.equal(tensor, state[f"net.{name}"]), name
    positions = state["net.pos_embed"][:, 1:].transpose(1, 2).unflatten(2, (4, 4))  # the cls token's row dropped
    assert torch.equal(net.pos_embed, positions)
    line = caplog.records[-1].getMessage()
    assert "model.init_from: Segmenter starts from" in line and "best.ckpt" in line
    assert f"{len(encoder) + 3} tensors loaded (patch_embed 2, pos_embed 1, encoder {len(encoder)})" in line
    assert "left out: cls_token, head.bias, head.weight" in line

    # Another crop: the positions resized as the model resizes them for a larger image.
    _, larger = build(f"model.init_from={vision_run / 'checkpoints' / 'last.ckpt'}", f"attention={VISION_VARIANT}",
                      "data.crop_size=64")
    expected = F.interpolate(torch.load(vision_run / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
                             ["net.pos_embed"][:, 1:].transpose(1, 2).unflatten(2, (4, 4)), size=(8, 8),
                             mode="bicubic", align_corners=False)
    assert torch.allclose(larger.net.pos_embed, expected)


@pytest.mark.parametrize(("override", "message"), [
    ("attention=quest", f"trained attention variant '{VISION_VARIANT}', this run uses 'quest'"),
    ("model.heads=4", "the vision run has model.heads=2, this run model.heads=4"),
    ("model.dim=32", "the vision run has model.dim=16, this run model.dim=32"),
    ("model.pixel_std=[0.5,0.5,0.5]", r"data.std=\[0.25, 0.25, 0.25\], this run model.pixel_std=\[0.5, 0.5, 0.5\]"),
])
def test_init_from_an_incompatible_vision_run_is_a_config_error(vision_run, override, message):
    with pytest.raises(ConfigError, match=message):
        build(f"model.init_from={vision_run}", f"attention={VISION_VARIANT}", override)


def test_init_from_a_path_without_a_run_is_a_config_error(vision_run, tmp_path):
    variant = f"attention={VISION_VARIANT}"
    with pytest.raises(ConfigError, match=r"model.init_from: .*/none is neither a run directory nor a checkpoint"):
        build(f"model.init_from={tmp_path / 'none'}", variant)
    with pytest.raises(ConfigError, match="has no checkpoints/best.ckpt or last.ckpt"):
        build(f"model.init_from={tmp_path}", variant)
    (tmp_path / "broken.ckpt").write_bytes(b"not a checkpoint")
    (tmp_path / "config.yaml").write_text((vision_run / "config.yaml").read_text())
    with pytest.raises(ConfigError, match=r"broken\.ckpt is not a readable Lightning checkpoint"):
        build(f"model.init_from={tmp_path / 'broken.ckpt'}", variant)


def test_quest_train_refuses_a_mismatched_vision_run_in_one_line_before_the_run_starts(vision_run, run_args, capsys):
    args = ["train", "domain=segmentation", "preset=smoke", "attention=standard", f"model.init_from={vision_run}",
            *run_args]
    assert cli(args) == 2
    error = capsys.readouterr().err.strip()
    assert "trained attention variant" in error and "\n" not in error
    output_dir = Path(run_args[0].removeprefix("output_dir="))
    assert not list(output_dir.rglob("config.yaml"))  # nothing was left behind


def test_majority_class_baseline_iou():
    """Masks with 7 background pixels, 2 of class 1, 2 of class 2 and one ignored: labelling every pixel
    background scores IoU 7/11 on background and 0 on the two other classes present (class 3, 4 absent)."""
    from common.metrics import MajorityClassIoU

    metric = MajorityClassIoU(5, ignore_index=255)
    masks = torch.tensor([[[0, 0, 0, 1], [0, 0, 0, 1], [2, 255, 2, 0]]])
    metric.update(torch.zeros_like(masks), masks)
    assert metric.compute().item() == pytest.approx((7 / 11) / 3)


# ---------------------------------------------------------------- augmentation on the training device

def device_augment(jitter=None, **data):
    """The device augmentation of a ``data`` section: no rescale, flip or jitter unless given, 4-pixel crops."""
    from domains.segmentation.augment import DeviceAugment
    from domains.segmentation.config import Data

    settings = {"scale_range": [1.0, 1.0], "resize": None, "crop_size": 4, "flip": False, "ignore_index": 255,
                "jitter": {"brightness": 0.0, "contrast": 0.0, "saturation": 0.0, "hue": 0.0, **(jitter or {})}}
    return DeviceAugment(Data.model_validate({**settings, **data}))


def test_device_augment_at_scale_one_crops_exactly_and_flips_whole_samples():
    images, masks = torch.rand(6, 3, 4, 4), torch.randint(0, 5, (6, 4, 4))
    sizes = torch.tensor([[4, 4]] * 6)
    out, labels = device_augment()(images, masks, sizes)
    torch.testing.assert_close(out, images)  # pixel centres hit: nothing is interpolated
    assert torch.equal(labels, masks)
    torch.manual_seed(0)
    out, labels = device_augment(flip=True)(images, masks, sizes)
    mirrored = [bool(torch.equal(labels[i], masks[i].flip(-1))) for i in range(6)]
    for i, flip in enumerate(mirrored):
        torch.testing.assert_close(out[i], images[i].flip(-1) if flip else images[i])
        assert flip or torch.equal(labels[i], masks[i])
    assert any(mirrored) and not all(mirrored)


def test_device_augment_rescales_labels_by_nearest_and_fills_beyond_the_image_with_ignore():
    masks = torch.arange(4).view(1, 2, 2)
    _, labels = device_augment(scale_range=[2.0, 2.0])(torch.rand(1, 3, 2, 2), masks, torch.tensor([[2, 2]]))
    assert labels[0].tolist() == [[0, 0, 1, 1], [0, 0, 1, 1], [2, 2, 3, 3], [2, 2, 3, 3]]
    # a 2x3 sample padded into a 4x4 batch: its 6 labels survive, the crop's other 10 pixels are ignored
    masks = torch.full((1, 4, 4), 255)
    masks[0, :2, :3] = torch.tensor([[0, 1, 2], [3, 4, 0]])
    out, labels = device_augment()(torch.rand(1, 3, 4, 4), masks, torch.tensor([[2, 3]]))
    kept = labels[labels != 255]
    assert sorted(kept.tolist()) == [0, 0, 1, 2, 3, 4] and out.shape == (1, 3, 4, 4)


def test_device_jitter_draws_a_factor_per_sample_within_its_range():
    images = torch.full((64, 3, 4, 4), 0.5)
    out, _ = device_augment(jitter={"brightness": 0.3})(images, torch.zeros(64, 4, 4, dtype=torch.long),
                                                        torch.tensor([[4, 4]] * 64))
    factors = out[:, 0, 0, 0] / 0.5  # a grey image: brightness scales it, one factor per sample
    assert factors.min() >= 0.7 - 1e-6 and factors.max() <= 1.3 + 1e-6 and factors.std() > 0.1
    assert torch.equal(out, out[:, :1, :1, :1].expand_as(out))
    with pytest.raises(ConfigError, match="data.jitter.hue=0"):
        device_augment(jitter={"hue": 0.1})


def test_augment_on_device_hands_the_loader_stored_images_and_trains(cache_dir, tmp_path):
    datamodule, _ = build("data.augment_on=device", "data.scale_range=[0.5,1.5]", cache_dir=cache_dir)
    datamodule.setup("fit")
    images, masks, sizes = next(iter(datamodule.train_dataloader()))
    stored = datamodule.data.scenes.image_size
    assert images.shape[-2:] == (stored, stored) and sizes.tolist() == [[stored, stored]] * len(images)
    cropped, labels = datamodule.augment_batch((images, masks, sizes))
    crop = datamodule.data.crop_size
    assert cropped.shape == (len(images), 3, crop, crop) and labels.shape == (len(images), crop, crop)
    record = train(["domain=segmentation", "preset=smoke", "data.augment_on=device", "attention=quest",
                    f"cache_dir={cache_dir}", f"output_dir={tmp_path}"])
    assert record.status == "ok"
    with pytest.raises(ConfigError, match="unknown data.augment_on='gpu'; choose from cpu, device"):
        build("data.augment_on=gpu")
