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


class RetrievalTask(Task):
    """``acc`` is accuracy on unbiased samples (the robust solution), ``acc_biased`` on biased ones;
    ``test/success`` is 1 when the test ``acc`` reaches ``success_threshold``. Every training step logs
    the answer token's key norm for biased and unbiased samples (``probe/answer_key_norm_*``)."""

    def __init__(self, net: RetrievalNet, num_classes: int, optim: dict, success_threshold: float):
        super().__init__(optim)
        self.net = net
        self.success_threshold = success_threshold
        for stage in ("train", "val", "test"):
            for name in ("acc", "acc_biased"):
                setattr(self, f"{stage}_{name}", MulticlassAccuracy(num_classes, average="micro"))

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)

    def step(self, batch, stage: str) -> Tensor:
        x, labels, biased, answer = batch
        logits = self(x)
        loss = F.cross_entropy(logits, labels)
        self.log(f"{stage}/loss", loss, prog_bar=stage == "train", batch_size=len(labels))
        for name, keep in (("acc", ~biased), ("acc_biased", biased)):
            if keep.any():
                metric = getattr(self, f"{stage}_{name}")
                metric.update(logits.detach()[keep], labels[keep])
                self.log(f"{stage}/{name}", metric, on_step=False, on_epoch=True, batch_size=int(keep.sum()))
        if stage == "train":
            self._log_answer_key_norms(x, biased, answer)
        return loss

    @torch.no_grad()
    def _log_answer_key_norms(self, x: Tensor, biased: Tensor, answer: Tensor) -> None:
        norms = self.net.keys(x)[torch.arange(len(x)), answer].norm(dim=-1)
        for name, keep in (("biased", biased), ("unbiased", ~biased)):
            if keep.any():
                self.log(f"probe/answer_key_norm_{name}", norms[keep].mean(), on_step=True, on_epoch=False)

    def on_test_epoch_end(self) -> None:
        self.log("test/success", float(self.test_acc.compute() >= self.success_threshold))
