"""The attention layers: ``MultiheadAttention`` (dense, a batch-first drop-in for torch's) and
``EdgeMultiheadAttention`` (sparse, over a graph's edges), each owning its projections and its variant's fold;
``attention_layer``, the factory a model builds them with."""
from __future__ import annotations

import difflib
import inspect
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from common import probes
from common.attention.elliptical import edge_elliptical_metric, elliptical_metric
from common.attention.folds import make_fold
from common.attention.functional import attend_folded, explicit_mask
from common.attention.state import AttentionState, KVCache
from common.attention.variants import Variant, get_variant


class MultiheadAttention(nn.Module):
    """Multi-head attention with a selectable variant; batch-first drop-in for
    ``torch.nn.MultiheadAttention`` (same parameter names, so its state dict loads as is).

    Inside a stack, pass the stack's ``AttentionState`` as ``state``: elliptical variants read the previous layer's
    values from it, and every layer leaves its own. For causal decoding, pass the layer's ``KVCache`` as ``cache`` and
    only the new tokens as the query (self-attention, no padding); probes stay off for cached calls.

    Args:
        dim: Embedding size, split evenly over the heads.
        num_heads: Number of heads; head_dim = dim // num_heads.
        variant: A variant's or ablation's name (``VARIANTS``, ``ABLATIONS``), or its ``Variant``.
        dropout: Dropout on the attention probabilities, in training only.
        bias: Whether the input and output projections have biases.
        batch_first: Whether inputs and output are ``(batch, length, dim)``; False: ``(length, batch, dim)``.
        seq_len: Typical sequence length, from which a QK-norm gain starts (``qknorm_gain_init``); None: sqrt(head_dim).
        qk_gain_init: Initial QK-norm gain, in place of the one from ``seq_len``.
        eps: Floor on the L2 norms of q and k; also the elliptical metric's ``eps``.
        l2norm_kernel: How rows are normalised on CPU: ``"fused"`` or ``"formula"`` (``l2_normalize``).

    Raises:
        ValueError: If ``dim`` is not divisible by ``num_heads``, or the variant or ``l2norm_kernel`` is unknown.
    """

    def __init__(self, dim: int, num_heads: int, variant: str | Variant = "quest", *, dropout: float = 0.0,
                 bias: bool = True, batch_first: bool = True, seq_len: int | None = None,
                 qk_gain_init: float | None = None, eps: float = 1e-6, l2norm_kernel: str = "fused"):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"dim {dim} is not divisible by num_heads {num_heads}")
        self.embed_dim, self.num_heads, self.head_dim = dim, num_heads, dim // num_heads
        self.dropout, self.batch_first = dropout, batch_first
        self.in_proj_weight = nn.Parameter(torch.empty(3 * dim, dim))
        self.in_proj_bias = nn.Parameter(torch.zeros(3 * dim)) if bias else None
        self.out_proj = nn.Linear(dim, dim, bias=bias)
        self.qk = make_fold(variant, num_heads, self.head_dim, seq_len=seq_len, qk_gain_init=qk_gain_init,
                                                 eps=eps, l2norm_kernel=l2norm_kernel)
        self.probe = probes.Probe()
        self.reset_parameters()

    @property
    def variant(self) -> Variant:
        """The layer's ``Variant``, as its fold holds it."""
        return self.qk.variant

    def reset_parameters(self) -> None:
        """Re-initialise as torch's module does: Xavier-uniform ``in_proj_weight``, zero biases."""
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

    def forward(self, query: Tensor, key: Tensor | None = None, value: Tensor | None = None,
                key_padding_mask: Tensor | None = None, need_weights: bool = False, attn_mask: Tensor | None = None,
                average_attn_weights: bool = True, is_causal: bool = False, *, attn_bias: Tensor | None = None,
                state: AttentionState | None = None, cache: KVCache | None = None) -> tuple[Tensor, Tensor | None]:
        """Returns ``(output, weights)`` like torch (weights None unless ``need_weights``).

        Args:
            query: ``(batch, q_len, dim)``, or ``(q_len, batch, dim)`` when not ``batch_first``.
            key: ``(batch, k_len, dim)``, laid out as ``query``. None: ``query`` (self-attention).
            value: ``(batch, k_len, dim)``, laid out as ``query``. None: ``key``.
            key_padding_mask: ``(batch, k_len)``: boolean, True = padding, or additive (float, torch style).
            need_weights: Also return the attention probabilities, formed explicitly (torch's default is True).
            attn_mask: ``(q_len, k_len)`` or ``(batch * heads, q_len, k_len)``, as torch's: True = blocked, or additive.
            average_attn_weights: Average the returned weights over heads.
            is_causal: Apply a causal mask: query i sees keys up to ``i + k_len - q_len``.
            attn_bias: Additive bias broadcasting to ``(batch, heads, q_len, k_len)``, added to ``attn_mask``.
            state: The stack's ``AttentionState``. None: an elliptical variant runs its base variant.
            cache: The layer's ``KVCache``; ``query`` then holds only the new tokens (``k_len`` counts cached ones too).

        Returns:
            Output as ``query``; weights ``(batch, q_len, k_len)``, or ``(batch, heads, q_len, k_len)`` unaveraged.

        Raises:
            ValueError: If ``cache`` is given without ``is_causal`` or with ``key_padding_mask``.
        """
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
    module; on a fully connected graph the two agree. Needs PyG (``torch_geometric``), which ``forward`` imports.

    Arguments and errors as for ``MultiheadAttention``, without ``batch_first``; ``dim`` is the node embedding size.
    """

    def __init__(self, dim: int, num_heads: int, variant: str | Variant = "quest", *, dropout: float = 0.0,
                 bias: bool = True, seq_len: int | None = None, qk_gain_init: float | None = None, eps: float = 1e-6,
                 l2norm_kernel: str = "fused"):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"dim {dim} is not divisible by num_heads {num_heads}")
        self.embed_dim, self.num_heads, self.head_dim = dim, num_heads, dim // num_heads
        self.dropout = dropout
        self.in_proj = nn.Linear(dim, 3 * dim, bias=bias)
        self.out_proj = nn.Linear(dim, dim, bias=bias)
        self.qk = make_fold(variant, num_heads, self.head_dim, seq_len=seq_len, qk_gain_init=qk_gain_init,
                                                 eps=eps, l2norm_kernel=l2norm_kernel)
        self.probe = probes.Probe()

    @property
    def variant(self) -> Variant:
        """The layer's ``Variant``, as its fold holds it."""
        return self.qk.variant

    def forward(self, x: Tensor, edge_index: Tensor, *, batch: Tensor | None = None,
                edge_bias: Tensor | None = None, state: AttentionState | None = None) -> Tensor:
        """Attention of each target node over its incoming edges, softmax per target.

        Args:
            x: Node features, ``(nodes, dim)``.
            edge_index: ``(2, edges)``: row 0 the source j, row 1 the target i of each edge i ← j.
            batch: Graph id of each node, ``(nodes,)``, for the per-graph elliptical metric. None: one graph.
            edge_bias: Additive logit bias per edge and head, ``(edges, heads)``.
            state: The stack's ``AttentionState``, as for ``MultiheadAttention.forward``.

        Returns:
            The output, ``(nodes, dim)``.
        """
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


def attention_layer(layer: type[nn.Module] = MultiheadAttention, /, **settings) -> partial:
    """``layer`` with a run's attention ``settings`` (``variant``, ``qk_gain_init``, ``l2norm_kernel``) bound: the
    factory a model builds each of its attention layers with, as ``attn_layer(dim, num_heads, dropout=...,
    seq_len=...)`` (timm's ``attn_layer``). The settings are checked here, so a misspelt key fails once, where the
    factory is made, rather than at the last constructor of a stack.

    Args:
        layer: The attention module class, called as ``layer(dim, num_heads, **keywords)``.
        **settings: Keyword arguments of ``layer`` to bind, other than ``dim`` and ``num_heads``.

    Returns:
        ``functools.partial(layer, **settings)``.

    Raises:
        TypeError: If a setting is not a keyword argument of ``layer`` (the message names the nearest one).
        ValueError: If ``settings["variant"]`` names no variant.
    """
    accepted = [name for name in inspect.signature(layer).parameters if name not in ("self", "dim", "num_heads")]
    if unknown := [name for name in settings if name not in accepted]:
        near = difflib.get_close_matches(unknown[0], accepted, n=1)
        raise TypeError(f"{layer.__name__} takes no attention setting {unknown[0]!r}"
                        + (f"; did you mean {near[0]}?" if near else f"; it takes {', '.join(accepted)}"))
    if "variant" in settings:  # looked up here, once: every layer of the stack is handed the Variant itself
        settings["variant"] = get_variant(settings["variant"])
    return partial(layer, **settings)
