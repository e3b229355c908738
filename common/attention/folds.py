"""Folds: each variant as a rewrite of (q, k), so that plain dot-product attention with the returned scale
gives the variant's logits. ``QKFold`` does the normalisation and scale every variant shares; its subclasses
add the learnable scales a ``Variant`` names as its ``fold``."""
from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from common.attention.kernels import KERNELS, l2_normalize
from common.attention.variants import Variant, get_variant


def qknorm_gain_init(seq_len: int | None, head_dim: int) -> float:
    """Henry et al. (2020): g0 = log2(L² − L) for typical length L; without L, sqrt(head_dim), so the
    logit starts as the standard one would for unit-variance vectors.

    Args:
        seq_len: The typical sequence length L. None (or L ≤ 1): fall back to sqrt(head_dim).
        head_dim: The size of each head.

    Returns:
        The initial gain g0.
    """
    if seq_len is not None and seq_len > 1:
        return math.log2(seq_len**2 - seq_len)
    return math.sqrt(head_dim)


class QKFold(nn.Module):
    """Folds a variant into (q, k) for one attention layer, so that plain dot-product attention with
    the returned scale gives the variant's logits. Subclasses add learnable scales: ``logit_gain`` (one factor
    on every logit of a head, folded into k's normalisation where k is normalised, so it costs no pass
    of its own) or ``rescale``; q and k have heads on dim 1: [B, H, N, D] (dense) or [N, H, D] (edges).

    Beside its fast path a fold writes its logits out literally, ``reference_logits``, which the attention tests
    hold the fast path (gain folded into the key's normalisation, fused kernels, SDPA) to for every variant that
    names the fold, so a new fold needs no test of its own; the scales it creates are declared in
    ``variants.FOLD_SCALES`` (none: its variants are not learnable).

    Args:
        variant: The ``Variant`` to fold (``make_fold`` takes a name).
        num_heads: Heads of the layer; sizes a subclass's per-head scales.
        head_dim: Size of each head; sizes a subclass's per-dimension scales.
        seq_len: Typical sequence length, from which a ``LayerGain`` or ``HeadGain`` gain starts (``qknorm_gain_init``).
        qk_gain_init: That gain's initial value, in place of the one from ``seq_len``.
        eps: Floor on the L2 norms of q and k.
        l2norm_kernel: How rows are normalised on CPU, one of ``KERNELS`` (see ``l2_normalize``).

    Raises:
        ValueError: If ``l2norm_kernel`` is not in ``KERNELS``.
    """

    def __init__(self, variant: Variant, num_heads: int, head_dim: int, *, seq_len: int | None = None,
                 qk_gain_init: float | None = None, eps: float = 1e-6, l2norm_kernel: str = "fused"):
        super().__init__()
        if l2norm_kernel not in KERNELS:
            raise ValueError(f"attention.l2norm_kernel must be one of {', '.join(KERNELS)}, not {l2norm_kernel!r}")
        self.variant, self.eps, self.fused = variant, eps, l2norm_kernel == "fused"

    def logit_gain(self, like: Tensor) -> Tensor | None:
        """The factor on every logit of a head, ``(gains, 1, 1)`` or ``(gains, 1)`` after ``like`` (q); None here."""
        return None

    def rescale(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        """The last step of ``forward``: a subclass's rewrite of (q, k) after normalisation and gain; unchanged here."""
        return q, k

    def forward(self, q: Tensor, k: Tensor, metric: Tensor | None = None) -> tuple[Tensor, Tensor, float]:
        """Folds (q, k); without ``metric`` (a stack's first layer) an elliptical variant runs its base variant.

        Args:
            q: Queries, ``(batch, heads, q_len, head_dim)`` dense or ``(nodes, heads, head_dim)`` on edges.
            k: Keys, ``(batch, heads, k_len, head_dim)`` dense or ``(nodes, heads, head_dim)`` on edges.
            metric: Elliptical weights m (``elliptical_metric``, ``edge_elliptical_metric``); elliptical variants only.

        Returns:
            ``(qf, kf, scale)``: q and k folded, shapes unchanged, and SDPA's scale: 1/sqrt(head_dim) if scaled, else 1.
        """
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
        """The logits [B, H, N, M] written out, from q, k [B, H, N, D] already metric-weighted and L2-normalised as the
        ``Variant`` says, and before a scaled variant's 1/sqrt(d); here ``q @ kᵀ``. Only the tests call it."""
        return q @ k.transpose(-2, -1)

    def extra_repr(self) -> str:
        """What ``repr`` shows inside the parentheses: ``variant=<name>``."""
        return f"variant={self.variant.name}"


class LayerGain(QKFold):
    """g · q̂·k̂ with one learnable g per layer, the parameter ``gain`` of shape ``(gains(num_heads),)``, started at
    ``qknorm_gain_init(seq_len, head_dim)`` (sqrt(head_dim) without ``seq_len``) or at ``qk_gain_init``.
    Arguments as for ``QKFold``."""

    def __init__(self, variant: Variant, num_heads: int, head_dim: int, *, seq_len: int | None = None,
                 qk_gain_init: float | None = None, eps: float = 1e-6, l2norm_kernel: str = "fused"):
        super().__init__(variant, num_heads, head_dim, eps=eps, l2norm_kernel=l2norm_kernel)
        g0 = qk_gain_init if qk_gain_init is not None else qknorm_gain_init(seq_len, head_dim)
        self.gain = nn.Parameter(torch.full((self.gains(num_heads),), float(g0)))

    @staticmethod
    def gains(num_heads: int) -> int:
        """How many gains a layer of ``num_heads`` heads learns: 1, one for the whole layer."""
        return 1

    def logit_gain(self, like: Tensor) -> Tensor:
        """The learnable gain, shaped to broadcast against ``like``."""
        return self.gain.view(-1, *([1] * (like.dim() - 2)))  # heads on dim 1: [B, H, N, D] or [N, H, D]

    def reference_logits(self, q: Tensor, k: Tensor) -> Tensor:
        """The logits written out: g · q·kᵀ."""
        return self.gain.view(-1, 1, 1) * (q @ k.transpose(-2, -1))


class HeadGain(LayerGain):
    """g_h · q̂·k̂: one learnable gain per head (``gain`` of shape ``(num_heads,)``), each started as for
    ``LayerGain``. Arguments as for ``QKFold``."""

    @staticmethod
    def gains(num_heads: int) -> int:
        """How many gains a layer of ``num_heads`` heads learns: ``num_heads``, one per head."""
        return num_heads


class DimScale(QKFold):
    """(c_q⊙q̂)·(c_k⊙k̂) with learnable c_q, c_k ∈ R^d, started at d^(1/4) so the logit starts at sqrt(d)·cos.
    Computed as q̂·((c_q⊙c_k)⊙k̂): the same logits and gradients, one pass over k instead of one over each.
    The scales are the parameters ``q_scale`` and ``k_scale``, each ``(head_dim,)``. Arguments as for ``QKFold``."""

    def __init__(self, variant: Variant, num_heads: int, head_dim: int, *, seq_len: int | None = None,
                 qk_gain_init: float | None = None, eps: float = 1e-6, l2norm_kernel: str = "fused"):
        super().__init__(variant, num_heads, head_dim, eps=eps, l2norm_kernel=l2norm_kernel)
        self.q_scale = nn.Parameter(torch.full((head_dim,), head_dim**0.25))
        self.k_scale = nn.Parameter(torch.full((head_dim,), head_dim**0.25))

    def rescale(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        """Both scales applied to k, which gives the logits of applying each to its side: ``(q, (c_q⊙c_k)⊙k)``."""
        return q, k * (self.q_scale * self.k_scale)

    def reference_logits(self, q: Tensor, k: Tensor) -> Tensor:
        """The logits written out: (c_q⊙q)·(c_k⊙k)ᵀ."""
        return (self.q_scale * q) @ (self.k_scale * k).transpose(-2, -1)


class QKLayerNorm(QKFold):
    """LN(q)·LN(k) / sqrt(d): a LayerNorm over head_dim on the queries and another on the keys, each with a learnable
    gain and no bias (``q_gain``, ``k_gain``, each ``(head_dim,)``, shared by the heads; a bias on k would shift every
    logit of a row alike and learn nothing), then the standard logit. The field's own fix for logit growth
    (QK-layernorm: Dehghani et al. 2023, bias-free as there, and Wortsman et al. 2023; OLMo 2 and Qwen3 use RMSNorm
    in its place): a query's norm is set by its gain, as a key's is, where QUEST leaves it free. Arguments as for
    ``QKFold``."""

    def __init__(self, variant: Variant, num_heads: int, head_dim: int, *, seq_len: int | None = None,
                 qk_gain_init: float | None = None, eps: float = 1e-6, l2norm_kernel: str = "fused"):
        super().__init__(variant, num_heads, head_dim, eps=eps, l2norm_kernel=l2norm_kernel)
        self.q_gain, self.k_gain = nn.Parameter(torch.ones(head_dim)), nn.Parameter(torch.ones(head_dim))

    def rescale(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        """Each side through its LayerNorm: ``(LN_q(q), LN_k(k))``."""
        shape = q.shape[-1:]
        return F.layer_norm(q, shape, self.q_gain), F.layer_norm(k, shape, self.k_gain)

    def reference_logits(self, q: Tensor, k: Tensor) -> Tensor:
        """The logits written out, each LayerNorm by its formula (population variance, eps 1e-5) in float64:
        LN_q(q)·LN_k(k)ᵀ."""
        def norm(x: Tensor, gain: Tensor) -> Tensor:
            centred = x.double() - x.double().mean(-1, keepdim=True)
            return centred / (centred.square().mean(-1, keepdim=True) + 1e-5).sqrt() * gain.double()
        return (norm(q, self.q_gain) @ norm(k, self.k_gain).transpose(-2, -1)).to(q.dtype)


class ZeroQuery(QKFold):
    """Every logit 0: each query takes the plain mean of the values of the keys it may see (padding and
    causality still apply). The architecture and its parameters stay; what attention computes from
    content goes. Arguments as for ``QKFold``; it learns nothing."""

    def rescale(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        """q replaced by zeros, so every logit is 0."""
        return torch.zeros_like(q), k

    def reference_logits(self, q: Tensor, k: Tensor) -> Tensor:
        """The logits written out: all 0, in q's dtype."""
        return torch.zeros(*q.shape[:-1], k.shape[-2], dtype=q.dtype)


# The classes a ``Variant`` may name as its ``fold``: a new fold is one more class here, and its line in
# ``variants.FOLD_SCALES``.
FOLDS: dict[str, type[QKFold]] = {fold.__name__: fold for fold in (QKFold, LayerGain, HeadGain, DimScale, QKLayerNorm,
                                                                   ZeroQuery)}


def make_fold(variant: str | Variant, num_heads: int, head_dim: int, **kwargs) -> QKFold:
    """The fold module of ``variant``: the class its entry names in ``FOLDS``.

    Args:
        variant: A variant's name or its ``Variant``.
        num_heads: Heads of the layer.
        head_dim: Size of each head.
        **kwargs: Keyword arguments of the fold class: ``seq_len``, ``qk_gain_init``, ``eps``, ``l2norm_kernel``.

    Returns:
        The fold module, a ``QKFold`` or the subclass the variant names.

    Raises:
        ValueError: If ``variant`` is unknown or names no fold in ``FOLDS``, or ``l2norm_kernel`` is not in ``KERNELS``.
    """
    spec = get_variant(variant)
    if spec.fold not in FOLDS:
        raise ValueError(f"variant {spec.name!r} names fold {spec.fold!r}; the folds are {', '.join(FOLDS)}")
    return FOLDS[spec.fold](spec, num_heads, head_dim, **kwargs)


def fold_qk(q: Tensor, k: Tensor, variant: str | Variant, *, fold: QKFold | None = None,
            metric: Tensor | None = None, eps: float = 1e-6) -> tuple[Tensor, Tensor, float]:
    """(q, k, scale) such that SDPA with that scale gives the variant's logits.

    Args:
        q: Queries, ``(batch, heads, q_len, head_dim)`` (or ``(nodes, heads, head_dim)``).
        k: Keys, ``(batch, heads, k_len, head_dim)`` (or ``(nodes, heads, head_dim)``).
        variant: A variant's name or its ``Variant``.
        fold: The variant's fold module (``make_fold``), needed by learnable variants. None: a cached stateless one.
        metric: Elliptical weights m, as for ``QKFold.forward``. None: an elliptical variant runs its base variant.
        eps: Floor on the L2 norms for the fold built when ``fold`` is None; a given fold keeps its own.

    Returns:
        ``(qf, kf, scale)``: q and k folded, shapes unchanged, and the scale to hand SDPA.

    Raises:
        ValueError: If ``variant`` is unknown, or has learnable scales and ``fold`` is None.
    """
    spec = get_variant(variant)
    if fold is None:
        if spec.learnable:
            raise ValueError(f"variant {spec.name!r} has learnable scales: pass fold=make_fold({spec.name!r}"
                             ", num_heads, head_dim), or use MultiheadAttention")
        fold = _stateless_fold(spec, eps, q.shape[1], q.shape[-1])  # heads on dim 1: [B, H, N, D] or [N, H, D]
    return fold(q, k, metric)


@functools.cache
def _stateless_fold(spec: Variant, eps: float, num_heads: int, head_dim: int) -> QKFold:
    """The fold of a variant without learnable scales, built once per head layout at the real sizes (a fold may read
    them in ``__init__``): a module per call would cost more than the normalisation it applies at short sequences."""
    return FOLDS[spec.fold](spec, num_heads, head_dim, eps=eps)
