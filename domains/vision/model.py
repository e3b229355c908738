"""ViT/DeiT classifier: patch embedding, cls token, learned positions, the shared encoder, a linear head
on the cls token. It takes images in [0, 1] and normalises them itself, so adversarial attacks and
corruptions act in pixel space. The task adds DeiT's batch-level mixup/cutmix to training."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from common.blocks import Encoder
from common.task import ClassificationTask


class ViT(nn.Module):
    def __init__(self, num_classes: int, *, image_size: int, channels: int, mean: list[float], std: list[float],
                 patch_size: int, dim: int, depth: int, heads: int, mlp_ratio: float, dropout: float,
                 attn_dropout: float, drop_path: float, layer_scale: float | None, attention: dict):
        super().__init__()
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
                               drop_path=drop_path, layer_scale=layer_scale, seq_len=num_tokens, **attention)
        self.head = nn.Linear(dim, num_classes)
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        nn.init.trunc_normal_(self.cls_token, std=0.02)

    def forward(self, images: Tensor) -> Tensor:  # [B, C, H, W] in [0, 1] -> logits [B, classes]
        x = self.patch_embed((images - self.mean) / self.std).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        x = self.encoder(self.pos_drop(x + self.pos_embed))
        return self.head(x[:, 0])


def mix_batch(images: Tensor, labels: Tensor, num_classes: int, *, mixup: float, cutmix: float,
              switch_prob: float, label_smoothing: float) -> tuple[Tensor, Tensor]:
    """timm's Mixup in batch mode: each batch is mixed with its reverse, by mixup (Beta(mixup)) or, with
    probability ``switch_prob`` when both are on, cutmix (a box of area 1 - λ, λ then taken from the
    box actually cut). Returns the images and soft targets (label smoothing folded in)."""
    use_cutmix = cutmix > 0 and (mixup <= 0 or torch.rand(()).item() < switch_prob)
    alpha = cutmix if use_cutmix else mixup
    lam = torch.distributions.Beta(alpha, alpha).sample().item()
    if use_cutmix:
        height, width = images.shape[-2:]
        cut_h, cut_w = int(height * (1 - lam) ** 0.5), int(width * (1 - lam) ** 0.5)
        cy, cx = torch.randint(height, ()).item(), torch.randint(width, ()).item()
        top, bottom = max(cy - cut_h // 2, 0), min(cy + cut_h // 2, height)
        left, right = max(cx - cut_w // 2, 0), min(cx + cut_w // 2, width)
        images = images.clone()
        images[..., top:bottom, left:right] = images.flip(0)[..., top:bottom, left:right]
        lam = 1 - (bottom - top) * (right - left) / (height * width)
    else:
        images = lam * images + (1 - lam) * images.flip(0)
    off = label_smoothing / num_classes
    onehot = F.one_hot(labels, num_classes).to(images.dtype) * (1 - label_smoothing) + off
    return images, lam * onehot + (1 - lam) * onehot.flip(0)


class VisionTask(ClassificationTask):
    """ClassificationTask with optional mixup/cutmix on training batches (train accuracy is then
    measured against each image's dominant label)."""

    def __init__(self, net: nn.Module, num_classes: int, optim: dict, *, label_smoothing: float, mixup: float,
                 cutmix: float, mix_switch_prob: float, seed: int = 0):
        super().__init__(net, num_classes, optim, label_smoothing=label_smoothing, seed=seed)
        self.mix = {"mixup": mixup, "cutmix": cutmix, "switch_prob": mix_switch_prob}

    def unpack(self, batch):
        images, labels = batch
        if not self.training or (self.mix["mixup"] <= 0 and self.mix["cutmix"] <= 0):
            return images, labels
        return mix_batch(images, labels, self.num_classes, label_smoothing=self.label_smoothing, **self.mix)

    def loss(self, logits: Tensor, target: Tensor, stage: str) -> Tensor:
        if target.is_floating_point():  # soft targets of a mixed batch, smoothing already folded in
            return F.cross_entropy(logits, target)
        return super().loss(logits, target, stage)

    def predictions(self, logits: Tensor, target: Tensor):
        return logits.detach(), target.argmax(-1) if target.is_floating_point() else target
