"""Pre-norm Transformer encoder on ``common.attention``, its attention layers made by one factory (``attn_layer``:
``common.attention.attention_layer``, the run's variant and settings bound and checked once; timm's
``Block(attn_layer=...)``): one ``AttentionState`` per forward pass carries what each layer leaves for the next.
Stochastic depth and the truncated normal are timm's own (``timm.layers``); ``common.attention`` stays torch only."""
from __future__ import annotations

from collections.abc import Callable

import torch
from timm.layers import DropPath, LayerScale, trunc_normal_
from torch import Tensor, nn

from common.attention import AttentionState, KVCache, MultiheadAttention

AttentionFactory = Callable[..., nn.Module]  # (dim, num_heads, *, dropout, seq_len) -> an attention layer


def trunc_normal_init(model: nn.Module, std: float = 0.02) -> None:
    """timm's ViT initialisation (DeiT, DeiT-III) of ``model``: Linear weights and the fused q/k/v projection by timm's
    ``trunc_normal_`` (bounds ±2, so in effect untruncated at std 0.02), their biases zero, LayerNorms reset. Convolutions,
    embeddings, LayerScale and the attention variants' learnable scales keep their own initialisation, as in timm."""
    for module in model.modules():
        if isinstance(module, nn.Linear):
            trunc_normal_(module.weight, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, MultiheadAttention):  # its q/k/v projection is one parameter, not a Linear
            trunc_normal_(module.in_proj_weight, std=std)
            if module.in_proj_bias is not None:
                nn.init.zeros_(module.in_proj_bias)
        elif isinstance(module, nn.LayerNorm):
            module.reset_parameters()


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int, dropout: float = 0.0, activation: type[nn.Module] = nn.GELU):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(dim, hidden), activation(), nn.Dropout(dropout),
                                 nn.Linear(hidden, dim), nn.Dropout(dropout))

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)


class EncoderLayer(nn.Module):
    """x + attn(norm(x)), then x + mlp(norm(x)). ``seq_len``: the typical sequence length, from which qknorm's gain
    starts. ``norm_eps``: the LayerNorms' epsilon (PyTorch's 1e-5 by default; timm's ViT and DeiT use 1e-6).
    ``drop_path``: the rate of timm's ``DropPath`` (stochastic depth, Huang et al. 2016: a sample's whole residual
    branch dropped)."""

    def __init__(self, dim: int, num_heads: int, *, attn_layer: AttentionFactory = MultiheadAttention,
                 seq_len: int | None = None, mlp_ratio: float = 4.0, dropout: float = 0.0, attn_dropout: float = 0.0,
                 layer_scale: float | None = None, drop_path: float = 0.0, norm_eps: float = 1e-5):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=norm_eps)
        self.attn = attn_layer(dim, num_heads, dropout=attn_dropout, seq_len=seq_len)
        self.drop = nn.Dropout(dropout)
        self.norm2 = nn.LayerNorm(dim, eps=norm_eps)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), dropout)
        self.ls1 = LayerScale(dim, layer_scale) if layer_scale else nn.Identity()
        self.ls2 = LayerScale(dim, layer_scale) if layer_scale else nn.Identity()
        self.drop_path = DropPath(drop_path)

    def forward(self, x: Tensor, key_padding_mask: Tensor | None = None, attn_bias: Tensor | None = None, *,
                is_causal: bool = False, state: AttentionState | None = None, cache: KVCache | None = None) -> Tensor:
        h = self.norm1(x)
        h, _ = self.attn(h, h, h, key_padding_mask=key_padding_mask, attn_bias=attn_bias, is_causal=is_causal,
                         state=state, cache=cache)
        x = x + self.drop_path(self.drop(self.ls1(h)))
        return x + self.drop_path(self.ls2(self.mlp(self.norm2(x))))


class Encoder(nn.Module):
    """A stack of pre-norm layers with a final LayerNorm. ``attn_bias`` is shared by every layer;
    ``drop_path`` rises linearly from 0 at the first layer to its value at the last (DeiT); ``norm_eps`` is
    every LayerNorm's epsilon, the final one's too. ``layer``: the rest of ``EncoderLayer``'s settings
    (``attn_layer``, ``seq_len``, ...)."""

    def __init__(self, dim: int, depth: int, num_heads: int, *, final_norm: bool = True, drop_path: float = 0.0,
                 norm_eps: float = 1e-5, **layer):
        super().__init__()
        rates = torch.linspace(0, drop_path, depth).tolist() if depth > 1 else [drop_path]
        self.layers = nn.ModuleList(EncoderLayer(dim, num_heads, drop_path=r, norm_eps=norm_eps, **layer)
                                    for r in rates)
        self.norm = nn.LayerNorm(dim, eps=norm_eps) if final_norm else nn.Identity()

    def new_cache(self) -> list[KVCache]:
        """An empty ``KVCache`` per layer, for ``forward(..., is_causal=True, cache=...)``."""
        return [KVCache() for _ in self.layers]

    def forward(self, x: Tensor, key_padding_mask: Tensor | None = None, attn_bias: Tensor | None = None, *,
                is_causal: bool = False, cache: list[KVCache] | None = None) -> Tensor:
        """With ``cache`` (from ``new_cache``), ``x`` holds only the tokens after those already cached, and
        the output equals the last rows of a causal pass over the whole sequence."""
        state = AttentionState()
        caches = cache if cache is not None else [None] * len(self.layers)
        for layer, layer_cache in zip(self.layers, caches, strict=True):
            x = layer(x, key_padding_mask, attn_bias, is_causal=is_causal, state=state, cache=layer_cache)
        return self.norm(x)
