"""Keyword spotting with a Conformer (Gulati et al. 2020) whose self-attention is ``common.attention``.

waveform -> log-mel (torchaudio; per-utterance mean/variance normalised; SpecAugment in training)
-> 2 x (3x3 conv, stride 2) subsampling -> Conformer blocks -> masked mean pool -> linear classifier.

Each block: x + ½FFN(x); x + MHSA(x) with a relative-position bias; x + Conv(x); x + ½FFN(x); LayerNorm.
Module and parameter names follow ``torchaudio.models.Conformer``, so its state dict loads into
``ConformerEncoder`` as is (the relative-position tables are ours alone).

Relative positions. Gulati et al. use Transformer-XL's relative encoding, whose term depends on the query
and so cannot ride on a fused kernel. Here each block learns a bias per head and relative-distance bucket
(T5: exact near the diagonal, log-spaced further out, clipped beyond ``max_distance``) and passes it as
``attn_bias``. SDPA adds it after the variant has formed and scaled its logit, so every variant sees
``logit_variant(q, k) + b_h(j - i)``: for QUEST ``‖q‖·cos(q, k̂) + b``, for qknorm ``g·cos + b``. The bias
is not normalised or rescaled by any variant: it is a content-free prior over offsets, started at zero so
every variant begins from its own content logit. The probes' max logit is the content logit, bias excluded.

Padding. Lengths give key-padding masks; the subsampling convs have no time padding, so a valid output frame
only reads valid input frames; the convolution module zeroes padded frames before its depthwise conv (as at
an unpadded end) and takes BatchNorm statistics over valid frames only. Padding therefore never changes the
outputs for valid frames, in training as in evaluation.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from common.attention import AttentionState, MultiheadAttention
from common.blocks import AttentionFactory
from common.optional import require
from common.task import ClassificationTask

from .config import Features, Noise, SpecAugment

torchaudio = require("torchaudio", extra="speech")

LOG_FLOOR = 1e-6  # added to the mel power before the log


class LogMel(nn.Module):
    """Normalised log-mel features [B, n_mels, frames] and the valid frame count per utterance. Frames
    are not centred (no reflection padding at the ends), so a frame's value never depends on padding."""

    def __init__(self, sample_rate: int, n_mels: int, win_ms: float, hop_ms: float):
        super().__init__()
        self.win = int(round(sample_rate * win_ms / 1000))
        self.hop = int(round(sample_rate * hop_ms / 1000))
        self.mel = torchaudio.transforms.MelSpectrogram(sample_rate, n_fft=self.win, hop_length=self.hop,
                                                        n_mels=n_mels, center=False)

    def frames(self, samples: Tensor) -> Tensor:
        return (torch.div(samples - self.win, self.hop, rounding_mode="floor") + 1).clamp_min(0)

    def forward(self, wave: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        if wave.shape[-1] < self.win:
            wave = F.pad(wave, (0, self.win - wave.shape[-1]))
        feats = (self.mel(wave) + LOG_FLOOR).log()
        frames = self.frames(lengths)
        valid = (torch.arange(feats.shape[-1], device=feats.device) < frames[:, None])[:, None, :]
        count = frames.clamp_min(1)[:, None, None]
        mean = (feats * valid).sum(-1, keepdim=True) / count
        var = (((feats - mean) * valid) ** 2).sum(-1, keepdim=True) / count
        return ((feats - mean) * (var + 1e-5).rsqrt()).masked_fill(~valid, 0.0), frames


class ConvSubsampling(nn.Module):
    """Two 3x3 stride-2 convolutions (time and frequency / 4) and a projection to ``dim``."""

    def __init__(self, n_mels: int, channels: int, dim: int):
        super().__init__()
        self.conv = nn.Sequential(nn.Conv2d(1, channels, 3, 2), nn.ReLU(), nn.Conv2d(channels, channels, 3, 2),
                                  nn.ReLU())
        self.proj = nn.Linear(channels * self.out_len(self.out_len(n_mels)), dim)

    @staticmethod
    def out_len(n):
        return (n - 1) // 2  # 3-tap stride-2 conv without padding

    def forward(self, feats: Tensor, frames: Tensor) -> tuple[Tensor, Tensor]:
        """[B, n_mels, T] -> [B, T', dim]."""
        need = 7 - feats.shape[-1]  # the shortest input the two convs accept
        if need > 0:
            feats = F.pad(feats, (0, need))
        x = self.conv(feats.unsqueeze(1))  # [B, C, F', T']
        x = self.proj(x.permute(0, 3, 1, 2).flatten(2))
        return x, self.out_len(self.out_len(frames)).clamp_min(0)


def relative_buckets(length: int, num_buckets: int, max_distance: int, device=None) -> Tensor:
    """T5's bidirectional buckets of the offset j - i, [length, length]: half the buckets per direction,
    the first half of those exact, the rest log-spaced up to ``max_distance`` and clipped beyond it."""
    pos = torch.arange(length, device=device)
    offset = pos[None, :] - pos[:, None]
    half = num_buckets // 2
    exact = half // 2
    distance = offset.abs()
    far = exact + (torch.log(distance.clamp_min(1) / exact) / math.log(max_distance / exact) * (half - exact)).long()
    bucket = torch.where(distance < exact, distance, far.clamp_max(half - 1))
    return bucket + (offset > 0) * half


class RelativePositionBias(nn.Module):
    def __init__(self, num_heads: int, num_buckets: int):
        super().__init__()
        self.table = nn.Embedding(num_buckets, num_heads)
        nn.init.zeros_(self.table.weight)

    def forward(self, buckets: Tensor) -> Tensor:
        """[T, T] bucket ids -> additive bias [1, H, T, T]."""
        return self.table(buckets).permute(2, 0, 1).unsqueeze(0)


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int, dropout: float):
        super().__init__()
        self.sequential = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, hidden), nn.SiLU(), nn.Dropout(dropout),
                                        nn.Linear(hidden, dim), nn.Dropout(dropout))

    def forward(self, x: Tensor) -> Tensor:
        return self.sequential(x)


class ConvolutionModule(nn.Module):
    """LayerNorm -> pointwise (2x) -> GLU -> depthwise -> BatchNorm -> SiLU -> pointwise -> dropout."""

    def __init__(self, dim: int, kernel_size: int, dropout: float):
        super().__init__()
        if kernel_size % 2 == 0:
            raise ValueError(f"depthwise kernel_size must be odd to keep frames aligned, got {kernel_size}")
        self.layer_norm = nn.LayerNorm(dim)
        self.sequential = nn.Sequential(
            nn.Conv1d(dim, 2 * dim, 1), nn.GLU(dim=1),
            nn.Conv1d(dim, dim, kernel_size, padding=kernel_size // 2, groups=dim),
            nn.BatchNorm1d(dim), nn.SiLU(), nn.Conv1d(dim, dim, 1), nn.Dropout(dropout),
        )

    def forward(self, x: Tensor, padding: Tensor | None) -> Tensor:
        """x [B, T, D]; padding [B, T], True = padded frame."""
        pointwise, glu, depthwise, norm, act, project, drop = self.sequential
        h = glu(pointwise(self.layer_norm(x).transpose(1, 2)))
        if padding is None:
            h = norm(depthwise(h))
        else:
            h = depthwise(h.masked_fill(padding[:, None, :], 0.0)).transpose(1, 2)
            valid = ~padding
            normed = torch.zeros_like(h)
            normed[valid] = norm(h[valid])
            h = normed.transpose(1, 2)
        return drop(project(act(h))).transpose(1, 2)


class ConformerLayer(nn.Module):
    """``attn_layer`` makes the self-attention (``common.blocks.EncoderLayer`` says how); ``seq_len``: the
    typical number of frames, from which qknorm's gain starts."""

    def __init__(self, dim: int, num_heads: int, ffn_dim: int, kernel_size: int, dropout: float,
                 num_buckets: int, attn_layer: AttentionFactory, seq_len: int | None):
        super().__init__()
        self.ffn1 = FeedForward(dim, ffn_dim, dropout)
        self.self_attn_layer_norm = nn.LayerNorm(dim)
        self.self_attn = attn_layer(dim, num_heads, dropout=dropout, seq_len=seq_len)
        self.self_attn_dropout = nn.Dropout(dropout)
        self.rel_pos = RelativePositionBias(num_heads, num_buckets)
        self.conv_module = ConvolutionModule(dim, kernel_size, dropout)
        self.ffn2 = FeedForward(dim, ffn_dim, dropout)
        self.final_layer_norm = nn.LayerNorm(dim)

    def forward(self, x: Tensor, padding: Tensor | None, buckets: Tensor,
                state: AttentionState | None = None) -> Tensor:
        """``state`` is the stack's, shared by its layers (elliptical variants read the previous layer's values)."""
        x = x + 0.5 * self.ffn1(x)
        h = self.self_attn_layer_norm(x)
        h, _ = self.self_attn(h, h, h, key_padding_mask=padding, attn_bias=self.rel_pos(buckets), state=state)
        x = x + self.self_attn_dropout(h)
        x = x + self.conv_module(x, padding)
        x = x + 0.5 * self.ffn2(x)
        return self.final_layer_norm(x)


class ConformerEncoder(nn.Module):
    """Same call as ``torchaudio.models.Conformer``: ([B, T, dim], lengths [B]) -> (output, lengths)."""

    def __init__(self, dim: int, depth: int, num_heads: int, ffn_dim: int, kernel_size: int, *,
                 dropout: float = 0.0, num_buckets: int = 32, max_distance: int = 64,
                 attn_layer: AttentionFactory = MultiheadAttention, seq_len: int | None = None):
        super().__init__()
        self.num_buckets, self.max_distance = num_buckets, max_distance
        self.conformer_layers = nn.ModuleList(
            ConformerLayer(dim, num_heads, ffn_dim, kernel_size, dropout, num_buckets, attn_layer, seq_len)
            for _ in range(depth))

    def forward(self, x: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        padding = torch.arange(x.shape[1], device=x.device)[None, :] >= lengths[:, None]
        padding = padding if bool(padding.any()) else None  # no padding: the unmasked, faster kernels
        buckets = relative_buckets(x.shape[1], self.num_buckets, self.max_distance, x.device)
        state = AttentionState()
        for layer in self.conformer_layers:
            x = layer(x, padding, buckets, state)
        return x, lengths


class KeywordSpotter(nn.Module):
    """``((waveforms [B, S], lengths [B])) -> class logits``. ``clip_samples`` is the typical waveform
    length; the token count it gives sets qknorm's initial gain."""

    def __init__(self, num_classes: int, *, sample_rate: int, clip_samples: int, features: Features,
                 spec_augment: SpecAugment, subsampling_channels: int, dim: int, depth: int, heads: int, ffn_ratio: float,
                 kernel_size: int, dropout: float, num_buckets: int, max_distance: int, attn_layer: AttentionFactory):
        super().__init__()
        self.frontend = LogMel(sample_rate, **dict(features))
        self.spec_augment = torchaudio.transforms.SpecAugment(**dict(spec_augment), iid_masks=True, zero_masking=True)
        self.subsampling = ConvSubsampling(features.n_mels, subsampling_channels, dim)
        self.encoder = ConformerEncoder(dim, depth, heads, int(dim * ffn_ratio), kernel_size, dropout=dropout,
                                        num_buckets=num_buckets, max_distance=max_distance,
                                        attn_layer=attn_layer, seq_len=self.tokens(clip_samples))
        self.head = nn.Linear(dim, num_classes)

    def tokens(self, samples: int) -> int:
        """Encoder frames for a waveform of ``samples`` samples."""
        frames = self.frontend.frames(torch.tensor(samples))
        return int(ConvSubsampling.out_len(ConvSubsampling.out_len(frames)))

    def forward(self, inputs: tuple[Tensor, Tensor]) -> Tensor:
        wave, lengths = inputs
        feats, frames = self.frontend(wave, lengths)
        if self.training:  # zero masking = the mean of the normalised features
            feats = self.spec_augment(feats.unsqueeze(1)).squeeze(1)
        x, frames = self.subsampling(feats, frames)
        x, frames = self.encoder(x, frames)
        valid = (torch.arange(x.shape[1], device=x.device)[None, :] < frames[:, None]).unsqueeze(-1)
        pooled = (x * valid).sum(1) / frames.clamp_min(1)[:, None]
        return self.head(pooled)


def add_noise(wave: Tensor, lengths: Tensor, snr_db: float, generator: torch.Generator) -> Tensor:
    """White noise at ``snr_db`` relative to each utterance's power over its valid samples; padding stays zero."""
    valid = torch.arange(wave.shape[-1], device=wave.device)[None, :] < lengths[:, None]
    power = (wave**2 * valid).sum(-1, keepdim=True) / lengths.clamp_min(1)[:, None]
    noise = torch.randn(wave.shape, generator=generator, device=wave.device, dtype=wave.dtype)
    return wave + noise * (power / 10 ** (snr_db / 10)).sqrt() * valid


class KeywordTask(ClassificationTask):
    """Classification; at test time also on the test clips under white noise, one condition per entry of
    ``perturbations`` (the task config: ``snr<dB>: {snr_db: <dB>}``), logged as ``test/acc_snr<dB>``."""

    def perturb(self, inputs: tuple[Tensor, Tensor], condition: str, settings: Noise,
                generator: torch.Generator) -> tuple[Tensor, Tensor]:
        wave, lengths = inputs
        return add_noise(wave, lengths, settings.snr_db, generator), lengths
