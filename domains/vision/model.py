"""ViT/DeiT classifier: patch embedding, cls token, learned positions, the shared encoder, a linear head
on the cls token. It takes images in [0, 1] and normalises them itself, so adversarial attacks and
corruptions act in pixel space. The task adds DeiT's batch-level mixup/cutmix (timm's ``Mixup``) to
training and, as an option, DeiT-III's binary cross-entropy.

Initialisation (``init``) matters more for QUEST than for standard attention: QUEST's logit is
‖q‖·cos(q, k̂) with no 1/√d, so each query's initial sharpness *is* its initial norm, set by the q/k/v
projection's scale. On LayerNorm-ed tokens a head's query has norm ≈ σ·√(dim·head_dim): DeiT's σ = 0.02
gives ≈ 2.2 in DeiT-Tiny (dim 192, head_dim 64), nearly uniform attention at the start, where PyTorch's
Xavier init of the fused [3·dim, dim] projection (σ = √(1/(2·dim))) gives √(head_dim/2) ≈ 5.7 at any
width, logits up to 2.5 times as sharp."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from timm.data import Mixup
from timm.data.mixup import mixup_target
from timm.layers import trunc_normal_
from torch import Tensor, nn

from common.blocks import AttentionFactory, Encoder, trunc_normal_init
from common.task import ClassificationTask, Optim

from .config import INITS, LOSSES


class ViT(nn.Module):
    """``init``: one of ``INITS``; ``trunc_normal`` is DeiT's (``common.blocks.trunc_normal_init``: Linear and
    q/k/v weights N(0, 0.02²), biases 0; the patch embedding keeps PyTorch's Conv2d init, as in timm).
    Position embedding and cls token start at N(0, 0.02²) either way (DeiT; timm's ``trunc_normal_``).
    ``norm_eps``: every LayerNorm's epsilon (DeiT: 1e-6)."""

    def __init__(self, num_classes: int, *, image_size: int, channels: int, mean: list[float], std: list[float],
                 patch_size: int, dim: int, depth: int, heads: int, mlp_ratio: float, dropout: float,
                 attn_dropout: float, drop_path: float, layer_scale: float | None, init: str, norm_eps: float,
                 attn_layer: AttentionFactory):
        super().__init__()
        if init not in INITS:
            raise ValueError(f"unknown model.init {init!r}; choose from {', '.join(INITS)}")
        if image_size % patch_size:
            raise ValueError(f"image_size {image_size} is not a multiple of patch_size {patch_size}")
        if not len(mean) == len(std) == channels:
            raise ValueError(f"data.mean and data.std need one value per channel ({channels})")
        self.register_buffer("mean", torch.tensor(mean).view(1, -1, 1, 1))
        self.register_buffer("std", torch.tensor(std).view(1, -1, 1, 1))
        num_tokens = (image_size // patch_size) ** 2 + 1
        self.patch_embed = nn.Conv2d(channels, dim, patch_size, stride=patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, num_tokens, dim))
        self.pos_drop = nn.Dropout(dropout)
        self.encoder = Encoder(dim, depth, heads, mlp_ratio=mlp_ratio, dropout=dropout, attn_dropout=attn_dropout,
                               drop_path=drop_path, layer_scale=layer_scale, norm_eps=norm_eps, seq_len=num_tokens,
                               attn_layer=attn_layer)
        self.head = nn.Linear(dim, num_classes)
        if init == "trunc_normal":
            trunc_normal_init(self)
        trunc_normal_(self.pos_embed, std=0.02)
        trunc_normal_(self.cls_token, std=0.02)

    def no_weight_decay(self) -> set[str]:
        """Parameters DeiT trains without weight decay besides the 1-D ones (``Task.decayed``)."""
        return {"pos_embed", "cls_token"}

    def forward(self, images: Tensor) -> Tensor:  # [B, C, H, W] in [0, 1] -> logits [B, classes]
        x = self.patch_embed((images - self.mean) / self.std).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        x = self.encoder(self.pos_drop(x + self.pos_embed))
        return self.head(x[:, 0])


def binary_targets(target: Tensor, num_classes: int) -> Tensor:
    """DeiT-III's targets for binary cross-entropy (its engine.py: ``targets.gt(0.0)``): every class with a
    share of a mixed image is a positive, whatever its share; hard labels become one-hot."""
    if target.is_floating_point():
        return target.gt(0).to(target.dtype)
    return F.one_hot(target, num_classes).float()


class VisionTask(ClassificationTask):
    """ClassificationTask with optional mixup/cutmix on training batches (train accuracy is then
    measured against each image's dominant label). ``loss``: ``ce`` (softmax cross-entropy, DeiT) or
    ``bce`` (DeiT-III: a sigmoid per class against ``binary_targets``, averaged over images and classes).
    Evaluation losses are cross-entropy either way, as DeiT-III evaluates.

    Mixing is timm's ``Mixup`` in batch mode, as DeiT sets it up: every training batch is mixed with its
    reverse, by mixup (λ ~ Beta(``mixup``)) or, with probability ``mix_switch_prob`` when both are on,
    cutmix (Beta(``cutmix``), λ then the area actually kept), into soft targets with the label smoothing
    folded in. timm draws from numpy's global generator, which the runner's ``seed_everything`` seeds."""

    def __init__(self, net: nn.Module, num_classes: int, optim: Optim, *, loss: str, label_smoothing: float,
                 mixup: float, cutmix: float, mix_switch_prob: float, seed: int = 0):
        if loss not in LOSSES:
            raise ValueError(f"unknown task.loss {loss!r}; choose from {', '.join(LOSSES)}")
        if loss == "bce" and label_smoothing > 0:  # smoothing gives every class a share: all would be positives
            raise ValueError("task.loss=bce takes no label smoothing (DeiT-III: task.label_smoothing=0)")
        super().__init__(net, num_classes, optim, label_smoothing=label_smoothing, seed=seed)
        self.binary = loss == "bce"
        self.mixup = None
        if mixup > 0 or cutmix > 0:
            self.mixup = Mixup(mixup_alpha=mixup, cutmix_alpha=cutmix, prob=1.0, switch_prob=mix_switch_prob,
                               mode="batch", label_smoothing=label_smoothing, num_classes=num_classes)

    def unpack(self, batch):
        images, labels = batch
        if not self.training or self.mixup is None:
            return images, labels
        # timm's Mixup pairs image i with image B-1-i and takes only even batches. An odd batch (the epoch's
        # last, partial one: the training loader has no drop_last, unlike DeiT's; or an odd per-device batch)
        # mixes its first B-1 images, the last keeping its own (smoothed) label. Mixup works in place: a copy.
        even = len(images) - len(images) % 2
        mixed, target = self.mixup(images[:even].clone(), labels[:even])
        if even < len(images):
            mixed = torch.cat([mixed, images[even:]])
            target = torch.cat([target, mixup_target(labels[even:], self.num_classes, smoothing=self.label_smoothing)])
        return mixed, target

    def loss(self, logits: Tensor, target: Tensor, stage: str) -> Tensor:
        if self.binary and stage == "train":
            return F.binary_cross_entropy_with_logits(logits, binary_targets(target, self.num_classes))
        if target.is_floating_point():  # soft targets of a mixed batch, smoothing already folded in
            return F.cross_entropy(logits, target)
        return super().loss(logits, target, stage)

    def predictions(self, logits: Tensor, target: Tensor):
        return logits.detach(), target.argmax(-1) if target.is_floating_point() else target
