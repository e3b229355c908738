"""Stability probes: per attention layer, the max logit, mean/max query norm, mean/max key norm (before
normalisation) and mean attention entropy — the quantities the QUEST argument rests on — and the layer's
sharpness: each query's logit spread (the standard deviation of its logits over the keys it may see) and its
entropy over the uniform one's (``entropy_ratio``: 1 attends evenly, 0 to one key), both averaged over queries.
At step 0 these two say how sharp a variant starts, which the variants' parametrisations make very different.

Logits are formed explicitly only while a probe is enabled, on the first few samples of a batch
(``common.callbacks.ProbeCallback`` enables them every k training steps).
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

STATS = ("max_logit", "q_norm_mean", "q_norm_max", "k_norm_mean", "k_norm_max", "entropy", "logit_std",
         "entropy_ratio")
PEAKED = ("max_logit", "q_norm_max", "k_norm_max")  # the maxima whose peak over training a record keeps


def explicit_attention(q: Tensor, k: Tensor, scale: float, mask: Tensor | None) -> tuple[Tensor, Tensor]:
    """Logits and probabilities as explicit [.., q_tokens, k_tokens] tensors. ``mask`` is an SDPA mask:
    boolean (True = attend) or additive."""
    logits = (q @ k.transpose(-2, -1)) * scale
    scores = logits
    if mask is not None:
        scores = logits.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else logits + mask
    return logits, scores.softmax(-1)


def _stats(max_logit: Tensor, q_norm: Tensor, k_norm: Tensor, entropy: Tensor, rows: Tensor, count: Tensor, mean: Tensor,
           mean_square: Tensor) -> dict[str, Tensor]:
    """``STATS`` from the norms of the queries and keys that count, each query's entropy (averaged over ``rows``) and
    the count, mean and mean square of the logits it sees. Logit spread and entropy ratio are averaged over the
    queries that see two keys or more (one key has no spread and a log-count of 0)."""
    sharp = count >= 2
    spread = (mean_square - mean.square()).clamp_min(0).sqrt()
    return {"max_logit": max_logit,
            "q_norm_mean": q_norm.mean(), "q_norm_max": q_norm.max(),
            "k_norm_mean": k_norm.mean(), "k_norm_max": k_norm.max(),
            "entropy": entropy[rows].mean(),
            "logit_std": spread[sharp].mean(), "entropy_ratio": (entropy[sharp] / count[sharp].log()).mean()}


class Probe:
    """The probe slot of one attention module: off by default, filled with 0-dim tensors when on."""

    def __init__(self) -> None:
        self.enabled = False
        self.max_samples = 4
        self.stats: dict[str, Tensor] = {}

    @torch.no_grad()
    def record_dense(self, q: Tensor, k: Tensor, qf: Tensor, kf: Tensor, scale: float,
                     mask: Tensor | None, key_padding_mask: Tensor | None) -> None:
        """q, k raw [B, H, N, D]; qf, kf as folded for SDPA; mask as merged for SDPA."""
        n = self.max_samples
        q, k, qf, kf = (t[:n].float() for t in (q, k, qf, kf))
        if mask is not None and mask.dim() == 4 and mask.shape[0] > 1:
            mask = mask[:n]
        if mask is not None and mask.is_floating_point():
            mask = mask.float()
        logits, attn = explicit_attention(qf, kf, scale, mask)

        key_ok = torch.ones(k.shape[0], k.shape[2], dtype=torch.bool, device=k.device)
        if key_padding_mask is not None:
            key_ok = ~key_padding_mask[:n]
        # Query rows are padding too when a sequence attends to itself.
        query_ok = key_ok if q.shape[2] == k.shape[2] else torch.ones(q.shape[0], q.shape[2], dtype=torch.bool, device=q.device)
        entry_ok = key_ok[:, None, None, :]
        if mask is not None:
            entry_ok = entry_ok & (mask if mask.dtype == torch.bool else torch.isfinite(mask))
        entry_ok = entry_ok.expand_as(logits)

        q_norm, k_norm = q.norm(dim=-1), k.norm(dim=-1)
        row_ok = query_ok[:, None, :] & entry_ok.any(-1)
        entropy = -(attn * attn.clamp_min(1e-30).log()).sum(-1)
        seen = logits.masked_fill(~entry_ok, 0.0)
        count = entry_ok.sum(-1).float()
        row_mean, row_square = seen.sum(-1) / count.clamp_min(1), seen.square().sum(-1) / count.clamp_min(1)
        self.stats = _stats(logits.masked_fill(~entry_ok, float("-inf")).amax(), q_norm[query_ok[:, None, :].expand_as(q_norm)],
                            k_norm[key_ok[:, None, :].expand_as(k_norm)], entropy, row_ok, count.masked_fill(~row_ok, 0),
                            row_mean, row_square)

    @torch.no_grad()
    def record_edges(self, q: Tensor, k: Tensor, logits: Tensor, alpha: Tensor, dst: Tensor, num_nodes: int) -> None:
        """q, k raw [N, H, D]; logits and softmax weights per edge [E, H]; dst the target of each edge."""
        from torch_geometric.utils import scatter

        entropy = -scatter(alpha * alpha.clamp_min(1e-30).log(), dst, dim=0, dim_size=num_nodes, reduce="sum")
        has_edges = torch.bincount(dst, minlength=num_nodes) > 0
        q_norm, k_norm = q.float().norm(dim=-1), k.float().norm(dim=-1)
        logits = logits.float()
        count = torch.bincount(dst, minlength=num_nodes).float()[:, None].expand_as(entropy)
        row_mean = scatter(logits, dst, dim=0, dim_size=num_nodes, reduce="mean")
        row_square = scatter(logits.square(), dst, dim=0, dim_size=num_nodes, reduce="mean")
        self.stats = _stats(logits.max(), q_norm, k_norm, entropy, has_edges, count, row_mean, row_square)


def attention_probes(model: torch.nn.Module) -> dict[str, Probe]:
    """Every probe in a model, keyed by its attention module's name."""
    return {name: m.probe for name, m in model.named_modules() if isinstance(getattr(m, "probe", None), Probe)}


def summarize(per_layer: dict[str, dict[str, Tensor]]) -> dict[str, float]:
    """Across layers: the max of maxima, the mean of means, entropies and spreads."""
    out = {}
    for stat in STATS:
        if found := [s[stat] for s in per_layer.values() if stat in s]:
            values = torch.stack(found)
            out[stat] = float(values.max() if stat.endswith("max") or stat == "max_logit" else values.mean())
    return out


def raise_peaks(peak: dict[str, float], summary: dict[str, float]) -> None:
    """``peak``, the largest of each ``PEAKED`` statistic over the probe steps so far, raised by one step's
    cross-layer ``summary``: a thinned trajectory would miss a peak between its kept steps. A NaN, once seen,
    stays."""
    for stat in PEAKED:
        if stat in summary:
            value, before = summary[stat], peak.get(stat, -math.inf)
            peak[stat] = value if math.isnan(value) or value > before else before


def with_peaks(summary: dict[str, float], peak: dict[str, float]) -> dict[str, float]:
    """A record's ``probes``: the last probe step's ``summary`` and each peak as ``peak_<stat>``."""
    return summary | {f"peak_{stat}": value for stat, value in peak.items()}


def probe_log(per_layer: dict[str, dict[str, Tensor]], summary: dict[str, float]) -> dict[str, float]:
    """What a probe step logs (both trainers' metrics.csv): ``probe/<layer>/<stat>`` for every layer, and the
    cross-layer ``summary`` (``summarize``) as ``probe/<stat>``."""
    logged = {f"probe/{name}/{stat}": float(v) for name, stats in per_layer.items() for stat, v in stats.items()}
    logged.update({f"probe/{stat}": v for stat, v in summary.items()})
    return logged
