"""Token MLP -> one attention layer read by a learned query token -> linear classifier."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics.classification import MulticlassAccuracy

from common.attention import MultiheadAttention
from common.task import Task


class RetrievalNet(nn.Module):
    """With a single attention layer there are no previous values, so the elliptical variants run
    their base variants here (standard, quest)."""

    def __init__(self, input_dim: int, num_classes: int, *, seq_len: int, dim: int, heads: int, attention):
        super().__init__()
        self.embed = nn.Sequential(nn.Linear(input_dim, dim), nn.GELU(), nn.Linear(dim, dim))
        self.query = nn.Parameter(0.02 * torch.randn(1, 1, dim))
        self.attn = MultiheadAttention(dim, heads, seq_len=seq_len, **attention)
        self.head = nn.Linear(dim, num_classes)

    def keys(self, x: Tensor) -> Tensor:
        """The attention keys [B, N, dim] before any normalisation (what the shortcut inflates)."""
        w_k = self.attn.in_proj_weight.chunk(3)[1]
        b_k = self.attn.in_proj_bias.chunk(3)[1] if self.attn.in_proj_bias is not None else None
        return F.linear(self.embed(x), w_k, b_k)

    def forward(self, x: Tensor) -> Tensor:
        tokens = self.embed(x)
        out, _ = self.attn(self.query.expand(x.shape[0], -1, -1), tokens, tokens)
        return self.head(out[:, 0])


class SubsetAccuracy(MulticlassAccuracy):
    """Accuracy over the biased (or over the unbiased) samples only; targets are rows (label, biased).
    NaN when there were no such samples (p_bias 0 or 1), rather than a score of 0."""

    def __init__(self, num_classes: int, *, biased: bool):
        super().__init__(num_classes, average="micro")
        self.biased = biased

    def update(self, preds: Tensor, target: Tensor) -> None:
        keep = target[:, 1].bool() == self.biased
        if keep.any():  # torchmetrics rejects an empty batch
            super().update(preds[keep], target[keep, 0])

    def compute(self) -> Tensor:
        seen = self.tp + self.fn  # every sample is a true positive or a false negative of its class
        return super().compute() if seen.sum() > 0 else torch.tensor(float("nan"))


class RetrievalTask(Task):
    """``acc`` is accuracy on unbiased samples (the robust solution), ``acc_biased`` on biased ones;
    ``test/success`` is 1 when the test ``acc`` reaches ``success_threshold``. Every training step logs
    the answer token's key norm for biased and unbiased samples (``probe/answer_key_norm_*``). Targets
    are rows (label, biased flag), so that the metrics can tell the two kinds of sample apart."""

    def __init__(self, net: RetrievalNet, num_classes: int, optim: dict, *, success_threshold: float, seed: int = 0):
        metrics = {"acc": SubsetAccuracy(num_classes, biased=False), "acc_biased": SubsetAccuracy(num_classes, biased=True)}
        super().__init__(net, optim, metrics, seed=seed)
        self.success_threshold = success_threshold

    def unpack(self, batch) -> tuple[Tensor, Tensor]:
        x, labels, biased, _ = batch
        return x, torch.stack([labels, biased.long()], dim=1)

    def loss(self, logits: Tensor, target: Tensor, stage: str) -> Tensor:
        return F.cross_entropy(logits, target[:, 0])

    def step(self, batch, stage: str) -> Tensor:
        loss = super().step(batch, stage)
        if stage == "train":
            x, _, biased, answer = batch
            self._log_answer_key_norms(x, biased, answer)
        return loss

    @torch.no_grad()
    def _log_answer_key_norms(self, x: Tensor, biased: Tensor, answer: Tensor) -> None:
        norms = self.net.keys(x)[torch.arange(len(x)), answer].norm(dim=-1)
        for name, keep in (("biased", biased), ("unbiased", ~biased)):
            if keep.any():
                self.log(f"probe/answer_key_norm_{name}", norms[keep].mean(), on_step=True, on_epoch=False)

    def on_test_epoch_end(self) -> None:
        super().on_test_epoch_end()
        self.log("test/success", float(self.test_metrics["acc"].compute() >= self.success_threshold))
