"""Folds: each variant as a rewrite of (q, k), so that plain dot-product attention with the returned scale
gives the variant's logits. ``QKFold`` does the normalisation and scale every variant shares; its subclasses
add the learnable scales a ``Variant`` names as its ``fold``."""
from __future__ import annotations

import functools
import math

import torch
from torch import Tensor, nn

from common.attention.kernels import KERNELS, l2_normalize
from common.attention.variants import Variant, get_variant


def qknorm_gain_init(seq_len: int | None, head_dim: int) -> float:
    """Henry et al. (2020): g0 = log2(L² − L) for typical length L; without L, sqrt(head_dim), so the
    logit starts as the standard one would for unit-variance vectors."""
    if seq_len is not None and seq_len > 1:
        return math.log2(seq_len**2 - seq_len)
    return math.sqrt(head_dim)


def _per_head(x: Tensor, like: Tensor) -> Tensor:
    """A per-head vector [H] shaped to broadcast against q with heads on dim 1 ([B, H, N, D] or [N, H, D])."""
    return x.view(-1, *([1] * (like.dim() - 2)))


class QKFold(nn.Module):
    """Folds a variant into (q, k) for one attention layer, so that plain dot-product attention with
    the returned scale gives the variant's logits. Subclasses add learnable scales: ``logit_gain`` (one factor
    on every logit of a head, folded into k's normalisation where k is normalised, so it costs no pass
    of its own) or ``rescale``; q and k have heads on dim 1: [B, H, N, D] (dense) or [N, H, D] (edges).

    Beside its fast path a fold writes its logits out literally, ``reference_logits``, which the attention tests
    hold the fast path (gain folded into the key's normalisation, fused kernels, SDPA) to for every variant that
    names the fold, so a new fold needs no test of its own; the scales it creates are declared in
    ``variants.FOLD_SCALES`` (none: its variants are not learnable)."""

    def __init__(self, variant: Variant, num_heads: int, head_dim: int, *, seq_len: int | None = None,
                 qk_gain_init: float | None = None, eps: float = 1e-6, l2norm_kernel: str = "fused"):
        super().__init__()
        if l2norm_kernel not in KERNELS:
            raise ValueError(f"attention.l2norm_kernel must be one of {', '.join(KERNELS)}, not {l2norm_kernel!r}")
        self.variant, self.eps, self.fused = variant, eps, l2norm_kernel == "fused"

    def logit_gain(self, like: Tensor) -> Tensor | None:
        return None

    def rescale(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        return q, k

    def forward(self, q: Tensor, k: Tensor, metric: Tensor | None = None) -> tuple[Tensor, Tensor, float]:
        """``metric`` is the elliptical weight m; without it an elliptical variant runs its base
        variant (the first layer of a stack has no previous values)."""
        spec, gain = self.variant, self.logit_gain(q)
        if spec.elliptical and metric is not None:
            q = q * metric
        if spec.norm_q:
            q = l2_normalize(q, self.eps, fused=self.fused)
        if spec.norm_k:
            k = l2_normalize(k, self.eps, gain, fused=self.fused)  # g·q·k̂ = q·(g·k̂)
        elif gain is not None:
            q = q * gain
        q, k = self.rescale(q, k)
        return q, k, (q.shape[-1] ** -0.5 if spec.scaled else 1.0)

    def reference_logits(self, q: Tensor, k: Tensor) -> Tensor:
        """The logits [..., N, M] written out the slow, literal way, from q and k as the variant leaves them
        before this fold (weighted by the elliptical metric and L2-normalised as its ``Variant`` says) and before
        the 1/sqrt(d) scale of a scaled variant; dense layout [B, H, N, D]. Only the tests call it."""
        return q @ k.transpose(-2, -1)

    def extra_repr(self) -> str:
        return f"variant={self.variant.name}"


class LayerGain(QKFold):
    """g · q̂·k̂ with one learnable g per layer, started at ``qknorm_gain_init`` (or ``qk_gain_init``)."""


    def __init__(self, variant: Variant, num_heads: int, head_dim: int, *, seq_len: int | None = None,
                 qk_gain_init: float | None = None, eps: float = 1e-6, l2norm_kernel: str = "fused"):
        super().__init__(variant, num_heads, head_dim, eps=eps, l2norm_kernel=l2norm_kernel)
        g0 = qk_gain_init if qk_gain_init is not None else qknorm_gain_init(seq_len, head_dim)
        self.gain = nn.Parameter(torch.full((self.gains(num_heads),), float(g0)))

    @staticmethod
    def gains(num_heads: int) -> int:
        return 1

    def logit_gain(self, like: Tensor) -> Tensor:
        return _per_head(self.gain, like)

    def reference_logits(self, q: Tensor, k: Tensor) -> Tensor:
        return self.gain.view(-1, 1, 1) * (q @ k.transpose(-2, -1))


class HeadGain(LayerGain):
    """g_h · q̂·k̂: one learnable gain per head."""

    @staticmethod
    def gains(num_heads: int) -> int:
        return num_heads


class DimScale(QKFold):
    """(c_q⊙q̂)·(c_k⊙k̂) with learnable c_q, c_k ∈ R^d, started at d^(1/4) so the logit starts at sqrt(d)·cos.
    Computed as q̂·((c_q⊙c_k)⊙k̂): the same logits and gradients, one pass over k instead of one over each."""


    def __init__(self, variant: Variant, num_heads: int, head_dim: int, *, seq_len: int | None = None,
                 qk_gain_init: float | None = None, eps: float = 1e-6, l2norm_kernel: str = "fused"):
        super().__init__(variant, num_heads, head_dim, eps=eps, l2norm_kernel=l2norm_kernel)
        self.q_scale = nn.Parameter(torch.full((head_dim,), head_dim**0.25))
        self.k_scale = nn.Parameter(torch.full((head_dim,), head_dim**0.25))

    def rescale(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        return q, k * (self.q_scale * self.k_scale)

    def reference_logits(self, q: Tensor, k: Tensor) -> Tensor:
        return (self.q_scale * q) @ (self.k_scale * k).transpose(-2, -1)


class ZeroQuery(QKFold):
    """Every logit 0: each query takes the plain mean of the values of the keys it may see (padding and
    causality still apply). The architecture and its parameters stay; what attention computes from
    content goes."""

    def rescale(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        return torch.zeros_like(q), k

    def reference_logits(self, q: Tensor, k: Tensor) -> Tensor:
        return torch.zeros(*q.shape[:-1], k.shape[-2], dtype=q.dtype)


# The classes a ``Variant`` may name as its ``fold``: a new fold is one more class here, and its line in
# ``variants.FOLD_SCALES``.
FOLDS: dict[str, type[QKFold]] = {fold.__name__: fold for fold in (QKFold, LayerGain, HeadGain, DimScale, ZeroQuery)}


def make_fold(variant: str | Variant, num_heads: int, head_dim: int, **kwargs) -> QKFold:
    """The fold module of ``variant`` for a layer of ``num_heads`` heads of ``head_dim``: the class its entry
    names in ``FOLDS``, with ``kwargs`` (``seq_len``, ``qk_gain_init``, ``eps``, ``l2norm_kernel``)."""
    spec = get_variant(variant)
    if spec.fold not in FOLDS:
        raise ValueError(f"variant {spec.name!r} names fold {spec.fold!r}; the folds are {', '.join(FOLDS)}")
    return FOLDS[spec.fold](spec, num_heads, head_dim, **kwargs)


def fold_qk(q: Tensor, k: Tensor, variant: str | Variant, *, fold: QKFold | None = None,
            metric: Tensor | None = None, eps: float = 1e-6) -> tuple[Tensor, Tensor, float]:
    """(q, k, scale) such that SDPA with that scale gives the variant's logits. A variant with
    learnable scales needs its ``fold`` module (``make_fold(name, heads, head_dim)``)."""
    spec = get_variant(variant)
    if fold is None:
        if spec.learnable:
            raise ValueError(f"variant {spec.name!r} has learnable scales: pass fold=make_fold({spec.name!r}"
                             ", num_heads, head_dim), or use MultiheadAttention")
        fold = _stateless_fold(spec, eps)
    return fold(q, k, metric)


@functools.cache
def _stateless_fold(spec: Variant, eps: float) -> QKFold:
    """The fold of a variant without learnable scales, built once: a module per call would cost more than
    the normalisation it applies at short sequences."""
    return FOLDS[spec.fold](spec, 0, 0, eps=eps)
