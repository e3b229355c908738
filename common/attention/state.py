"""What attention carries between calls: ``AttentionState`` from one layer of a stack to the next within a
forward pass, ``KVCache`` from one forward pass to the next while decoding."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from common.attention.elliptical import _unit_max


@dataclass
class AttentionState:
    """What each attention layer of a stack leaves for the next: its values, from which elliptical variants
    compute their metric. A stack makes one per forward pass and hands it to every layer.

    Args:
        values: The last layer's values, detached: [B, H, N, D] dense, [N, H, D] on edges. None: no layer has run yet.
    """

    values: Tensor | None = field(default=None, repr=False)

    def exchange(self, values: Tensor) -> Tensor | None:
        """Stores this layer's values, detached, and returns the previous layer's: None when no layer has run yet
        or their shape differs."""
        previous = self.values if self.values is not None and self.values.shape == values.shape else None
        self.values = values.detach()
        return previous


class KVCache:
    """One attention layer's keys and values from earlier forward passes, for causal decoding a chunk at a
    time (a prompt, then one token per step): each pass gives the layer only its new tokens. Unlike the
    ``AttentionState`` of one pass, it lives as long as the sequence being decoded; a stack holds one per
    layer (``common.blocks.Encoder.new_cache``).

    Keys are stored folded: QUEST normalises a key once, as it enters, and a learnable key scale (qknorm_ds) is applied
    then too, which equals refolding every key at every step because the scales are fixed at inference. Elliptical
    variants weight a query by the mean of |v^l − v^{l−1}| over its prefix (``elliptical_metric(..., causal=True)``), so
    the running sum of that difference is all the past they need.

    Attributes:
        keys: Folded keys so far, ``(batch, heads, past, head_dim)``; None before the first ``append``.
        values: Values so far, ``(batch, heads, past, head_dim)``; None before the first ``append``.
        delta_sum: Elliptical variants only: the sum over the past of ``|v^l − v^{l−1}|``,
            ``(batch, heads, 1, head_dim)``; None before the first ``metric``.
    """

    def __init__(self) -> None:
        self.keys: Tensor | None = None  # folded, [B, H, past, D]
        self.values: Tensor | None = None
        self.delta_sum: Tensor | None = None  # elliptical only: sum over the past of |v^l − v^{l−1}|, [B, H, 1, D]

    def __len__(self) -> int:
        return 0 if self.keys is None else self.keys.shape[-2]

    @torch.no_grad()
    def metric(self, values: Tensor, prev_values: Tensor, eps: float = 1e-6) -> Tensor:
        """The causal elliptical metric of the new tokens' ``values`` [B, H, T, D] against ``prev_values`` (the
        previous layer's), prefixes reaching into the cache, floored at ``eps`` as in ``elliptical_metric``; it adds
        them to ``delta_sum``, so call it once per step, before ``append``. Computed without gradients."""
        sums = (values - prev_values).abs().cumsum(-2)
        if self.delta_sum is not None:
            sums = sums + self.delta_sum
        self.delta_sum = sums[..., -1:, :]
        seen = torch.arange(len(self) + 1, len(self) + values.shape[-2] + 1, device=sums.device, dtype=sums.dtype)
        return _unit_max(sums / seen[:, None], eps)

    def append(self, keys: Tensor, values: Tensor) -> tuple[Tensor, Tensor]:
        """Adds the new tokens' folded keys and values [B, H, T, D]; returns every key and value so far."""
        self.keys = keys if self.keys is None else torch.cat([self.keys, keys], dim=-2)
        self.values = values if self.values is None else torch.cat([self.values, values], dim=-2)
        return self.keys, self.values
