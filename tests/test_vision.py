"""Vision domain: MNIST and ImageFolder data, their splits (shipped split folders, random, grouped; never
following the training seed), input gradients for attacks, mixup/cutmix targets. Training every variant
is the shared contract test's job (tests/test_domains.py)."""
import numpy as np
import pytest
import torch
from PIL import Image

from common.data import SPLITS, DataError
from domains.vision import build
from domains.vision.data import ImageFiles, VisionDataModule, eval_transform
from domains.vision.model import mix_batch
from runners.config import build_config, compose


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


RGB = ["data.channels=3", "data.mean=[0.5,0.5,0.5]", "data.std=[0.25,0.25,0.25]"]


def config(cache_dir, *overrides):
    return build_config(compose(["domain=vision", "preset=smoke", f"cache_dir={cache_dir}", *overrides]))


def test_mnist_split_and_pixel_range(cache_dir):
    cfg = config(cache_dir)
    dm, task = build(cfg)
    dm.setup("fit")
    sizes = {k: len(v) for k, v in dm.datasets.items()}
    assert sizes == {"train": 4000, "val": 500, "test": 500}
    assert not set(dm.datasets["train"].indices) & set(dm.datasets["test"].indices)
    images, labels = next(iter(dm.train_dataloader()))
    assert images.shape == (16, 1, 28, 28) and images.min() >= 0 and images.max() <= 1
    assert labels.max() < 10 and task(images).shape == (16, 10)
    images.requires_grad_()
    task(images).sum().backward()  # attacks need gradients with respect to the pixels
    assert torch.isfinite(images.grad).all() and images.grad.abs().sum() > 0


def test_mnist_split_is_the_same_for_every_training_seed(cache_dir):
    (first, _), (second, _) = build(config(cache_dir, "seed=0")), build(config(cache_dir, "seed=1"))
    assert first.split_info == second.split_info and first.split_info["source"] == "random"
    assert all(first.datasets[s].indices == second.datasets[s].indices for s in SPLITS)
    other = VisionDataModule(config(cache_dir, "data.split_seed=1").data, cache_dir)
    assert other.datasets["test"].indices != first.datasets["test"].indices  # the split seed draws it
    assert other.split_info["hash"]["test"] != first.split_info["hash"]["test"]


def write_tree(root, classes=("cat", "dog", "owl"), per_class=4, size=(40, 30)):
    rng = np.random.default_rng(0)
    for name in classes:
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            pixels = rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / name / f"{i}.{'png' if i % 2 else 'jpg'}")


def members(dm) -> dict[str, list[str]]:
    return {split: sorted(path.as_posix() for path, _ in dm.datasets[split].files) for split in SPLITS}


def imagefolder(root, cache_dir, *overrides, seed=0):
    cfg = config(cache_dir, "data.dataset=imagefolder", f"data.root={root}", "data.image_size=16",
                 "model.patch_size=4", "data.batch_size=4", f"seed={seed}", *RGB, *overrides)
    return build(cfg)


@pytest.mark.parametrize("layout", ["imagenet", "single"])
def test_imagefolder(tmp_path, cache_dir, layout):
    root = tmp_path / "images"
    if layout == "imagenet":
        write_tree(root / "train")
        write_tree(root / "val", per_class=2)
    else:
        write_tree(root, per_class=10)
    dm, task = imagefolder(root, cache_dir)
    assert dm.num_classes == 3
    dm.setup("fit")
    for loader in (dm.train_dataloader(), dm.test_dataloader()):
        images, labels = next(iter(loader))
        assert images.shape[1:] == (3, 16, 16) and torch.isfinite(images).all()
        assert task(images).shape == (len(labels), 3)
    # Evaluation images stay in pixel range; training ones may not where random erasing drew its noise.
    assert images.min() >= 0 and images.max() <= 1
    if layout == "imagenet":
        assert len(dm.datasets["train"]) == 12 and len(dm.datasets["test"]) == 6


@pytest.mark.parametrize("shipped, sizes", [
    (("train", "val", "test"), {"train": 12, "val": 6, "test": 9}),
    (("train", "val"), {"train": 12, "val": 6, "test": 6}),    # ImageNet: val is also the test set
    (("train", "test"), {"train": 11, "val": 1, "test": 9}),   # val: data.split's 0.1 / 0.9 of 12, rounded
])
def test_imagefolder_split_folders_are_used_as_shipped(tmp_path, cache_dir, shipped, sizes):
    per_class = {"train": 4, "val": 2, "test": 3}
    for split in shipped:
        write_tree(tmp_path / split, per_class=per_class[split])
    dm, _ = imagefolder(tmp_path, cache_dir)
    found = members(dm)
    assert {split: len(names) for split, names in found.items()} == sizes
    assert dm.split_info["source"] == "shipped"
    for split in shipped:  # every shipped file stays in its own split
        assert all(f"/{split}/" in name for name in found[split])
    assert not set(found["train"]) & set(found["val"])
    assert members(imagefolder(tmp_path, cache_dir, seed=1)[0]) == found  # the training seed changes nothing
    assert imagefolder(tmp_path, cache_dir, seed=1)[0].split_info == dm.split_info


def test_imagefolder_single_tree_random_and_grouped(tmp_path, cache_dir):
    # Frames of 8 videos per class: "<class>/v<video>_frame<n>.png".
    rng = np.random.default_rng(0)
    for name in ("cat", "dog"):
        (tmp_path / name).mkdir()
        for video in range(8):
            for frame in range(3):
                pixels = rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(tmp_path / name / f"v{video}_frame{frame}.png")
    split = ["data.split=[0.5,0.25,0.25]"]
    random, _ = imagefolder(tmp_path, cache_dir, *split)
    assert random.split_info["source"] == "random"
    assert members(imagefolder(tmp_path, cache_dir, *split, seed=1)[0]) == members(random)
    assert members(imagefolder(tmp_path, cache_dir, *split, "data.split_seed=1")[0]) != members(random)

    grouped_args = (*split, "data.group_pattern='(?P<group>[a-z]+/v\\d+)_frame'")
    grouped, _ = imagefolder(tmp_path, cache_dir, *grouped_args)
    assert grouped.split_info["source"] == "grouped"
    videos = {s: {name.rsplit("_frame", 1)[0] for name in names} for s, names in members(grouped).items()}
    assert sum(len(v) for v in videos.values()) == 16  # each video in one split only
    assert {s: len(v) for s, v in videos.items()} == {"train": 8, "val": 4, "test": 4}
    assert members(imagefolder(tmp_path, cache_dir, *grouped_args, seed=1)[0]) == members(grouped)


def test_imagefolder_errors(tmp_path, cache_dir):
    with pytest.raises(DataError, match="does not exist"):
        build(config(cache_dir, "data.dataset=imagefolder", f"data.root={tmp_path}/nothing"))
    (tmp_path / "tree" / "cat").mkdir(parents=True)
    broken = tmp_path / "tree" / "cat" / "broken.png"
    broken.write_bytes(b"not an image")
    with pytest.raises(DataError, match="broken.png"):
        ImageFiles([(broken, 0)], 3, eval_transform(config(cache_dir).data))[0]
    (tmp_path / "tree" / "dog").mkdir()
    with pytest.raises(DataError, match="dog"):  # a class folder without images
        build(config(cache_dir, "data.dataset=imagefolder", f"data.root={tmp_path}/tree"))


def test_mix_batch_soft_targets():
    torch.manual_seed(0)
    images, labels = torch.rand(6, 3, 8, 8), torch.tensor([0, 1, 2, 0, 1, 2])
    for mixup, cutmix in ((0.8, 0.0), (0.0, 1.0)):
        mixed, targets = mix_batch(images, labels, 3, mixup=mixup, cutmix=cutmix, switch_prob=0.5, label_smoothing=0.1)
        assert mixed.shape == images.shape and mixed.min() >= 0 and mixed.max() <= 1
        assert torch.allclose(targets.sum(-1), torch.ones(6)) and targets.min() > 0
