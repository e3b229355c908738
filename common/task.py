"""The LightningModule every domain builds on: optimiser and schedule from config, metric logging by
stage, and divergence recorded as a result instead of a crash."""
from __future__ import annotations

import math

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics import MetricCollection
from torchmetrics.classification import MulticlassAccuracy

STAGES = ("train", "val", "test")


class Task(pl.LightningModule):
    """Subclasses implement ``step(batch, stage) -> loss`` and log their metrics as ``<stage>/<name>``.

    ``optim`` keys: name (adamw | adam | sgd), lr, weight_decay, betas, momentum, schedule
    (cosine | constant), warmup_steps, min_lr_ratio. Weight decay skips 1-D parameters (biases,
    norms, attention gains).
    """

    def __init__(self, optim: dict):
        super().__init__()
        self.optim = dict(optim)
        self.divergence: dict | None = None

    def step(self, batch, stage: str) -> Tensor:
        raise NotImplementedError

    def set_metrics(self, metrics: MetricCollection) -> None:
        """One copy of ``metrics`` per stage, logged as ``<stage>/<name>`` at epoch end."""
        for stage in STAGES:
            setattr(self, f"{stage}_metrics", metrics.clone(prefix=f"{stage}/"))

    def update_metrics(self, stage: str, preds: Tensor, target: Tensor) -> None:
        metrics = getattr(self, f"{stage}_metrics")
        metrics.update(preds, target)
        self.log_dict(metrics, on_step=False, on_epoch=True, batch_size=target.shape[0])

    def training_step(self, batch, batch_idx):
        loss = self.step(batch, "train")
        # Every rank must agree, or DDP would wait forever on the rank that skipped its backward.
        bad = self.trainer.strategy.reduce_boolean_decision(not bool(torch.isfinite(loss)), all=False)
        if bad:
            self.mark_diverged("non-finite training loss")
            return None
        return loss

    def validation_step(self, batch, batch_idx):
        self.step(batch, "val")

    def test_step(self, batch, batch_idx):
        self.step(batch, "test")

    def mark_diverged(self, reason: str) -> None:
        """End training now and remember why; the runner records ``status: diverged``."""
        if self.divergence is None:
            self.divergence = {"step": int(self.global_step), "reason": reason}
        self.trainer.should_stop = True

    def configure_optimizers(self):
        cfg = self.optim
        decay = [p for p in self.parameters() if p.requires_grad and p.dim() > 1]
        no_decay = [p for p in self.parameters() if p.requires_grad and p.dim() <= 1]
        groups = [{"params": decay, "weight_decay": cfg.get("weight_decay", 0.0)},
                  {"params": no_decay, "weight_decay": 0.0}]
        name, lr = cfg.get("name", "adamw"), cfg["lr"]
        if name == "adamw":
            opt = torch.optim.AdamW(groups, lr=lr, betas=tuple(cfg.get("betas", (0.9, 0.999))))
        elif name == "adam":
            opt = torch.optim.Adam(groups, lr=lr, betas=tuple(cfg.get("betas", (0.9, 0.999))))
        elif name == "sgd":
            opt = torch.optim.SGD(groups, lr=lr, momentum=cfg.get("momentum", 0.9), nesterov=True)
        else:
            raise ValueError(f"unknown optimiser {name!r}; choose from adamw, adam, sgd")
        total = max(1, int(self.trainer.estimated_stepping_batches))
        lam = warmup_cosine(total, cfg.get("warmup_steps", 0), cfg.get("min_lr_ratio", 0.0),
                            cosine=cfg.get("schedule", "cosine") == "cosine")
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lam)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def warmup_cosine(total: int, warmup: int, min_ratio: float, cosine: bool = True):
    """Linear warm-up to 1, then cosine decay to ``min_ratio`` (or constant) over ``total`` steps."""

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if not cosine:
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return factor


class ClassificationTask(Task):
    """Cross-entropy classifier over ``net(inputs)`` for batches ``(inputs, labels)``; logs ``acc``
    (overall) and ``macc`` (mean per-class accuracy)."""

    def __init__(self, net: nn.Module, num_classes: int, optim: dict, label_smoothing: float = 0.0):
        super().__init__(optim)
        self.net = net
        self.num_classes = num_classes
        self.label_smoothing = label_smoothing
        self.set_metrics(MetricCollection({
            "acc": MulticlassAccuracy(num_classes, average="micro"),
            "macc": MulticlassAccuracy(num_classes, average="macro"),
        }))

    def forward(self, inputs):
        return self.net(inputs)

    def step(self, batch, stage: str) -> Tensor:
        inputs, labels = batch
        logits = self(inputs)
        loss = F.cross_entropy(logits, labels, label_smoothing=self.label_smoothing if stage == "train" else 0.0)
        self.log(f"{stage}/loss", loss, prog_bar=stage == "train", batch_size=labels.shape[0])
        self.update_metrics(stage, logits.detach(), labels)
        return loss
