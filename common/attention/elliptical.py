"""Elliptical attention's coordinate weights m (Nielsen et al. 2024), from how far each value coordinate moved
between the previous layer and this one; ``QKFold`` multiplies q by them."""
from __future__ import annotations

import torch
from torch import Tensor


@torch.no_grad()
def elliptical_metric(values: Tensor, prev_values: Tensor, key_padding_mask: Tensor | None = None, eps: float = 1e-6,
                      causal: bool = False) -> Tensor:
    """Elliptical attention's coordinate weights (Nielsen et al. 2024): m_d = mean_n |v^l_nd − v^{l−1}_nd|
    over the valid tokens of each sample and head, divided by max_d m_d; computed without gradients.

    Args:
        values: This layer's values, ``(batch, heads, length, head_dim)``.
        prev_values: The previous layer's values, same shape.
        key_padding_mask: Boolean ``(batch, length)``, True = padding; padded tokens are left out of the mean.
        eps: A row whose largest weight is at most ``eps`` (values that did not move) becomes all ones (plain metric).
        causal: Mean over each query's prefix only: a mean over all tokens would let the future steer every past query.

    Returns:
        The weights in [0, 1], the largest of each head_dim row 1: ``(batch, heads, 1, head_dim)``, or
            ``(batch, heads, length, head_dim)`` under ``causal``.
    """
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
    """The elliptical weights per graph, gathered back per node (no gradients); needs PyG, imported on call.

    Args:
        values: This layer's values, ``(nodes, heads, head_dim)``.
        prev_values: The previous layer's values, same shape.
        batch: Graph id of each node, ``(nodes,)``. None: all nodes form one graph.
        eps: As for ``elliptical_metric``.

    Returns:
        The weights of each node's graph, ``(nodes, heads, head_dim)``; ``(1, heads, head_dim)`` without ``batch``.
    """
    from torch_geometric.utils import scatter

    delta = (values - prev_values).abs()
    if batch is None:
        return _unit_max(delta.mean(0, keepdim=True), eps)
    # One row per node bounds the graph count without reading it off the device (index.max().item(), a sync and a
    # graph break under torch.compile); the rows no graph id reaches stay 0 and are never gathered.
    m = scatter(delta, batch, dim=0, dim_size=delta.shape[0], reduce="mean")
    return _unit_max(m, eps)[batch]


def _unit_max(m: Tensor, eps: float) -> Tensor:
    # Values that did not move at all carry no information: fall back to the plain metric (m = 1).
    peak = m.amax(-1, keepdim=True)
    return torch.where(peak > eps, m / peak.clamp_min(eps), torch.ones_like(m))
