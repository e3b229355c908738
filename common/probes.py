"""Stability probes: per attention layer, the max logit, mean/max query norm, mean/max key norm (before
normalisation) and mean attention entropy — the quantities the QUEST argument rests on.

Logits are formed explicitly only while a probe is enabled, on the first few samples of a batch;
``ProbeCallback`` switches the probes of a model on every k training steps and logs what they saw.
"""
from __future__ import annotations

import math

import pytorch_lightning as pl
import torch
from torch import Tensor

STATS = ("max_logit", "q_norm_mean", "q_norm_max", "k_norm_mean", "k_norm_max", "entropy")


def explicit_attention(q: Tensor, k: Tensor, scale: float, mask: Tensor | None) -> tuple[Tensor, Tensor]:
    """Logits and probabilities as explicit [.., q_tokens, k_tokens] tensors. ``mask`` is an SDPA mask:
    boolean (True = attend) or additive."""
    logits = (q @ k.transpose(-2, -1)) * scale
    scores = logits
    if mask is not None:
        scores = logits.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else logits + mask
    return logits, scores.softmax(-1)


def _masked_mean_max(x: Tensor, keep: Tensor) -> tuple[Tensor, Tensor]:
    keep = keep.expand_as(x)
    return x[keep].mean(), x[keep].max()


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
        q_mean, q_max = _masked_mean_max(q_norm, query_ok[:, None, :])
        k_mean, k_max = _masked_mean_max(k_norm, key_ok[:, None, :])
        self.stats = {
            "max_logit": logits.masked_fill(~entry_ok, float("-inf")).amax(),
            "q_norm_mean": q_mean, "q_norm_max": q_max,
            "k_norm_mean": k_mean, "k_norm_max": k_max,
            "entropy": entropy[row_ok].mean(),
        }

    @torch.no_grad()
    def record_edges(self, q: Tensor, k: Tensor, logits: Tensor, alpha: Tensor, dst: Tensor, num_nodes: int) -> None:
        """q, k raw [N, H, D]; logits and softmax weights per edge [E, H]; dst the target of each edge."""
        from torch_geometric.utils import scatter

        entropy = -scatter(alpha * alpha.clamp_min(1e-30).log(), dst, dim=0, dim_size=num_nodes, reduce="sum")
        has_edges = torch.bincount(dst, minlength=num_nodes) > 0
        q_norm, k_norm = q.float().norm(dim=-1), k.float().norm(dim=-1)
        self.stats = {
            "max_logit": logits.float().max(),
            "q_norm_mean": q_norm.mean(), "q_norm_max": q_norm.max(),
            "k_norm_mean": k_norm.mean(), "k_norm_max": k_norm.max(),
            "entropy": entropy[has_edges].mean(),
        }


def attention_probes(model: torch.nn.Module) -> dict[str, Probe]:
    """Every probe in a model, keyed by its attention module's name."""
    return {name: m.probe for name, m in model.named_modules() if isinstance(getattr(m, "probe", None), Probe)}


def summarize(per_layer: dict[str, dict[str, Tensor]]) -> dict[str, float]:
    """Across layers: the max of maxima, the mean of means and entropies."""
    out = {}
    for stat in STATS:
        values = torch.stack([s[stat] for s in per_layer.values() if stat in s])
        out[stat] = float(values.max() if stat.endswith("max") or stat == "max_logit" else values.mean())
    return out


class ProbeCallback(pl.Callback):
    """Every ``every_n_steps`` training steps, probe every attention layer on ``max_samples`` samples and
    log ``probe/<layer>/<stat>`` plus a cross-layer summary ``probe/<stat>``. A max logit beyond
    ``max_logit_bound`` (or a non-finite one) is reported to the module's ``mark_diverged``."""

    def __init__(self, every_n_steps: int = 50, max_samples: int = 4, max_logit_bound: float | None = None):
        self.every_n_steps = every_n_steps
        self.max_samples = max_samples
        self.max_logit_bound = max_logit_bound
        self.latest: dict[str, float] = {}

    def _switch(self, pl_module: pl.LightningModule, on: bool) -> dict[str, Probe]:
        found = attention_probes(pl_module)
        for probe in found.values():
            probe.enabled, probe.max_samples = on, self.max_samples
            if on:
                probe.stats = {}
        return found

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self.every_n_steps > 0 and trainer.global_step % self.every_n_steps == 0:
            self._switch(pl_module, True)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        found = attention_probes(pl_module)
        if not any(p.enabled for p in found.values()):
            return
        self._switch(pl_module, False)
        per_layer = {name: p.stats for name, p in found.items() if p.stats}
        if not per_layer:
            return
        self.latest = summarize(per_layer)
        # Straight to the loggers: self.log would drop steps that miss Trainer(log_every_n_steps).
        metrics = {f"probe/{name}/{stat}": float(v) for name, stats in per_layer.items() for stat, v in stats.items()}
        metrics.update({f"probe/{stat}": v for stat, v in self.latest.items()})
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.log_metrics(metrics, step=trainer.global_step)
        max_logit = self.latest["max_logit"]
        if not math.isfinite(max_logit) or (self.max_logit_bound is not None and max_logit > self.max_logit_bound):
            mark = getattr(pl_module, "mark_diverged", None)
            if mark is not None:
                mark(f"max attention logit {max_logit:.3g} past bound {self.max_logit_bound}")
