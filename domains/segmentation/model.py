"""Segmenter (Strudel et al. 2021): a ViT encoder over a grid of patch tokens and either the mask
transformer decoder (learnable class embeddings processed jointly with the patch tokens; each class
mask is the product of normalised patch and class embeddings) or the linear baseline decoder.

Every attention layer, encoder and decoder, is a ``common.blocks.Encoder`` layer, so the variant under
study runs everywhere. Other image sizes interpolate the positional embeddings; test images are
predicted with a sliding window of the training crop. ``init_encoder_from_vision`` starts the encoder
from a finished vision run (``model.init_from``), as Segmenter starts from an ImageNet-trained ViT.
"""
from __future__ import annotations

import math
from itertools import product

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics.classification import MulticlassAccuracy, MulticlassJaccardIndex

from common.blocks import AttentionFactory, Encoder
from common.checkpoint import load_encoder, load_run
from common.errors import ConfigError
from common.metrics import MajorityClassIoU
from common.perturbations import check_corruption, corrupt
from common.task import Optim, Task

from .config import Net

ENCODER = ("patch_embed", "pos_embed", "encoder")  # what a vision run's ViT and the Segmenter share
SHARED_SHAPE = ("patch_size", "dim", "depth", "heads", "mlp_ratio")  # model keys the two must agree on


class LinearDecoder(nn.Module):
    """Per-patch class logits from one linear map."""

    def __init__(self, num_classes: int, enc_dim: int):
        super().__init__()
        self.head = nn.Linear(enc_dim, num_classes)

    def forward(self, tokens: Tensor, grid: tuple[int, int]) -> Tensor:
        return self.head(tokens).transpose(1, 2).unflatten(2, grid)


class MaskTransformer(nn.Module):
    """Class embeddings appended to the patch tokens go through Transformer layers together; the
    class masks are the cosine similarities of patch and class embeddings, layer-normed over classes."""

    def __init__(self, num_classes: int, enc_dim: int, *, dim: int, depth: int, heads: int, seq_len: int,
                 mlp_ratio: float, dropout: float, attn_layer: AttentionFactory):
        super().__init__()
        self.proj_in = nn.Linear(enc_dim, dim)
        self.class_embed = nn.Parameter(torch.randn(1, num_classes, dim) * 0.02)
        self.blocks = Encoder(dim, depth, heads, mlp_ratio=mlp_ratio, dropout=dropout,
                              seq_len=seq_len + num_classes, attn_layer=attn_layer)
        self.proj_patch = nn.Linear(dim, dim, bias=False)
        self.proj_classes = nn.Linear(dim, dim, bias=False)
        self.mask_norm = nn.LayerNorm(num_classes)

    def forward(self, tokens: Tensor, grid: tuple[int, int]) -> Tensor:
        x = torch.cat([self.proj_in(tokens), self.class_embed.expand(len(tokens), -1, -1)], dim=1)
        x = self.blocks(x)
        num_classes = self.class_embed.shape[1]
        patches = F.normalize(self.proj_patch(x[:, :-num_classes]), dim=-1)
        classes = F.normalize(self.proj_classes(x[:, -num_classes:]), dim=-1)
        masks = self.mask_norm(patches @ classes.transpose(1, 2))  # [B, patches, classes]
        return masks.transpose(1, 2).unflatten(2, grid)


def resize_positions(pos: Tensor, grid: tuple[int, int]) -> Tensor:
    """Positional embeddings [1, D, h, w] interpolated (bicubic) to another grid of patches."""
    return pos if pos.shape[-2:] == grid else F.interpolate(pos, size=grid, mode="bicubic", align_corners=False)


class Segmenter(nn.Module):
    """Images [B, 3, H, W] in [0, 1] → class logits [B, classes, H, W] for any H, W."""

    def __init__(self, num_classes: int, *, crop_size: int, patch_size: int, dim: int, depth: int, heads: int,
                 mlp_ratio: float, dropout: float, drop_path: float, decoder: str, decoder_dim: int,
                 decoder_depth: int, decoder_heads: int, window_stride: int | None, pixel_mean: list[float],
                 pixel_std: list[float], attn_layer: AttentionFactory):
        super().__init__()
        if crop_size % patch_size:
            raise ValueError(f"crop_size {crop_size} is not a multiple of patch_size {patch_size}")
        self.patch_size, self.crop_size = patch_size, crop_size
        self.window_stride = window_stride or crop_size
        self.register_buffer("pixel_mean", torch.tensor(pixel_mean).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("pixel_std", torch.tensor(pixel_std).view(1, 3, 1, 1), persistent=False)
        grid = crop_size // patch_size
        self.patch_embed = nn.Conv2d(3, dim, patch_size, stride=patch_size)
        self.pos_embed = nn.Parameter(torch.randn(1, dim, grid, grid) * 0.02)
        self.encoder = Encoder(dim, depth, heads, mlp_ratio=mlp_ratio, dropout=dropout, drop_path=drop_path,
                               seq_len=grid**2, attn_layer=attn_layer)
        if decoder == "mask":
            self.decoder = MaskTransformer(num_classes, dim, dim=decoder_dim, depth=decoder_depth, heads=decoder_heads,
                                           seq_len=grid**2, mlp_ratio=mlp_ratio, dropout=dropout, attn_layer=attn_layer)
        elif decoder == "linear":
            self.decoder = LinearDecoder(num_classes, dim)
        else:
            raise ValueError(f"unknown decoder {decoder!r}; choose mask or linear")

    def forward(self, images: Tensor) -> Tensor:
        height, width = images.shape[-2:]
        x = (images - self.pixel_mean) / self.pixel_std
        # Pad to whole patches; the logits of the padding are cut off again at the end.
        x = F.pad(x, (0, -width % self.patch_size, 0, -height % self.patch_size))
        tokens = self.patch_embed(x)
        grid = tokens.shape[-2:]
        tokens = self.encoder((tokens + resize_positions(self.pos_embed, grid)).flatten(2).transpose(1, 2))
        logits = F.interpolate(self.decoder(tokens, tuple(grid)), size=x.shape[-2:], mode="bilinear",
                               align_corners=False)
        return logits[..., :height, :width]

    def sliding_window(self, images: Tensor) -> Tensor:
        """Logits averaged over crop-sized windows at ``window_stride``, the last window flush with the
        border; a side shorter than the crop is taken whole. All windows run as one batch."""
        height, width = images.shape[-2:]
        win_h, win_w = min(self.crop_size, height), min(self.crop_size, width)
        starts = lambda size, win: sorted({*range(0, size - win, self.window_stride), size - win})  # noqa: E731
        corners = list(product(starts(height, win_h), starts(width, win_w)))
        crops = torch.cat([images[..., y:y + win_h, x:x + win_w] for y, x in corners])
        window_logits = self(crops).chunk(len(corners))
        logits = images.new_zeros(len(images), window_logits[0].shape[1], height, width)
        count = images.new_zeros(1, 1, height, width)
        for (y, x), part in zip(corners, window_logits):
            logits[..., y:y + win_h, x:x + win_w] += part
            count[..., y:y + win_h, x:x + win_w] += 1
        return logits / count


def vision_positions(state: dict[str, Tensor], grid: tuple[int, int], key: str) -> Tensor:
    """A ViT's positional embeddings [1, (1 +) n², D] (the cls token's first, when it has one) as the
    Segmenter's [1, D, h, w]: the cls token's row dropped, the n x n patch positions resized to ``grid``."""
    pos = state["pos_embed"][:, 1:] if "cls_token" in state else state["pos_embed"]
    side = math.isqrt(pos.shape[1])
    if side * side != pos.shape[1]:
        raise ConfigError(f"{key}: the vision run's {pos.shape[1]} patch positions do not form a square grid")
    return resize_positions(pos.transpose(1, 2).unflatten(2, (side, side)), grid)


def init_encoder_from_vision(net: Segmenter, model: Net, variant: str, *, key: str = "model.init_from") -> list[str]:
    """Start ``net``'s patch embedding, positions and encoder layers (attention gains included) from the
    vision run at ``model.init_from`` (run directory or checkpoint), which must share the attention ``variant``,
    the encoder's shape (``SHARED_SHAPE`` of ``model``), the three colour channels and the pixel
    normalisation (its encoder learned on inputs normalised that way). Its cls token and classification
    head are left out. Returns the names loaded (``common.checkpoint.load_encoder`` logs them)."""
    run = load_run(model.init_from, key=key, domain="vision", variant=variant)
    pairs = [(f"model.{name}", getattr(run.config.model, name), f"model.{name}", getattr(model, name)) for name in SHARED_SHAPE]
    pairs += [("data.channels", run.config.data.channels, "input channels", 3),
              ("data.mean", list(run.config.data.mean), "model.pixel_mean", model.pixel_mean),
              ("data.std", list(run.config.data.std), "model.pixel_std", model.pixel_std)]
    for theirs, their_value, ours, our_value in pairs:
        if np.shape(their_value) != np.shape(our_value) or not np.allclose(their_value, our_value):
            raise ConfigError(f"{key}: the vision run has {theirs}={their_value}, this run {ours}={our_value}")
    state = {**run.state, "pos_embed": vision_positions(run.state, tuple(net.pos_embed.shape[-2:]), key)}
    return load_encoder(net, state, ENCODER, key=key, source=run.checkpoint)


def corruption_conditions(corruptions: list[str], severities: list[int]) -> dict[str, dict]:
    """The test-time conditions of ``task.perturbations``: every corruption at every severity, named
    ``<corruption>_<severity>``; an unknown one is a ``ConfigError`` here, before training."""
    for name in corruptions:
        for severity in severities:
            check_corruption(name, severity)
    return {f"{name}_{severity}": {"name": name, "severity": severity}
            for name in corruptions for severity in severities}


class SegmentationTask(Task):
    """Cross-entropy training on crops; sliding-window evaluation logging ``miou`` (primary), ``acc``
    (pixel accuracy) and, at test, per-class IoU (``iou_<class name>``) plus the mIoU under each
    corruption condition (``corruption_conditions``), summarised as ``miou_corrupt`` (mean over all
    conditions) and ``miou_<corruption>`` (mean over its severities)."""

    logit_dim = 1  # logits [batch, classes, height, width]

    def __init__(self, net: Segmenter, class_names: list[str], ignore_index: int, optim: Optim, *,
                 perturbations: dict[str, dict] | None = None, seed: int = 0):
        num_classes = len(class_names)

        # validate_args=False: checking every pixel label costs as much as a training step here.
        def jaccard(average: str) -> MulticlassJaccardIndex:
            return MulticlassJaccardIndex(num_classes, average=average, ignore_index=ignore_index, validate_args=False)

        metrics = {"miou": jaccard("macro"),
                   "acc": MulticlassAccuracy(num_classes, average="micro", ignore_index=ignore_index, validate_args=False),
                   "miou_baseline": MajorityClassIoU(num_classes, ignore_index)}
        super().__init__(net, optim, metrics, perturbations=perturbations, seed=seed)
        self.ignore_index, self.class_names = ignore_index, class_names
        self.class_iou = jaccard("none")

    def forward(self, images: Tensor) -> Tensor:
        return self.net(images) if self.training else self.net.sliding_window(images)

    def loss(self, logits: Tensor, masks: Tensor, stage: str) -> Tensor:
        if not (masks != self.ignore_index).any():  # an all-ignore batch has no loss, not a NaN one
            return logits.sum() * 0.0
        return F.cross_entropy(logits, masks, ignore_index=self.ignore_index)

    def predictions(self, logits: Tensor, masks: Tensor) -> tuple[Tensor, Tensor]:
        return logits.detach().argmax(1), masks

    def update_metrics(self, stage: str, preds: Tensor, masks: Tensor) -> None:
        super().update_metrics(stage, preds, masks)
        if stage == "test":
            self.class_iou.update(preds, masks)

    def perturb(self, images: Tensor, condition: str, settings: dict, generator: torch.Generator) -> Tensor:
        return corrupt(images, settings["name"], settings["severity"], generator)

    def summarize_perturbed(self, scores: dict[str, Tensor]) -> dict[str, Tensor]:
        by_corruption: dict[str, list[Tensor]] = {}
        for condition, score in scores.items():
            by_corruption.setdefault(self.perturbations[condition]["name"], []).append(score)
        summary = {f"{self.headline}_corrupt": torch.stack(list(scores.values())).mean()}
        summary.update({f"{self.headline}_{name}": torch.stack(group).mean() for name, group in by_corruption.items()})
        return summary

    def directions(self) -> dict[str, str]:
        return super().directions() | {f"iou_{name}": "max" for name in self.class_names}

    def robustness_summary(self) -> list[str]:
        """Robustness summarised by the mIoU over every corruption."""
        return [f"{self.headline}_corrupt"] if self.perturbations else []

    def on_test_epoch_end(self) -> None:
        super().on_test_epoch_end()
        for name, iou in zip(self.class_names, self.class_iou.compute()):
            self.log(f"test/iou_{name}", iou)
        self.class_iou.reset()
