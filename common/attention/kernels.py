"""Row L2 normalisation, the one pass QUEST and the QK-norm family add to attention, in two forms: the formula as a
hand-written autograd function (``_L2Normalize``, everywhere) and PyTorch's fused weight-norm kernels
(``_FusedRowNormalize``, on CPU). ``l2_normalize`` picks one. Why both exist, and what they were measured at: docs/attention.md."""
from __future__ import annotations

import torch
from torch import Tensor


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


class _FusedRowNormalize:
    """The same map on CPU, through PyTorch's fused weight-norm kernels (``torch._weight_norm_interface``, with ``dim=0``
    on x's rows): it takes a row's norm and rescales it in one sweep, and its backward (autograd's own, in C++, so no
    Python runs in the backward pass) another, where the formula above needs a reduction and broadcasts that are slow
    on rows of 16 to 64 numbers. The kernels have no eps: a row at or below it would come out as 0/0, so where a row
    is (padding) the kernels run again with such rows set to ones and their output taken from the formula instead, on
    a check that costs one comparison per row. That check is a data-dependent branch, which is why ``l2_normalize``
    keeps this path off GPUs (it would wait for the device), ``torch.compile`` and ``torch.func`` transforms (vmap),
    where the formula runs instead."""

    @staticmethod
    def apply(x: Tensor, gain: Tensor | None, eps: float) -> Tensor:
        # Rows in memory order (x is often a head-split view of a projection) so that [rows, d] is a view, or
        # at most one copy, and every per-row factor lines up with its row.
        order = sorted(range(x.dim() - 1), key=lambda i: -x.stride(i)) + [x.dim() - 1]
        ordered = x.permute(order)
        rows = ordered.reshape(-1, x.shape[-1])
        if gain is None:
            gains = torch.ones(rows.shape[0], 1, dtype=x.dtype, device=x.device)
        else:
            gains = torch.broadcast_to(gain, (*x.shape[:-1], 1)).permute(order).reshape(-1, 1).to(x.dtype).contiguous()
        y, norm = torch._weight_norm_interface(rows, gains, 0)
        small = norm <= eps
        if small.any():  # below eps the map is linear, x · g / eps; the kernels see ones there, whose 0/0 gradient
            # would otherwise reach x through torch.where as NaN
            kept = torch._weight_norm_interface(torch.where(small, 1.0, rows), gains, 0)[0]
            y = torch.where(small, rows * (gains / eps), kept)
        return y.view(ordered.shape).permute(_inverse(order))


def _inverse(order: list[int]) -> list[int]:
    return sorted(range(len(order)), key=order.__getitem__)


_FUSED_DTYPES = (torch.float32, torch.float64, torch.bfloat16)
KERNELS = ("fused", "formula")  # how the rows are normalised on CPU (the attention setting l2norm_kernel)


def l2_normalize(x: Tensor, eps: float = 1e-6, gain: Tensor | None = None, *, fused: bool = True) -> Tensor:
    """Normalise the last dimension, times ``gain`` if given; all-zero (padding) vectors stay zero instead of
    NaN. The fused kernels and the formula agree to float rounding, not to the bit (docs/attention.md).

    Args:
        x: Vectors along the last dimension, ``(..., dim)``.
        eps: Floor on each row's norm: a row whose norm is at most ``eps`` is divided by ``eps`` instead.
        gain: Factor on each normalised row, broadcasting against the row norms ``(..., 1)``; differentiable.
        fused: Use PyTorch's fused kernels where they run: CPU, outside ``torch.compile`` and ``torch.func`` transforms.

    Returns:
        ``gain · x / max(‖x‖, eps)``, same shape and dtype as ``x``.
    """
    if (fused and x.device.type == "cpu" and x.dtype in _FUSED_DTYPES and x.numel()
            and not torch.compiler.is_compiling() and not torch._C._are_functorch_transforms_active()):
        return _FusedRowNormalize.apply(x, gain, eps)
    return _L2Normalize.apply(x, gain, eps)[0]
