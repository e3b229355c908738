"""Functional attention on [batch, heads, tokens, head_dim] tensors: the masks SDPA gets (padding, additive bias,
causality merged into one), ``attend`` (fold, then SDPA) and ``attend_folded`` (SDPA on an already folded
(q, k), with the stability probe's hook)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from common import probes
from common.attention.folds import QKFold, fold_qk
from common.attention.variants import Variant


def causal_mask(q_len: int, k_len: int, device: torch.device) -> Tensor:
    """Boolean [q_len, k_len], True = may attend; the last query sees every key (KV-cache aligned).

    Args:
        q_len: Number of queries, the last ``q_len`` of the ``k_len`` tokens.
        k_len: Number of keys.
        device: Where the mask is made.

    Returns:
        Boolean ``(q_len, k_len)``: query i may attend keys 0 to ``i + k_len - q_len``.
    """
    return torch.ones(q_len, k_len, dtype=torch.bool, device=device).tril(k_len - q_len)


def merge_masks(key_padding_mask: Tensor | None, attn_bias: Tensor | None, causal: bool, q_len: int, k_len: int,
                dtype: torch.dtype, device: torch.device | None = None) -> tuple[Tensor | None, Tensor | None]:
    """One SDPA mask from padding (True = pad), a bias (additive, or boolean as SDPA takes it) and causality, plus the samples that
    have no key at all. Such samples would give all -inf rows (NaN), so they are left unmasked here
    and their output is zeroed by the caller. Causality alone gives no mask when queries and keys are
    the same tokens: SDPA's ``is_causal`` fast path handles it. With fewer queries than keys (the new
    tokens of a cached step) the triangle is written out, since ``is_causal`` would align it top-left.

    Args:
        key_padding_mask: Boolean ``(batch, k_len)``, True = padding.
        attn_bias: Additive bias, broadcasting to ``(batch, heads, q_len, k_len)``; or a boolean mask (True = attend),
            as SDPA takes it.
        causal: Whether query i may see only keys up to ``i + k_len - q_len``.
        q_len: Number of queries.
        k_len: Number of keys.
        dtype: Floating dtype the bias is cast to (the queries').
        device: Where the causal triangle is made. None: on the padding mask's device, else the bias's.

    Returns:
        ``(mask, empty)``. ``mask`` broadcasts to ``(batch, heads, q_len, k_len)``: boolean (True = attend)
            without a bias or with a boolean one, additive in ``dtype`` (-inf where blocked) with an additive one, or None
            when nothing is masked or
            causality is left to SDPA's ``is_causal``. ``empty`` is boolean ``(batch,)``, True for a sample whose
            every key is padding, or None without ``key_padding_mask``.
    """
    mask, empty = None, None
    if key_padding_mask is not None:
        empty = key_padding_mask.all(-1)
        mask = ~(key_padding_mask & ~empty[:, None])[:, None, None, :]
    if causal and (mask is not None or attn_bias is not None or q_len != k_len):
        tri = causal_mask(q_len, k_len, device if device is not None else (attn_bias if mask is None else mask).device)
        mask = tri if mask is None else mask & tri
    if attn_bias is not None and attn_bias.dtype == torch.bool:
        mask = attn_bias if mask is None else mask & attn_bias
    elif attn_bias is not None:
        bias = attn_bias.to(dtype)
        mask = bias if mask is None else torch.where(mask, bias, float("-inf"))
    return mask, empty


def explicit_mask(key_padding_mask: Tensor | None, attn_bias: Tensor | None, causal: bool, q_len: int,
                  k_len: int, dtype: torch.dtype, device: torch.device) -> Tensor | None:
    """``merge_masks`` with causality always written out, for code that forms the logits itself. Arguments as for
    ``merge_masks``, ``device`` required.

    Returns:
        The mask as ``merge_masks`` gives it; None only without padding, bias and causality.
    """
    mask, _ = merge_masks(key_padding_mask, attn_bias, causal, q_len, k_len, dtype, device)
    if mask is None and causal:
        mask = causal_mask(q_len, k_len, device)
    return mask


def attend(q: Tensor, k: Tensor, v: Tensor, variant: str | Variant = "quest", *, key_padding_mask: Tensor | None = None,
           attn_bias: Tensor | None = None, causal: bool = False, dropout_p: float = 0.0, fold: QKFold | None = None,
           metric: Tensor | None = None, eps: float = 1e-6) -> Tensor:
    """Attention of one variant on [batch, heads, tokens, head_dim] tensors; all-padding samples give zeros.

    Args:
        q: Queries, ``(batch, heads, q_len, head_dim)``.
        k: Keys, ``(batch, heads, k_len, head_dim)``.
        v: Values, ``(batch, heads, k_len, head_dim)``.
        variant: A variant's name or its ``Variant``.
        key_padding_mask: Boolean ``(batch, k_len)``, True = padding.
        attn_bias: Additive bias, broadcasting to ``(batch, heads, q_len, k_len)``.
        causal: Whether query i may see only keys up to ``i + k_len - q_len``; a single query sees every key.
        dropout_p: Dropout on the attention probabilities; pass 0.0 at evaluation.
        fold: The variant's fold module (``make_fold``), needed by learnable variants. None: its stateless fold.
        metric: Elliptical weights m (``elliptical_metric``). None: an elliptical variant runs its base variant.
        eps: Floor on the L2 norms of q and k when ``fold`` is None.

    Returns:
        The attention output, ``(batch, heads, q_len, head_dim)``.

    Raises:
        ValueError: If ``variant`` is unknown, or has learnable scales and ``fold`` is None.
    """
    qf, kf, scale = fold_qk(q, k, variant, fold=fold, metric=metric, eps=eps)
    return attend_folded(qf, kf, v, scale, key_padding_mask=key_padding_mask, attn_bias=attn_bias, causal=causal,
                         dropout_p=dropout_p)


def attend_folded(qf: Tensor, kf: Tensor, v: Tensor, scale: float, *, key_padding_mask: Tensor | None = None,
                  attn_bias: Tensor | None = None, causal: bool = False, dropout_p: float = 0.0,
                  probe: probes.Probe | None = None, raw_qk: tuple[Tensor, Tensor] | None = None,
                  enable_gqa: bool = False) -> Tensor:
    """SDPA on (q, k) already folded by a ``QKFold``; ``v`` and the mask and dropout arguments are as for ``attend``.

    Args:
        qf: Folded queries, ``(batch, heads, q_len, head_dim)``.
        kf: Folded keys, ``(batch, heads, k_len, head_dim)``.
        scale: The scale the fold returned, handed to SDPA.
        probe: The layer's stability probe; it records only when enabled. None: nothing is recorded.
        raw_qk: ``(q, k)`` before folding, for the probe's norms. None: the folded ones stand in.
        enable_gqa: Grouped-query attention: k and v have fewer heads, each serving its group of query heads (SDPA's
            ``enable_gqa``).

    Returns:
        The attention output, ``(batch, heads, q_len, head_dim)``; zeros for a sample whose every key is padding.
    """
    q_len, k_len = qf.shape[-2], kf.shape[-2]
    causal = causal and q_len > 1  # a single query (one cached decoding step) may see every key
    mask, empty = merge_masks(key_padding_mask, attn_bias, causal, q_len, k_len, qf.dtype, qf.device)
    if probe is not None and probe.enabled:
        probe_mask = mask if mask is not None or not causal else causal_mask(q_len, k_len, qf.device)
        q, k = raw_qk or (qf, kf)
        groups = qf.shape[-3] // kf.shape[-3]  # the probe writes the logits out, every query head's
        probe.record_dense(q, k.repeat_interleave(groups, -3), qf, kf.repeat_interleave(groups, -3), scale, probe_mask,
                           key_padding_mask)
    out = F.scaled_dot_product_attention(qf, kf, v, attn_mask=mask, dropout_p=dropout_p,
                                         is_causal=causal and mask is None, scale=scale, enable_gqa=enable_gqa)
    if empty is not None:
        out = out.masked_fill(empty[:, None, None, None], 0.0)
    return out
