"""Vision domain: MNIST and ImageFolder data, their splits (shipped split folders, random, grouped; never
following the training seed), input gradients for attacks, mixup/cutmix targets (timm's Mixup); the DeiT /
DeiT-III recipe: truncated-normal init and LayerNorm eps, timm's RandAugment and random erasing, 3-Augment,
repeated augmentation (also under two-process DDP), binary cross-entropy, timm's LAMB, and the paper presets.
Training every variant is the shared contract test's job (tests/test_domains.py)."""
import json
import math
import os
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from PIL import Image
from timm.data import Mixup
from timm.data.auto_augment import RandAugment
from timm.data.random_erasing import RandomErasing
from timm.optim import Lamb
from torch import nn
from torchvision.transforms import v2

from common.attention import MultiheadAttention
from common.blocks import Encoder
from common.data import SPLITS, DataError
from common.errors import ConfigError
from common.task import build_optimizer
from domains.vision import build
from domains.vision.data import (
    ImageFiles,
    RepeatedAugmentationSampler,
    VisionDataModule,
    eval_transform,
    three_augment,
    train_transform,
)
from domains.vision.model import binary_targets
from runners.cli import main as cli
from runners.config import compose


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


RGB = ["data.channels=3", "data.mean=[0.5,0.5,0.5]", "data.std=[0.25,0.25,0.25]"]


def config(cache_dir, *overrides):
    return compose(["domain=vision", "preset=smoke", f"cache_dir={cache_dir}", *overrides])


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


def test_a_file_as_data_root_is_named_in_one_line(tmp_path, capsys):
    file = tmp_path / "y.txt"
    file.write_text("not a folder")
    assert cli(["train", "domain=vision", "preset=smoke", "data.dataset=imagefolder", f"data.root={file}",
                f"output_dir={tmp_path}/runs", f"cache_dir={tmp_path}/cache", "trainer.enable_progress_bar=false"]) == 2
    err = capsys.readouterr().err
    assert f"data.root {file} is a file; dataset 'imagefolder' needs a folder" in err and err.count("\n") == 1, err
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("mixup, cutmix", [(0.8, 0.0), (0.0, 1.0)])
def test_mixup_soft_targets_odd_batches_and_seeding(cache_dir, mixup, cutmix):
    """timm's Mixup on training batches: each image mixed with its mirror in the batch, by the share its soft
    target (label smoothing folded in) gives it; the loader's batch left as it is; an odd batch mixes all but
    its last image; the same seed (numpy's, which seed_everything sets) mixes the same way."""
    _, task = build(config(cache_dir, f"task.mixup={mixup}", f"task.cutmix={cutmix}", "task.label_smoothing=0.1"))
    task.train()
    images, labels = torch.rand(7, 1, 28, 28), torch.tensor([0, 1, 2, 0, 1, 2, 3])
    original = images.clone()
    pl.seed_everything(0, verbose=False)
    mixed, targets = task.unpack((images, labels))
    assert torch.equal(images, original)  # mixed on a copy
    assert mixed.shape == images.shape and mixed.min() >= 0 and mixed.max() <= 1
    assert torch.allclose(targets.sum(-1), torch.ones(7)) and targets.min() > 0
    lam = (targets[0, 0].item() - 0.01) / 0.9  # image 0 (label 0) is mixed with image 5 (label 2)
    assert 0 < lam < 1 and targets[0, 2].item() == pytest.approx(0.01 + 0.9 * (1 - lam), abs=1e-6)
    even, mirror = images[:6], images[:6].flip(0)
    if mixup:
        assert torch.allclose(mixed[:6], lam * even + (1 - lam) * mirror, atol=1e-6)
    else:  # a box cut from the mirror image, its area the share 1 - λ
        kept = mixed[:6] == even
        assert torch.equal(kept | (mixed[:6] == mirror), torch.ones_like(kept))
        assert kept[0].float().mean().item() == pytest.approx(lam, abs=1e-6)
    assert torch.equal(mixed[6], images[6])  # the odd one out keeps its image and its smoothed label
    assert torch.allclose(targets[6], 0.9 * F.one_hot(labels[6], 10).float() + 0.01)
    pl.seed_everything(0, verbose=False)
    again = task.unpack((images, labels))
    assert torch.equal(again[0], mixed) and torch.equal(again[1], targets)
    task.eval()
    assert task.unpack((images, labels))[0] is images


# ------------------------------------------------------------------------------------ the DeiT / DeiT-III recipe

def test_trunc_normal_init_and_layernorm_eps(cache_dir):
    torch.manual_seed(0)
    _, task = build(config(cache_dir, "model.dim=64", "model.heads=4"))
    net = task.net
    linear = [m.weight for m in net.modules() if isinstance(m, nn.Linear) and m.weight.numel() >= 4096]
    fused = [m.in_proj_weight for m in net.modules() if isinstance(m, MultiheadAttention)]
    assert linear and fused
    for weight in linear + fused:
        assert abs(weight.std().item() - 0.02) < 0.002 and abs(weight.mean().item()) < 0.002
    assert all(m.bias.abs().max() == 0 for m in net.modules() if isinstance(m, nn.Linear))
    norms = [m for m in net.modules() if isinstance(m, nn.LayerNorm)]
    assert len(norms) == 2 * 2 + 1 and all(m.eps == 1e-6 for m in norms)
    assert all((m.weight == 1).all() and (m.bias == 0).all() for m in norms)
    # The init sets QUEST's initial sharpness: a head's query norm on LayerNorm-ed tokens is 0.02·√(dim·head_dim).
    tokens = F.layer_norm(torch.randn(4096, 64), (64,))
    queries = (tokens @ fused[0][:64].T).view(-1, 4, 16)
    assert abs(queries.norm(dim=-1).mean().item() / (0.02 * math.sqrt(64 * 16)) - 1) < 0.05

    _, torch_task = build(config(cache_dir, "model.dim=64", "model.heads=4", "model.init=torch", "model.norm_eps=1e-5"))
    fused = next(m for m in torch_task.net.modules() if isinstance(m, MultiheadAttention)).in_proj_weight
    assert abs(fused.std().item() - math.sqrt(1 / 128)) < 0.01  # Xavier on [3·64, 64]
    assert all(m.eps == 1e-5 for m in torch_task.net.modules() if isinstance(m, nn.LayerNorm))
    with pytest.raises(ValueError, match="model.init"):
        build(config(cache_dir, "model.init=xavier"))


def test_encoder_default_is_unchanged_for_other_domains():
    encoder = Encoder(16, 2, 2)
    assert all(m.eps == 1e-5 for m in encoder.modules() if isinstance(m, nn.LayerNorm))


def rgb_data(cache_dir, *overrides):
    return config(cache_dir, "data.image_size=32", *RGB, *overrides).data


RANDAUGMENT = "data.augment.randaugment={num_ops: 2, magnitude: 9, mstd: 0.5, inc: 1}"


def test_randaugment_and_three_augment_in_the_training_transform(cache_dir):
    plain = train_transform(rgb_data(cache_dir))
    assert not any(isinstance(t, RandAugment) for t in plain.transforms)
    assert any(isinstance(t, RandomErasing) for t in plain.transforms)  # the default erase 0.25
    data = rgb_data(cache_dir, RANDAUGMENT, "data.augment.erase=0.0")
    augment = next(t for t in train_transform(data).transforms if isinstance(t, RandAugment))
    assert augment.num_layers == 2 and {(op.magnitude, op.magnitude_std) for op in augment.ops} == {(9, 0.5)}
    deit3 = train_transform(rgb_data(cache_dir, "data.augment.crop=src", "data.augment.three_augment=true",
                                     "data.augment.color_jitter=0.3", "data.augment.erase=0.0"))
    kinds = [type(t) for t in deit3.transforms]
    assert v2.RandomCrop in kinds and v2.RandomResizedCrop not in kinds and RandomErasing not in kinds
    assert v2.RandomChoice in kinds and v2.ColorJitter in kinds
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (40, 48, 3), dtype=np.uint8))
    pl.seed_everything(0, verbose=False)  # timm's augmentations draw from Python's and numpy's generators
    for transform in (train_transform(data), deit3):
        out = transform(image)
        assert out.shape == (3, 32, 32) and out.min() >= 0 and out.max() <= 1
    gray = config(cache_dir, "data.image_size=32", RANDAUGMENT, "data.augment.erase=0.0").data  # 'L' images
    for _ in range(20):
        out = train_transform(gray)(image.convert("L"))
        assert out.shape == (1, 32, 32) and out.min() >= 0 and out.max() <= 1
    for bad in ("{num_ops: 2}", "{num_ops: 2, magnitude: 9}", "{num_ops: 2, magnitude: 12, mstd: 0.5, inc: 1}",
                "{num_ops: 2, magnitude: 9.5, mstd: 0.5, inc: 1}", "{num_ops: 2, magnitude: 9, mstd: 0.5, inc: 2}"):
        with pytest.raises(ConfigError, match="randaugment"):
            build(config(cache_dir, f"data.augment.randaugment={bad}"))
    with pytest.raises(ConfigError, match="crop"):
        build(config(cache_dir, "data.augment.crop=center"))


def test_three_augment_applies_exactly_one_of_its_three():
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (32, 32, 3), dtype=np.uint8))
    pixels = np.asarray(image).astype(int)
    choice = three_augment(3)
    seen = Counter()
    torch.manual_seed(0)
    for _ in range(60):
        out = np.asarray(choice(image)).astype(int)
        gray = (out == out[..., :1]).all()
        solarized = (out == np.where(pixels >= 128, 255 - pixels, pixels)).all()
        seen[(gray, solarized)] += 1
    assert set(seen) == {(True, False), (False, True), (False, False)}  # grayscale, solarise, blur
    assert all(count > 8 for count in seen.values())


def test_repeated_augmentation_sampler_counts_and_rank_split():
    dataset = list(range(12))
    ranks = [RepeatedAugmentationSampler(dataset, 3, num_replicas=2, rank=r, seed=5) for r in (0, 1)]
    first = [list(s) for s in ranks]
    assert [len(s) for s in ranks] == [len(x) for x in first] == [6, 6]  # the epoch keeps len(dataset) samples
    counts = Counter(first[0] + first[1])
    assert len(counts) == 4 and set(counts.values()) == {3}  # 4 images chosen, each 3 times over the two ranks
    assert all(set(x) == set(counts) for x in first)  # every chosen image's copies go to both ranks
    for sampler in ranks:
        sampler.set_epoch(1)
    second = [list(s) for s in ranks]
    assert second != first and set(Counter(second[0] + second[1]).values()) == {3}
    assert [list(s) for s in ranks] == second  # an epoch's order is a function of (seed, epoch)
    # 10 images over 2 ranks: 5 each, so the epoch's end cuts the fourth image's copies to one
    odd = Counter(i for r in range(2) for i in RepeatedAugmentationSampler(list(range(10)), 3, num_replicas=2, rank=r))
    assert sorted(odd.values()) == [1, 3, 3, 3]


def test_datamodule_uses_the_sampler_with_the_trainers_ranks(cache_dir):
    dm, _ = build(config(cache_dir, "data.augment.repeats=3"))
    loader = dm.train_dataloader()
    assert isinstance(loader.sampler, RepeatedAugmentationSampler) and len(loader) == 4000 // 16
    assert not loader.pin_memory
    dm.trainer = SimpleNamespace(world_size=2, global_rank=1, strategy=SimpleNamespace(root_device=torch.device("cuda")))
    loader = dm.train_dataloader()
    sampler = loader.sampler
    assert (sampler.num_replicas, sampler.rank, len(sampler)) == (2, 1, 2000)
    assert loader.pin_memory and dm.val_dataloader().pin_memory  # a GPU trainer gets pinned batches
    plain, _ = build(config(cache_dir))
    assert not isinstance(plain.train_dataloader().sampler, RepeatedAugmentationSampler)


DDP_SCRIPT = """
import json, sys
import pytorch_lightning as pl
from domains.vision import build
from runners.config import compose

class Dump(pl.Callback):
    def on_train_epoch_end(self, trainer, module):
        sampler = trainer.train_dataloader.sampler
        with open(f"{sys.argv[1]}/rank{trainer.global_rank}_epoch{trainer.current_epoch}.json", "w") as f:
            json.dump({"sampler": type(sampler).__name__, "indices": list(sampler)}, f)

cfg = compose(["domain=vision", "preset=smoke", f"cache_dir={sys.argv[1]}", "data.augment.repeats=3",
              "data.split=[0.006,0.002,0.992]", "data.batch_size=4"])
datamodule, task = build(cfg)
pl.Trainer(strategy="ddp", devices=2, accelerator="cpu", max_epochs=2, limit_train_batches=1, limit_val_batches=0,
           logger=False, enable_checkpointing=False, enable_progress_bar=False,
           enable_model_summary=False, callbacks=[Dump()]).fit(task, datamodule=datamodule)
"""


@pytest.mark.slow
def test_repeated_augmentation_survives_lightning_ddp(tmp_path):
    """Lightning replaces a plain sampler by its DistributedSampler under DDP; ours must stay, split by rank,
    with its epoch set by Lightning."""
    script = tmp_path / "ddp_sampler.py"
    script.write_text(textwrap.dedent(DDP_SCRIPT))
    out = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, timeout=600,
                         env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).parents[1])})
    assert out.returncode == 0, out.stderr[-3000:]
    dumps = {(r, e): json.loads((tmp_path / f"rank{r}_epoch{e}.json").read_text()) for r in (0, 1) for e in (0, 1)}
    assert {d["sampler"] for d in dumps.values()} == {"RepeatedAugmentationSampler"}
    for epoch in (0, 1):
        counts = Counter(dumps[0, epoch]["indices"] + dumps[1, epoch]["indices"])
        assert sum(counts.values()) == 30 and sorted(counts.values()) == [3] * 10  # 30 training digits
    assert dumps[0, 0]["indices"] != dumps[0, 1]["indices"]


def test_bce_loss_on_binarised_mixed_targets(cache_dir):
    _, task = build(config(cache_dir, "task.loss=bce"))
    logits, labels = torch.randn(4, 10), torch.tensor([1, 2, 3, 4])
    soft = 0.7 * F.one_hot(labels, 10).float() + 0.3 * F.one_hot(labels.flip(0), 10).float()
    expected = F.binary_cross_entropy_with_logits(logits, (soft > 0).float())
    assert torch.allclose(task.loss(logits, soft, "train"), expected)
    assert binary_targets(soft, 10).sum(-1).tolist() == [2, 2, 2, 2]  # both classes of a mixed image are positives
    hard = F.binary_cross_entropy_with_logits(logits, F.one_hot(labels, 10).float())
    assert torch.allclose(task.loss(logits, labels, "train"), hard)
    assert torch.allclose(task.loss(logits, labels, "val"), F.cross_entropy(logits, labels))  # evaluation: CE
    with pytest.raises(ValueError, match="label smoothing"):
        build(config(cache_dir, "task.loss=bce", "task.label_smoothing=0.1"))
    with pytest.raises(ValueError, match="task.loss"):
        build(config(cache_dir, "task.loss=focal"))


def test_lamb_is_timms_without_its_clip_and_steps_by_hand(cache_dir):
    """optim.name=lamb builds timm's Lamb, its own gradient clip off (the trainer's gradient_clip_val clips);
    one step on a toy of two decayed tensors and one without decay, against LAMB's formula by hand."""
    lr, decay, eps = 0.1, 0.1, 1e-8
    w, z, b = nn.Parameter(torch.tensor([3.0, 4.0])), nn.Parameter(torch.zeros(2)), nn.Parameter(torch.tensor([0.5]))
    w.grad, z.grad, b.grad = torch.tensor([0.5, -1.0]), torch.tensor([1.0, 1.0]), torch.tensor([2.0])
    optim = config(cache_dir, "optim.name=lamb", f"optim.lr={lr}", f"optim.weight_decay={decay}").optim
    optimizer, _ = build_optimizer([("w", w), ("z", z), ("b", b)], {"w", "z"}, optim, total=10)
    assert type(optimizer) is Lamb
    assert [(g["max_grad_norm"], g["eps"], g["always_adapt"], g["trust_clip"], g["bias_correction"], g["lr"])
            for g in optimizer.param_groups] == [(None, eps, False, False, True, lr)] * 2
    assert [g["weight_decay"] for g in optimizer.param_groups] == [decay, 0.0]
    optimizer.step()
    # step 1: bias-corrected moments are g and g², so Adam's step is g / (|g| + eps)
    adam = [0.5 / (0.5 + eps), -1.0 / (1.0 + eps)]
    update = [adam[0] + decay * 3.0, adam[1] + decay * 4.0]
    trust = 5.0 / math.hypot(*update)  # ‖w‖ / ‖update‖
    assert torch.allclose(w.detach(), torch.tensor([3.0 - lr * trust * update[0], 4.0 - lr * trust * update[1]]))
    assert torch.allclose(z.detach(), torch.full((2,), -lr / (1 + eps)))  # ‖w‖ = 0: trust ratio 1
    assert torch.allclose(b.detach(), torch.tensor([0.5 - lr * 2.0 / (2.0 + eps)]))  # no decay: plain Adam


def test_position_embedding_and_cls_token_take_no_weight_decay(cache_dir):
    _, task = build(config(cache_dir))
    decayed = task.decayed()
    assert "net.pos_embed" not in decayed and "net.cls_token" not in decayed  # DeiT's exemptions
    assert "net.patch_embed.weight" in decayed and "net.head.weight" in decayed
    assert not any(name.endswith("bias") for name in decayed)
    optimizer = task.configure_optimizers.__func__(SimpleNamespace(  # the groups configure_optimizers builds
        optim=task.optim, decayed=task.decayed, named_parameters=task.named_parameters,
        trainer=SimpleNamespace(estimated_stepping_batches=10)))["optimizer"]
    decay_group = {id(p) for p in optimizer.param_groups[0]["params"]}
    assert id(task.net.pos_embed) not in decay_group and id(task.net.head.weight) in decay_group


SHRINK = ["model.depth=1", "data.dataset=mnist", "data.image_size=32", "data.channels=1", "data.mean=[0.5]",
          "data.std=[0.25]", "data.batch_size=8", "data.num_workers=0", "trainer.accelerator=cpu"]


@pytest.mark.parametrize("preset, dim, heads, epochs", [
    ("paper", 192, 3, 300), ("paper_s", 384, 6, 300), ("paper_b", 768, 12, 100), ("paper_l", 1024, 16, 100),
    ("paper_b_deit3", 768, 12, 800)])
def test_paper_presets_compose_and_build(cache_dir, preset, dim, heads, epochs):
    cfg = compose(["domain=vision", f"preset={preset}", "data.root=/imagenet"])
    assert (cfg.model.dim, cfg.model.heads, cfg.model.patch_size, cfg.trainer.max_epochs) == (dim, heads, 16, epochs)
    assert (cfg.model.init, cfg.model.norm_eps, cfg.data.image_size) == ("trunc_normal", 1e-6, 224)
    assert cfg.data.augment.repeats == 3
    assert cfg.optim.cooldown_steps == 0  # DeiT's code never runs its cool-down epochs
    if preset == "paper_b_deit3":
        assert (cfg.optim.name, cfg.optim.lr, cfg.optim.weight_decay, cfg.data.batch_size) == ("lamb", 3e-3, 0.02, 2048)
        assert (cfg.task.loss, cfg.task.label_smoothing, cfg.task.mixup, cfg.task.cutmix) == ("bce", 0.0, 0.8, 1.0)
        assert cfg.data.augment.three_augment and cfg.data.augment.randaugment is None and cfg.data.augment.erase == 0
        assert (cfg.model.layer_scale, cfg.trainer.gradient_clip_val, cfg.optim.warmup_steps) == (1e-4, 1.0, 5 * 626)
    else:
        assert (cfg.optim.name, cfg.optim.lr, cfg.optim.weight_decay) == ("adamw", 1e-3, 0.05)
        assert cfg.data.batch_size == 1024
        assert dict(cfg.data.augment.randaugment) == {"num_ops": 2, "magnitude": 9, "mstd": 0.5, "inc": 1}
        assert (cfg.task.loss, cfg.task.label_smoothing, cfg.optim.warmup_steps) == ("ce", 0.1, 5 * 1252)
    datamodule, task = build(compose(["domain=vision", f"preset={preset}", f"cache_dir={cache_dir}",
                                                   *SHRINK]))
    assert len(task.net.encoder.layers) == 1 and task.net.head.in_features == dim
    task.train()
    inputs, target = task.unpack(next(iter(datamodule.train_dataloader())))
    assert torch.isfinite(task.loss(task(inputs), target, "train"))


def test_paper_preset_takes_timms_randaugment_erasing_and_mixup_with_deits_settings(cache_dir):
    """DeiT's rand-m9-mstd0.5-inc1 with the settings timm's transforms_imagenet_train gives it, random
    erasing 0.25 in 'pixel' mode, and Mixup in batch mode: mixup 0.8, cutmix 1.0, switch 0.5, smoothing 0.1."""
    data = compose(["domain=vision", "preset=paper", "data.root=/imagenet", f"cache_dir={cache_dir}"]).data
    steps = train_transform(data).transforms
    augment = next(t for t in steps if isinstance(t, RandAugment))
    assert augment.num_layers == 2 and len(augment.ops) == 15
    assert {(op.magnitude, op.magnitude_std, op.prob) for op in augment.ops} == {(9, 0.5, 0.5)}
    names = {op.name for op in augment.ops}  # inc1: the operations whose severity rises with the magnitude
    assert {"PosterizeIncreasing", "SolarizeIncreasing", "ColorIncreasing"} <= names and "Solarize" not in names
    assert {(op.hparams["translate_const"], op.hparams["img_mean"], op.kwargs["resample"]) for op in augment.ops} == {
        (100, (124, 116, 104), Image.Resampling.BICUBIC)}  # int(224 x 0.45), the ImageNet mean in 0-255
    erasing = next(t for t in steps if isinstance(t, RandomErasing))
    assert (erasing.probability, erasing.mode, erasing.per_pixel) == (0.25, "pixel", True)
    assert [type(t) for t in steps[-4:]] == [v2.ToDtype, v2.Normalize, RandomErasing, v2.Normalize]
    _, task = build(compose(["domain=vision", "preset=paper", f"cache_dir={cache_dir}", *SHRINK]))
    mix = task.mixup
    assert type(mix) is Mixup
    assert (mix.mixup_alpha, mix.cutmix_alpha, mix.switch_prob, mix.label_smoothing, mix.mode, mix.mix_prob,
            mix.num_classes, mix.cutmix_minmax, mix.correct_lam) == (0.8, 1.0, 0.5, 0.1, "batch", 1.0, 10, None, True)
    _, plain = build(config(cache_dir))
    assert plain.mixup is None  # off unless task.mixup or task.cutmix is set


@pytest.mark.parametrize("workers", [0, 1])
def test_an_unreadable_image_is_one_line_with_or_without_loader_workers(tmp_path, capsys, workers):
    write_tree(tmp_path / "tree")
    broken = tmp_path / "tree" / "cat" / "0.jpg"
    broken.write_bytes(broken.read_bytes()[:200])  # truncated: only a worker, reading it lazily, finds out
    assert cli(["train", "domain=vision", "preset=smoke", "data.dataset=imagefolder", f"data.root={tmp_path / 'tree'}",
                "data.image_size=16", "model.patch_size=4", "data.batch_size=4", *RGB, f"data.num_workers={workers}",
                "trainer.limit_train_batches=1.0", f"output_dir={tmp_path}/runs", f"cache_dir={tmp_path}/cache",
                "trainer.enable_progress_bar=false"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"quest: error: {broken}: unreadable image") and err.count("\n") == 1, err


def test_a_decompression_bomb_is_refused_in_one_line(tmp_path, capsys):
    write_tree(tmp_path / "tree")
    bomb = tmp_path / "tree" / "cat" / "0.png"
    (tmp_path / "tree" / "cat" / "0.jpg").unlink()
    Image.new("1", (20_000, 10_000)).save(bomb)  # 200 million pixels in a few KiB
    assert bomb.stat().st_size < 100_000
    assert cli(["train", "domain=vision", "preset=smoke", "data.dataset=imagefolder", f"data.root={tmp_path / 'tree'}",
                "data.image_size=16", "model.patch_size=4", "data.batch_size=4", *RGB, "trainer.limit_train_batches=1.0",
                f"output_dir={tmp_path}/runs", f"cache_dir={tmp_path}/cache", "trainer.enable_progress_bar=false"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"quest: error: {bomb}: more than 89,478,485 pixels") and err.count("\n") == 1, err
    # what the run had built is gone (the lock stays: the kernel's, and harmless)
    assert not [p for p in (tmp_path / "runs").rglob("*") if p.is_file() and p.suffix != ".lock"]


ELPV_LEVELS = (0.0, 1 / 3, 2 / 3, 1.0)  # the defect probabilities ELPV annotates


def write_elpv(root, per_level=5, size=24):
    """ELPV's layout: grayscale PNGs in images/, and labels.csv with one whitespace-aligned line per image
    (path, defect probability as Python prints it, module type)."""
    rng = np.random.default_rng(0)
    (root / "images").mkdir(parents=True)
    lines = []
    for i in range(per_level * len(ELPV_LEVELS)):
        name = f"images/cell{i + 1:04d}.png"
        Image.fromarray(rng.integers(0, 256, (size, size), dtype=np.uint8)).save(root / name)
        lines.append(f"{name}  {ELPV_LEVELS[i % 4]!r:<20}{('mono', 'poly')[i % 2]}")
    (root / "labels.csv").write_text("\n".join(lines) + "\n")


def elpv(root, cache_dir, *overrides):
    return build(config(cache_dir, "data.dataset=elpv", f"data.root={root}", "data.image_size=16", "model.patch_size=4",
                        "data.batch_size=4", "data.split=[0.6,0.2,0.2]", *overrides))


def test_elpv_reads_its_labels_file_and_images(tmp_path, cache_dir):
    write_elpv(tmp_path)
    dm, task = elpv(tmp_path, cache_dir)
    assert dm.classes == ["defect 0", "defect 0.333", "defect 0.667", "defect 1"]
    found = members(dm)
    assert {s: len(names) for s, names in found.items()} == {"train": 12, "val": 4, "test": 4}
    assert sorted(sum(found.values(), [])) == sorted(p.as_posix() for p in (tmp_path / "images").glob("*.png"))
    labels = {path.name: label for s in SPLITS for path, label in dm.datasets[s].files}
    assert [labels[f"cell{i + 1:04d}.png"] for i in range(8)] == [0, 1, 2, 3, 0, 1, 2, 3]
    assert dm.split_info["source"] == "random" and dm.split_info["rule"].startswith("ELPV's 20 solar cells")
    assert elpv(tmp_path, cache_dir, "seed=1")[0].split_info == dm.split_info  # the training seed changes nothing
    assert members(elpv(tmp_path, cache_dir, "data.split_seed=1")[0]) != found
    dm.setup("fit")
    images, labels = next(iter(dm.test_dataloader()))
    assert images.shape == (4, 1, 16, 16) and images.min() >= 0 and images.max() <= 1
    assert task(images).shape == (4, 4)


def test_elpv_errors_name_the_file_or_the_extra(tmp_path, cache_dir, monkeypatch):
    monkeypatch.setitem(sys.modules, "elpv_dataset", None)  # not installed: its default root names the extra
    with pytest.raises(ConfigError, match=r"elpv_dataset .*quest-study\[vision\]"):
        build(config(cache_dir, "data.dataset=elpv"))
    with pytest.raises(DataError, match="labels.csv does not exist"):
        elpv(tmp_path, cache_dir)
    write_elpv(tmp_path)
    labels = tmp_path / "labels.csv"
    labels.write_text(labels.read_text().replace("1.0 ", "high", 1))
    with pytest.raises(DataError, match="distinct image and its defect probability"):
        elpv(tmp_path, cache_dir)


def test_elpv_default_is_the_packages_2624_cells(cache_dir):
    pytest.importorskip("elpv_dataset")
    dm, _ = build(config(cache_dir, "data.dataset=elpv"))
    assert {s: len(d) for s, d in dm.datasets.items()} == {"train": 2099, "val": 262, "test": 263}
    assert dm.num_classes == 4 and all(path.is_file() for path, _ in dm.datasets["test"].files)
