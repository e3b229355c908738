"""PatchTST (Nie et al., ICLR 2023) on the shared attention core, and its forecasting task.

Each channel is forecast on its own (channel independence): its look-back window is instance-normalised
(RevIN), cut into overlapping patches, each patch embedded as one token, the tokens encoded by
``common.blocks.Encoder``, and all token outputs flattened into a linear head that emits the horizon.
Differences from the paper's code, so that only the attention variant differs between the study's domains:
the encoder is the shared pre-LayerNorm block (PatchTST: post-BatchNorm), and no layer adds the previous
layer's attention scores to its own (PatchTST's default "residual attention").
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics import MeanAbsoluteError, MeanSquaredError, Metric, MetricCollection

from common.blocks import AttentionFactory, Encoder
from common.task import Optim, Task


class RevIN(nn.Module):
    """Reversible instance normalisation (Kim et al., ICLR 2022): each sample's channels are standardised
    by their own look-back mean and std, and the forecast is mapped back with the same statistics, so
    level shifts between training and test windows do not have to be learnt."""

    def __init__(self, num_channels: int, affine: bool = True, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(num_channels)) if affine else None
        self.bias = nn.Parameter(torch.zeros(num_channels)) if affine else None

    def normalize(self, x: Tensor) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """x [B, L, C] -> normalised x and the (mean, std) that ``denormalize`` needs."""
        mean = x.mean(dim=1, keepdim=True).detach()
        std = torch.sqrt(x.var(dim=1, keepdim=True, unbiased=False) + self.eps).detach()
        x = (x - mean) / std
        if self.weight is not None:
            x = x * self.weight + self.bias
        return x, (mean, std)

    def denormalize(self, y: Tensor, stats: tuple[Tensor, Tensor]) -> Tensor:
        mean, std = stats
        if self.weight is not None:
            # eps² keeps the division finite should a weight be driven to zero.
            y = (y - self.bias) / (self.weight + self.eps**2)
        return y * std + mean


class PatchTST(nn.Module):
    """x [B, seq_len, C] -> forecast [B, pred_len, C]."""

    def __init__(self, num_channels: int, seq_len: int, pred_len: int, *, patch_len: int, stride: int,
                 dim: int, depth: int, heads: int, mlp_ratio: float, dropout: float, attn_dropout: float,
                 head_dropout: float, revin: bool, revin_affine: bool, attn_layer: AttentionFactory):
        super().__init__()
        if not 0 < patch_len <= seq_len or stride < 1:
            raise ValueError(f"need 0 < patch_len <= seq_len and stride >= 1, got patch_len={patch_len}, "
                             f"stride={stride}, seq_len={seq_len}")
        self.patch_len, self.stride = patch_len, stride
        # As in the paper's code, the series is padded at the end by repeating its last value `stride`
        # times, which adds one patch covering the most recent values.
        self.num_patches = (seq_len - patch_len) // stride + 2
        self.revin = RevIN(num_channels, affine=revin_affine) if revin else None
        self.embed = nn.Linear(patch_len, dim)
        self.position = nn.Parameter(torch.empty(self.num_patches, dim).uniform_(-0.02, 0.02))
        self.drop = nn.Dropout(dropout)
        self.encoder = Encoder(dim, depth, heads, mlp_ratio=mlp_ratio, dropout=dropout, attn_dropout=attn_dropout,
                               seq_len=self.num_patches, attn_layer=attn_layer)
        self.head = nn.Sequential(nn.Flatten(start_dim=1), nn.Dropout(head_dropout),
                                  nn.Linear(self.num_patches * dim, pred_len))

    def patches(self, x: Tensor) -> Tensor:
        """[B, L, C] -> [B * C, num_patches, patch_len]: every channel becomes its own sequence."""
        series = x.transpose(1, 2).flatten(0, 1)  # [B*C, L]
        series = F.pad(series.unsqueeze(1), (0, self.stride), mode="replicate").squeeze(1)
        return series.unfold(-1, self.patch_len, self.stride)

    def forward(self, x: Tensor) -> Tensor:
        batch, _, channels = x.shape
        if self.revin is not None:
            x, stats = self.revin.normalize(x)
        tokens = self.drop(self.embed(self.patches(x)) + self.position)
        forecast = self.head(self.encoder(tokens))  # [B*C, pred_len]
        forecast = forecast.view(batch, channels, -1).transpose(1, 2).contiguous()
        if self.revin is not None:
            forecast = self.revin.denormalize(forecast, stats)
        return forecast


def error_metrics() -> dict[str, Metric]:
    """``mse`` (the headline) and ``mae``."""
    return {"mse": MeanSquaredError(), "mae": MeanAbsoluteError()}


class ForecastTask(Task):
    """MSE training on ``(x, y)`` windows; logs ``mse`` and ``mae`` on the standardised scale (the field's
    convention), and on the test split also a persistence baseline (the last observed value repeated over
    the horizon: the trivial baseline) as ``test/mse_baseline`` and ``test/mae_baseline``."""

    def __init__(self, net: nn.Module, optim: Optim):
        super().__init__(net, optim, error_metrics())
        self.persistence = MetricCollection(error_metrics(), prefix="test/", postfix="_baseline")

    def loss(self, forecast: Tensor, y: Tensor, stage: str) -> Tensor:
        return F.mse_loss(forecast, y)

    def directions(self) -> dict[str, str]:
        return super().directions() | {f"{name}_baseline": "min" for name in error_metrics()}

    def baselines(self) -> dict[str, str]:
        return {f"{name}_baseline": "the last observed value over the whole horizon (persistence)"
                for name in error_metrics()}

    def test_step(self, batch, batch_idx):
        super().test_step(batch, batch_idx)
        x, y = batch
        self.persistence.update(x[:, -1:].repeat(1, y.shape[1], 1), y)
        self.log_dict(self.persistence, on_step=False, on_epoch=True, batch_size=len(y))
