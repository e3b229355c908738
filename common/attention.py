"""Attention variants of the QUEST study, every one on the fused SDPA kernel.

Each variant is a rewrite of (q, k) followed by one call to
``torch.nn.functional.scaled_dot_product_attention`` (per head, head size d):

    variant            logit s_ij                   learnable
    standard           q·k / sqrt(d)                -
    quest              q·k̂          (no scale)      -
    qnorm              q̂·k          (no scale)      -
    qknorm             g · q̂·k̂      g per layer     g
    qknorm_hs          g_h · q̂·k̂    g per head      g
    qknorm_ds          (c_q⊙q̂)·(c_k⊙k̂)              c_q, c_k ∈ R^d
    elliptical         (m⊙q)·k / sqrt(d)            - (m from values, no grad)
    elliptical_quest   (m⊙q)·k̂      (no scale)      -

QUEST's logit is ‖q_i‖·cos(q_i, k_j): the query norm sets the sharpness of its own row, while no key
can grow its norm to take attention from every query at once.  Explicit [tokens × tokens] logits are
only formed when asked for (``need_weights`` or a stability probe).

A variant is one ``Variant`` entry in ``VARIANTS``: which of q and k are L2-normalised, whether the
1/sqrt(d) scale stays, whether it is elliptical, and its ``fold``, the ``QKFold`` class that owns its
learnable scales (``LayerGain``, ``HeadGain``, ``DimScale``; plain ``QKFold`` when it has none).

Layers of a stack share one ``AttentionState``: each attention module reads the previous layer's
values from it (elliptical variants need them) and leaves its own, so a stack never needs to know
which variant it runs. Causal decoding one token at a time keeps a ``KVCache`` per layer across
forward passes. This module needs torch only (PyG for the edge path, imported on use).
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from common import probes


class _L2Normalize(torch.autograd.Function):
    """g · x / max(‖x‖, eps) over the last dimension, with its gradients written out: one element-wise pass
    forward (x times the per-row factor g / ‖x‖) and four backward, where autograd's F.normalize followed
    by a gain would take several more, which at short sequences cost as much as the attention kernel
    itself. The gain's gradient comes from the per-row radial term the input's gradient needs anyway.
    ``gain`` (optional) broadcasts against the [..., 1] row norms. Written in the ``setup_context`` form
    so that ``torch.func`` transforms (vmap over stacked seeds) can use it."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x: Tensor, gain: Tensor | None, eps: float) -> tuple[Tensor, Tensor]:
        norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True).clamp_min(eps)
        return x * (norm.reciprocal() if gain is None else (gain / norm).to(x.dtype)), norm

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, gain, eps = inputs
        ctx.mark_non_differentiable(output[1])
        ctx.save_for_backward(x, gain, output[1])
        ctx.eps = eps

    @staticmethod
    def backward(ctx, grad: Tensor, _norm_grad: Tensor | None):
        x, gain, norm = ctx.saved_tensors
        # u = x / norm; u·grad per row is the radial part, projected out of the input's gradient (below eps
        # the clamp makes the map linear, x / eps, with nothing to project) and summed into the gain's.
        radial = (x * grad).sum(-1, keepdim=True) / norm  # faster than linalg.vecdot for short rows on CPU
        factor = norm.reciprocal() if gain is None else gain / norm
        grad_x = torch.addcmul(grad, x, radial * (norm > ctx.eps) / norm, value=-1).mul_(factor)
        grad_gain = None if gain is None else radial.sum_to_size(gain.shape).to(gain.dtype)
        return grad_x, grad_gain, None


class _FusedRowNormalize(torch.autograd.Function):
    """The same map on CPU, through PyTorch's fused weight-norm kernels (``torch._weight_norm_interface`` and
    its backward, with ``dim=0`` on x's rows): each takes a row's norm and rescales it in one sweep, where the
    formula above needs a reduction and broadcasts that are slow on rows of 16 to 64 numbers (``quest bench``'s
    "normalise k" rows: 2.5-2.9x faster forward+backward at its two short shapes). The kernels have no eps:
    a row at or below it would come out as 0/0, so those rows (padding) are rewritten by the formula after,
    on a check that costs one comparison per row. That check is a data-dependent branch, which is why
    ``l2_normalize`` keeps this path off GPUs (it would wait for the device), ``torch.compile`` and ``torch.func``
    transforms (vmap), where the formula runs instead."""

    @staticmethod
    def forward(ctx, x: Tensor, gain: Tensor | None, eps: float) -> Tensor:
        # Rows in memory order (x is often a head-split view of a projection) so that [rows, d] is a view, or
        # at most one copy, and every per-row factor lines up with its row.
        order = sorted(range(x.dim() - 1), key=lambda i: -x.stride(i)) + [x.dim() - 1]
        ordered = x.permute(order)
        shape = ordered.shape
        rows = ordered.reshape(-1, x.shape[-1]).contiguous()
        if gain is None:
            gains = torch.ones(rows.shape[0], 1, dtype=x.dtype, device=x.device)
        else:
            gains = torch.broadcast_to(gain, (*x.shape[:-1], 1)).permute(order).reshape(-1, 1).to(x.dtype).contiguous()
        y, norm = torch._weight_norm_interface(rows, gains, 0)
        norm = norm.clamp_min(eps)
        small = (norm <= eps).squeeze(1).nonzero().squeeze(1)
        if small.numel():
            y[small] = rows[small] * (gains[small] / eps)
        ctx.save_for_backward(rows, gains, norm, small)
        ctx.order, ctx.shape, ctx.eps, ctx.gain = order, shape, eps, None if gain is None else (gain.shape, gain.dtype)
        return y.view(shape).permute(_inverse(order))

    @staticmethod
    def backward(ctx, grad: Tensor):
        rows, gains, norm, small = ctx.saved_tensors
        unorder, eps = _inverse(ctx.order), ctx.eps
        grad_rows = grad.permute(ctx.order).reshape(rows.shape).contiguous()
        grad_x, grad_gains = torch.ops.aten._weight_norm_interface_backward(grad_rows, rows, gains, norm, 0)
        if small.numel():  # below eps the map is linear, x · g / eps: nothing to project out
            grad_x[small] = grad_rows[small] * (gains[small] / eps)
        grad_gain = None
        if ctx.gain is not None and ctx.needs_input_grad[1]:
            shape, dtype = ctx.gain
            grad_gain = grad_gains.view(*ctx.shape[:-1], 1).permute(unorder).sum_to_size(shape).to(dtype)
        return grad_x.view(ctx.shape).permute(unorder), grad_gain, None


def _inverse(order: list[int]) -> list[int]:
    return sorted(range(len(order)), key=order.__getitem__)


_FUSED_DTYPES = (torch.float32, torch.float64, torch.bfloat16)
_fused_allowed = contextvars.ContextVar("fused_normalization", default=True)


def l2_normalize(x: Tensor, eps: float = 1e-6, gain: Tensor | None = None) -> Tensor:
    """Normalise the last dimension, times ``gain`` (broadcasting against [..., 1]) if given; all-zero
    (padding) vectors stay zero instead of NaN."""
    if (x.device.type == "cpu" and x.dtype in _FUSED_DTYPES and x.numel() and _fused_allowed.get()
            and not torch.compiler.is_compiling() and not torch._C._are_functorch_transforms_active()):
        return _FusedRowNormalize.apply(x, gain, eps)
    return _L2Normalize.apply(x, gain, eps)[0]


@contextlib.contextmanager
def formula_normalization():
    """Normalise with the written-out formula even where the fused CPU kernels would run. The two agree to
    float rounding, not to the bit: a model trained both alone and under ``torch.func.vmap`` (where only the
    formula runs, ``runners.ensemble``) asks for it so that both give the same run, and a run's
    ``normalization=formula`` setting reproduces runs recorded before the fused kernels."""
    token = _fused_allowed.set(False)
    try:
        yield
    finally:
        _fused_allowed.reset(token)


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
    of its own) or ``rescale``; q and k have heads on dim 1: [B, H, N, D] (dense) or [N, H, D] (edges)."""

    def __init__(self, variant: Variant, num_heads: int, head_dim: int, *, seq_len: int | None = None,
                 qk_gain_init: float | None = None, eps: float = 1e-6):
        super().__init__()
        self.variant, self.eps = variant, eps

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
            q = l2_normalize(q, self.eps)
        if spec.norm_k:
            k = l2_normalize(k, self.eps, gain)  # g·q·k̂ = q·(g·k̂)
        elif gain is not None:
            q = q * gain
        q, k = self.rescale(q, k)
        return q, k, (q.shape[-1] ** -0.5 if spec.scaled else 1.0)

    def extra_repr(self) -> str:
        return f"variant={self.variant.name}"


class LayerGain(QKFold):
    """g · q̂·k̂ with one learnable g per layer, started at ``qknorm_gain_init`` (or ``qk_gain_init``)."""

    def __init__(self, variant: Variant, num_heads: int, head_dim: int, *, seq_len: int | None = None,
                 qk_gain_init: float | None = None, eps: float = 1e-6):
        super().__init__(variant, num_heads, head_dim, eps=eps)
        g0 = qk_gain_init if qk_gain_init is not None else qknorm_gain_init(seq_len, head_dim)
        self.gain = nn.Parameter(torch.full((self.gains(num_heads),), float(g0)))

    @staticmethod
    def gains(num_heads: int) -> int:
        return 1

    def logit_gain(self, like: Tensor) -> Tensor:
        return _per_head(self.gain, like)


class HeadGain(LayerGain):
    """g_h · q̂·k̂: one learnable gain per head."""

    @staticmethod
    def gains(num_heads: int) -> int:
        return num_heads


class DimScale(QKFold):
    """(c_q⊙q̂)·(c_k⊙k̂) with learnable c_q, c_k ∈ R^d, started at d^(1/4) so the logit starts at sqrt(d)·cos.
    Computed as q̂·((c_q⊙c_k)⊙k̂): the same logits and gradients, one pass over k instead of one over each."""

    def __init__(self, variant: Variant, num_heads: int, head_dim: int, *, seq_len: int | None = None,
                 qk_gain_init: float | None = None, eps: float = 1e-6):
        super().__init__(variant, num_heads, head_dim, eps=eps)
        self.q_scale = nn.Parameter(torch.full((head_dim,), head_dim**0.25))
        self.k_scale = nn.Parameter(torch.full((head_dim,), head_dim**0.25))

    def rescale(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        return q, k * (self.q_scale * self.k_scale)


@dataclass(frozen=True)
class Variant:
    name: str
    norm_q: bool
    norm_k: bool
    scaled: bool  # divide the logit by sqrt(head_dim)
    elliptical: bool = False  # q weighted by m from the previous layer's values
    fold: type[QKFold] = QKFold  # owns the learnable scales, if any

    @property
    def learnable(self) -> bool:
        return self.fold is not QKFold

    def make_fold(self, num_heads: int, head_dim: int, **kwargs) -> QKFold:
        return self.fold(self, num_heads, head_dim, **kwargs)


VARIANTS: dict[str, Variant] = {
    v.name: v
    for v in (
        Variant("standard", norm_q=False, norm_k=False, scaled=True),
        Variant("quest", norm_q=False, norm_k=True, scaled=False),
        Variant("qnorm", norm_q=True, norm_k=False, scaled=False),
        Variant("qknorm", norm_q=True, norm_k=True, scaled=False, fold=LayerGain),
        Variant("qknorm_hs", norm_q=True, norm_k=True, scaled=False, fold=HeadGain),
        Variant("qknorm_ds", norm_q=True, norm_k=True, scaled=False, fold=DimScale),
        Variant("elliptical", norm_q=False, norm_k=False, scaled=True, elliptical=True),
        Variant("elliptical_quest", norm_q=False, norm_k=True, scaled=False, elliptical=True),
    )
}


class ZeroQuery(QKFold):
    """Every logit 0: each query takes the plain mean of the values of the keys it may see (padding and
    causality still apply). The architecture and its parameters stay; what attention computes from
    content goes."""

    def rescale(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        return torch.zeros_like(q), k


# Ablations run like variants (``attention=uniform``) but are not compared with them: ``variants: all`` in
# a sweep leaves them out, and ``quest aggregate`` reports them beside standard without ranking them.
ABLATIONS: dict[str, Variant] = {"uniform": Variant("uniform", norm_q=False, norm_k=False, scaled=True, fold=ZeroQuery)}


def get_variant(variant: str | Variant) -> Variant:
    if isinstance(variant, Variant):
        return variant
    spec = VARIANTS.get(variant) or ABLATIONS.get(variant)
    if spec is None:
        raise ValueError(f"unknown attention variant {variant!r}; choose from {', '.join([*VARIANTS, *ABLATIONS])}")
    return spec


def fold_qk(q: Tensor, k: Tensor, variant: str | Variant, *, fold: QKFold | None = None,
            metric: Tensor | None = None, eps: float = 1e-6) -> tuple[Tensor, Tensor, float]:
    """(q, k, scale) such that SDPA with that scale gives the variant's logits. A variant with
    learnable scales needs its ``fold`` module (``get_variant(name).make_fold(heads, head_dim)``)."""
    spec = get_variant(variant)
    if fold is None:
        if spec.learnable:
            raise ValueError(f"variant {spec.name!r} has learnable scales: pass fold=get_variant({spec.name!r})"
                             ".make_fold(num_heads, head_dim), or use MultiheadAttention")
        fold = _stateless_fold(spec, eps)
    return fold(q, k, metric)


@functools.cache
def _stateless_fold(spec: Variant, eps: float) -> QKFold:
    """The fold of a variant without learnable scales, built once: a module per call would cost more than
    the normalisation it applies at short sequences."""
    return QKFold(spec, 0, 0, eps=eps)


@dataclass
class AttentionState:
    """What each attention layer of a stack leaves for the next: its values ([B, H, N, D] dense,
    [N, H, D] on edges, detached), from which elliptical variants compute their metric. A stack makes
    one per forward pass and hands it to every layer."""

    values: Tensor | None = field(default=None, repr=False)

    def exchange(self, values: Tensor) -> Tensor | None:
        """The previous layer's values when they match this layer's shape; stores this layer's."""
        previous = self.values if self.values is not None and self.values.shape == values.shape else None
        self.values = values.detach()
        return previous


class KVCache:
    """One attention layer's keys and values from earlier forward passes, for causal decoding a chunk at a
    time (a prompt, then one token per step): each pass gives the layer only its new tokens. Unlike the
    ``AttentionState`` of one pass, it lives as long as the sequence being decoded; a stack holds one per
    layer (``common.blocks.Encoder.new_cache``).

    Keys are stored folded: QUEST normalises a key once, as it enters, and a learnable key scale
    (qknorm_ds) is applied then too, which equals refolding every key at every step because the scales
    are fixed at inference. Elliptical variants weight a query by the mean of |v^l − v^{l−1}| over its
    prefix (``elliptical_metric(..., causal=True)``), so the running sum of that difference is all the
    past they need."""

    def __init__(self) -> None:
        self.keys: Tensor | None = None  # folded, [B, H, past, D]
        self.values: Tensor | None = None
        self.delta_sum: Tensor | None = None  # elliptical only: sum over the past of |v^l − v^{l−1}|, [B, H, 1, D]

    def __len__(self) -> int:
        return 0 if self.keys is None else self.keys.shape[-2]

    @torch.no_grad()
    def metric(self, values: Tensor, prev_values: Tensor, eps: float = 1e-6) -> Tensor:
        """The causal elliptical metric of the new tokens [B, H, T, D]; call it before ``append``."""
        sums = (values - prev_values).abs().cumsum(-2)
        if self.delta_sum is not None:
            sums = sums + self.delta_sum
        self.delta_sum = sums[..., -1:, :]
        seen = torch.arange(len(self) + 1, len(self) + values.shape[-2] + 1, device=sums.device, dtype=sums.dtype)
        return _unit_max(sums / seen[:, None], eps)

    def append(self, keys: Tensor, values: Tensor) -> tuple[Tensor, Tensor]:
        """Adds the new tokens' folded keys and values; returns every key and value so far."""
        self.keys = keys if self.keys is None else torch.cat([self.keys, keys], dim=-2)
        self.values = values if self.values is None else torch.cat([self.values, values], dim=-2)
        return self.keys, self.values


def causal_mask(q_len: int, k_len: int, device: torch.device) -> Tensor:
    """Boolean [q_len, k_len], True = may attend; the last query sees every key (KV-cache aligned)."""
    return torch.ones(q_len, k_len, dtype=torch.bool, device=device).tril(k_len - q_len)


def merge_masks(
    key_padding_mask: Tensor | None,
    attn_bias: Tensor | None,
    causal: bool,
    q_len: int,
    k_len: int,
    dtype: torch.dtype,
    device: torch.device | None = None,
) -> tuple[Tensor | None, Tensor | None]:
    """One SDPA mask from padding (True = pad), additive bias and causality, plus the samples that
    have no key at all. Such samples would give all -inf rows (NaN), so they are left unmasked here
    and their output is zeroed by the caller. Causality alone gives no mask when queries and keys are
    the same tokens: SDPA's ``is_causal`` fast path handles it. With fewer queries than keys (the new
    tokens of a cached step) the triangle is written out, since ``is_causal`` would align it top-left."""
    mask, empty = None, None
    if key_padding_mask is not None:
        empty = key_padding_mask.all(-1)
        mask = ~(key_padding_mask & ~empty[:, None])[:, None, None, :]
    if causal and (mask is not None or attn_bias is not None or q_len != k_len):
        tri = causal_mask(q_len, k_len, device if device is not None else (attn_bias if mask is None else mask).device)
        mask = tri if mask is None else mask & tri
    if attn_bias is not None:
        bias = attn_bias.to(dtype)
        mask = bias if mask is None else torch.where(mask, bias, float("-inf"))
    return mask, empty


def explicit_mask(key_padding_mask: Tensor | None, attn_bias: Tensor | None, causal: bool, q_len: int,
                  k_len: int, dtype: torch.dtype, device: torch.device) -> Tensor | None:
    """``merge_masks`` with causality always written out, for code that forms the logits itself."""
    mask, _ = merge_masks(key_padding_mask, attn_bias, causal, q_len, k_len, dtype, device)
    if mask is None and causal:
        mask = causal_mask(q_len, k_len, device)
    return mask


def attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    variant: str | Variant = "quest",
    *,
    key_padding_mask: Tensor | None = None,
    attn_bias: Tensor | None = None,
    causal: bool = False,
    dropout_p: float = 0.0,
    fold: QKFold | None = None,
    metric: Tensor | None = None,
    eps: float = 1e-6,
) -> Tensor:
    """Attention of one variant on [batch, heads, tokens, head_dim] tensors.

    ``key_padding_mask`` is boolean [batch, k_tokens], True = padding; ``attn_bias`` is additive and
    broadcasts to [batch, heads, q_tokens, k_tokens]. Samples whose keys are all padding give zeros.
    """
    qf, kf, scale = fold_qk(q, k, variant, fold=fold, metric=metric, eps=eps)
    return attend_folded(qf, kf, v, scale, key_padding_mask=key_padding_mask, attn_bias=attn_bias, causal=causal,
                         dropout_p=dropout_p)


def attend_folded(
    qf: Tensor,
    kf: Tensor,
    v: Tensor,
    scale: float,
    *,
    key_padding_mask: Tensor | None = None,
    attn_bias: Tensor | None = None,
    causal: bool = False,
    dropout_p: float = 0.0,
    probe: probes.Probe | None = None,
    raw_qk: tuple[Tensor, Tensor] | None = None,
) -> Tensor:
    """SDPA on (q, k) already folded by a ``QKFold``; an enabled ``probe`` records its statistics, with
    the norms taken from ``raw_qk`` (q, k before folding)."""
    q_len, k_len = qf.shape[-2], kf.shape[-2]
    causal = causal and q_len > 1  # a single query (one cached decoding step) may see every key
    mask, empty = merge_masks(key_padding_mask, attn_bias, causal, q_len, k_len, qf.dtype, qf.device)
    if probe is not None and probe.enabled:
        probe_mask = mask if mask is not None or not causal else causal_mask(q_len, k_len, qf.device)
        probe.record_dense(*(raw_qk or (qf, kf)), qf, kf, scale, probe_mask, key_padding_mask)
    out = F.scaled_dot_product_attention(
        qf, kf, v, attn_mask=mask, dropout_p=dropout_p, is_causal=causal and mask is None, scale=scale
    )
    if empty is not None:
        out = out.masked_fill(empty[:, None, None, None], 0.0)
    return out


@torch.no_grad()
def elliptical_metric(values: Tensor, prev_values: Tensor, key_padding_mask: Tensor | None = None, eps: float = 1e-6,
                      causal: bool = False) -> Tensor:
    """Elliptical attention's coordinate weights (Nielsen et al. 2024): m_d = mean_n |v^l_nd − v^{l−1}_nd|
    over the valid tokens of each sample and head, divided by max_d m_d. [B, H, N, D] → [B, H, 1, D].
    Under ``causal`` the mean runs over each query's prefix only ([B, H, N, D]): a mean over all tokens
    would let the future steer every past query."""
    delta = (values - prev_values).abs()
    if causal:
        keep = torch.ones_like(delta[..., :1]) if key_padding_mask is None else (~key_padding_mask)[:, None, :, None].to(delta.dtype)
        return _unit_max((delta * keep).cumsum(-2) / keep.cumsum(-2).clamp_min(1.0), eps)
    if key_padding_mask is None:
        m = delta.mean(-2)
    else:
        keep = (~key_padding_mask)[:, None, :, None].to(delta.dtype)
        m = (delta * keep).sum(-2) / keep.sum(-2).clamp_min(1.0)
    return _unit_max(m, eps).unsqueeze(-2)


@torch.no_grad()
def edge_elliptical_metric(values: Tensor, prev_values: Tensor, batch: Tensor | None, eps: float = 1e-6) -> Tensor:
    """The elliptical weights per graph for node-major values [N, H, D], gathered back per node."""
    from torch_geometric.utils import scatter

    delta = (values - prev_values).abs()
    if batch is None:
        return _unit_max(delta.mean(0, keepdim=True), eps)
    m = scatter(delta, batch, dim=0, reduce="mean")
    return _unit_max(m, eps)[batch]


def _unit_max(m: Tensor, eps: float) -> Tensor:
    # Values that did not move at all carry no information: fall back to the plain metric (m = 1).
    peak = m.amax(-1, keepdim=True)
    return torch.where(peak > eps, m / peak.clamp_min(eps), torch.ones_like(m))


class MultiheadAttention(nn.Module):
    """Multi-head attention with a selectable variant; batch-first drop-in for
    ``torch.nn.MultiheadAttention`` (same parameter names, so its state dict loads as is).

    Inside a stack, pass the stack's ``AttentionState`` as ``state``: elliptical variants read the
    previous layer's values from it, and every layer leaves its own. For causal decoding, pass the
    layer's ``KVCache`` as ``cache`` and only the new tokens as the query (self-attention, no padding);
    probes stay off for cached calls.
    """

    def __init__(self, dim: int, num_heads: int, variant: str = "quest", *, dropout: float = 0.0,
                 bias: bool = True, batch_first: bool = True, seq_len: int | None = None,
                 qk_gain_init: float | None = None, eps: float = 1e-6):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"dim {dim} is not divisible by num_heads {num_heads}")
        self.embed_dim, self.num_heads, self.head_dim = dim, num_heads, dim // num_heads
        self.dropout, self.batch_first = dropout, batch_first
        self.in_proj_weight = nn.Parameter(torch.empty(3 * dim, dim))
        self.in_proj_bias = nn.Parameter(torch.zeros(3 * dim)) if bias else None
        self.out_proj = nn.Linear(dim, dim, bias=bias)
        self.qk = get_variant(variant).make_fold(num_heads, self.head_dim, seq_len=seq_len, qk_gain_init=qk_gain_init,
                                                 eps=eps)
        self.probe = probes.Probe()
        self.reset_parameters()

    @property
    def variant(self) -> Variant:
        return self.qk.variant

    def reset_parameters(self) -> None:
        nn.init.xavier_uniform_(self.in_proj_weight)
        if self.in_proj_bias is not None:
            nn.init.zeros_(self.in_proj_bias)
            nn.init.zeros_(self.out_proj.bias)

    def _project(self, query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        if key is query and value is query:  # self-attention: one matmul
            q, k, v = F.linear(query, self.in_proj_weight, self.in_proj_bias).chunk(3, dim=-1)
        else:
            w = self.in_proj_weight.chunk(3)
            b = self.in_proj_bias.chunk(3) if self.in_proj_bias is not None else (None,) * 3
            q, k, v = (F.linear(x, wi, bi) for x, wi, bi in zip((query, key, value), w, b))
        return tuple(x.unflatten(-1, (self.num_heads, self.head_dim)).transpose(1, 2) for x in (q, k, v))

    def forward(
        self,
        query: Tensor,
        key: Tensor | None = None,
        value: Tensor | None = None,
        key_padding_mask: Tensor | None = None,
        need_weights: bool = False,
        attn_mask: Tensor | None = None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
        *,
        attn_bias: Tensor | None = None,
        state: AttentionState | None = None,
        cache: KVCache | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """Returns ``(output, weights)`` like torch (weights None unless ``need_weights``)."""
        if cache is not None and (not is_causal or key_padding_mask is not None):
            raise ValueError("a KV cache serves causal self-attention without padding: pass is_causal=True")
        key = query if key is None else key
        value = key if value is None else value
        if not self.batch_first:
            query, key, value = (x.transpose(0, 1) for x in (query, key, value))
        q, k, v = self._project(query, key, value)

        bias = _as_bias(attn_mask, q.shape[0], self.num_heads, q.dtype)
        if key_padding_mask is not None and key_padding_mask.is_floating_point():  # additive, torch style
            bias = _add(bias, key_padding_mask[:, None, None, :].to(q.dtype))
            key_padding_mask = None
        bias = _add(bias, attn_bias)

        prev = state.exchange(v) if state is not None else None
        metric = None
        if self.variant.elliptical and prev is not None:
            metric = (cache.metric(v, prev, self.qk.eps) if cache is not None
                      else elliptical_metric(v, prev, key_padding_mask, self.qk.eps, causal=is_causal))
        qf, kf, scale = self.qk(q, k, metric)
        if cache is not None:
            kf, v = cache.append(kf, v)
        out = attend_folded(qf, kf, v, scale, key_padding_mask=key_padding_mask, attn_bias=bias, causal=is_causal,
                            dropout_p=self.dropout if self.training else 0.0,
                            probe=self.probe if cache is None else None, raw_qk=(q, k))
        out = self.out_proj(out.transpose(1, 2).flatten(2))
        if not self.batch_first:
            out = out.transpose(0, 1)

        weights = None
        if need_weights:  # explicit, so only on request
            mask = explicit_mask(key_padding_mask, bias, is_causal, qf.shape[-2], kf.shape[-2], q.dtype, q.device)
            weights = probes.explicit_attention(qf, kf, scale, mask)[1]
            weights = weights.mean(1) if average_attn_weights else weights
        return out, weights


def _as_bias(attn_mask: Tensor | None, batch: int, heads: int, dtype: torch.dtype) -> Tensor | None:
    """torch's attn_mask ([L, S] or [B·H, L, S]; bool True = blocked, or additive) as an additive bias."""
    if attn_mask is None:
        return None
    if attn_mask.dtype == torch.bool:
        attn_mask = torch.zeros(attn_mask.shape, dtype=dtype, device=attn_mask.device).masked_fill(attn_mask, float("-inf"))
    if attn_mask.dim() == 3:
        attn_mask = attn_mask.view(batch, heads, *attn_mask.shape[-2:])
    return attn_mask.to(dtype)


def _add(a: Tensor | None, b: Tensor | None) -> Tensor | None:
    return b if a is None else a if b is None else a + b


class EdgeMultiheadAttention(nn.Module):
    """Sparse attention over graph edges: each target node i attends over its incoming edges (i ← j),
    softmax per target (PyG's scatter softmax). Same variants, parameters and ``state`` as the dense
    module; on a fully connected graph the two agree."""

    def __init__(self, dim: int, num_heads: int, variant: str = "quest", *, dropout: float = 0.0,
                 bias: bool = True, seq_len: int | None = None, qk_gain_init: float | None = None, eps: float = 1e-6):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"dim {dim} is not divisible by num_heads {num_heads}")
        self.embed_dim, self.num_heads, self.head_dim = dim, num_heads, dim // num_heads
        self.dropout = dropout
        self.in_proj = nn.Linear(dim, 3 * dim, bias=bias)
        self.out_proj = nn.Linear(dim, dim, bias=bias)
        self.qk = get_variant(variant).make_fold(num_heads, self.head_dim, seq_len=seq_len, qk_gain_init=qk_gain_init,
                                                 eps=eps)
        self.probe = probes.Probe()

    @property
    def variant(self) -> Variant:
        return self.qk.variant

    def forward(self, x: Tensor, edge_index: Tensor, *, batch: Tensor | None = None,
                edge_bias: Tensor | None = None, state: AttentionState | None = None) -> Tensor:
        """x [N, dim], edge_index [2, E] (row 0 = source j, row 1 = target i), batch [N] graph ids,
        edge_bias [E, H] additive. Returns the output [N, dim]."""
        from torch_geometric.utils import scatter, softmax

        q, k, v = self.in_proj(x).unflatten(-1, (3, self.num_heads, self.head_dim)).unbind(1)
        prev = state.exchange(v) if state is not None else None
        metric = None
        if self.variant.elliptical and prev is not None:
            metric = edge_elliptical_metric(v, prev, batch, self.qk.eps)
        qf, kf, scale = self.qk(q, k, metric)
        src, dst = edge_index
        logits = (qf[dst] * kf[src]).sum(-1) * scale  # [E, H]
        scores = logits if edge_bias is None else logits + edge_bias
        alpha = softmax(scores, dst, num_nodes=x.shape[0])
        if self.probe.enabled:
            self.probe.record_edges(q, k, logits, alpha, dst, x.shape[0])
        alpha = F.dropout(alpha, self.dropout, self.training)
        out = scatter(alpha.unsqueeze(-1) * v[src], dst, dim=0, dim_size=x.shape[0], reduce="sum")
        return self.out_proj(out.flatten(1))
