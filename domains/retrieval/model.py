"""The mechanism study's model: one self-attention layer over the raw tokens, read out by a token MLP
averaged over the tokens; and its task.

Why this design can show the mechanism the paper describes. Queries, keys and values are linear maps of
the raw token features x_i = [k_i ; e(y_i)] (``data.py``): nothing before the attention can turn "this
token is out of distribution" into a direction, so that signal reaches the logits only through norms.
Every token attends with its own query q_i = W_q x_i, so the answer token's query is as far out as its
key, and its logit with itself, x_a^T W_q^T W_k x_a, is a quadratic form that grows with ‖k_a‖². How
each variant can use it (logit of query i and key j):

- standard, ``q_i·k_j/√d``: both norms; the answer's row is sharp, and large keys draw every row.
- quest, ``‖q_i‖·cos(q_i, k_j)``: the token's own query norm sets how sharply it attends; the answer,
  with the largest query, attends sharply (to itself) while distractors attend diffusely.
- qnorm, ``‖k_j‖·cos(q_i, k_j)``: the key norm alone; a large key is sharp for every query facing it.
- qknorm (and qknorm_ds), ``g·cos(q_i, k_j)``: one scale for every row, so a larger norm cannot make the
  answer's row sharper; what the norms carry reaches the logits only through directions (with the
  projections' biases, a key's direction still turns as its norm grows).

The readout applies an MLP to every token's attention output and averages the class scores over tokens.
It can tell a token whose output is one clean label (sharp attention onto one label: the answer attending
to itself) from one whose output is a mixture. It holds no learned query: with a constant query
``‖q‖·cos`` is ``g·cos``, and QUEST would be QKNorm's function class.

The shortcut. On biased samples the answer's key part is b plus small noise. A key or query weight with
a large gain along b gives the biased answer a large self-logit, and under standard attention and qnorm
a large key norm, which solves the biased half without comparing norms; it does nothing for the unbiased
half. The task logs the answer token's key norm ‖W_k x_a + b_k‖ on biased and on unbiased samples, so the
growth of that gain is visible.

With one layer and one head some variants compute what another does (``EQUIVALENT``): the elliptical
ones have no previous layer's values and run their base variant, and a per-head gain is a per-layer gain.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torchmetrics.classification import MulticlassAccuracy

from common import probes
from common.attention import attend_folded, make_fold
from common.blocks import AttentionFactory
from common.schema import Attention
from common.task import Optim, Task

QK_INPUTS = ("key", "token")  # what the faithful model's q and k are projected from: x^k, or the whole token
# variant -> the variant it computes in this one-layer model (the per-head gain only with one head)
EQUIVALENT = {"elliptical": "standard", "elliptical_quest": "quest", "qknorm_hs": "qknorm"}


def equivalent_variant(variant: str, heads: int) -> str:
    """The variant that ``variant`` computes in a ``RetrievalNet`` with ``heads`` heads."""
    if variant == "qknorm_hs" and heads > 1:
        return variant
    return EQUIVALENT.get(variant, variant)


class RetrievalNet(nn.Module):
    """Self-attention over the raw tokens -> per-token MLP (``hidden`` units; 0: a linear map) -> mean of
    the per-token class scores."""

    def __init__(self, input_dim: int, num_classes: int, *, seq_len: int, heads: int, hidden: int,
                 attn_layer: AttentionFactory):
        super().__init__()
        # The normalisation formula is the one vmap runs, so that a run trained alone is the run trained among
        # others (runners.runs.ensemble), whatever the config asks of the kernel.
        self.attn = attn_layer(input_dim, heads, seq_len=seq_len, l2norm_kernel="formula")
        if hidden:
            self.readout = nn.Sequential(nn.Linear(input_dim, hidden), nn.GELU(), nn.Linear(hidden, num_classes))
        else:
            self.readout = nn.Linear(input_dim, num_classes)

    def keys(self, x: Tensor) -> Tensor:
        """The attention keys [B, N, dim] before any normalisation (what the shortcut inflates)."""
        w_k = self.attn.in_proj_weight.chunk(3)[1]
        b_k = self.attn.in_proj_bias.chunk(3)[1] if self.attn.in_proj_bias is not None else None
        return F.linear(x, w_k, b_k)

    def forward(self, x: Tensor) -> Tensor:
        # SDPA's math kernel: on 8 tokens it costs less than the fused kernels' set-up, and under vmap
        # (runners.runs.ensemble) it batches over runs, where a fused kernel would be called once per run.
        with sdpa_kernel(SDPBackend.MATH):
            out, _ = self.attn(x)
        return self.readout(out).mean(1)


class FaithfulRetrievalNet(nn.Module):
    """The task as the paper describes it: queries and keys are linear maps of the real-valued part x^k of each
    token (``qk_input="key"``; ``"token"``: of the whole token [x^k ; x^v], an ablation), without biases unless
    ``qk_bias``; the values are the one-hot parts x^v themselves. Each token's attention output is then a
    distribution over the labels, and the prediction is their mean over the tokens (its log as the class
    scores): no readout weights, so all the model learns is where attention goes, and an answer is read
    only if the tokens' attention finds it. What the paper leaves open and is chosen here: values as the
    identity map of x^v (a learned map would let the readout re-weight labels, which the task does not
    need), the mean over tokens as the readout (every token's query asks; none is singled out), one head,
    q and k of ``qk_dim`` channels. The variant's fold and SDPA are the shared core's (``common.attention``).
    """

    def __init__(self, key_dim: int, num_classes: int, *, seq_len: int, qk_dim: int, qk_input: str, qk_bias: bool,
                 attention: Attention):
        super().__init__()
        if qk_input not in QK_INPUTS:
            raise ValueError(f"unknown model.qk_input {qk_input!r}; choose from {', '.join(QK_INPUTS)}")
        self.key_dim, self.qk_input = key_dim, qk_input
        width = key_dim if qk_input == "key" else key_dim + num_classes
        self.q_proj, self.k_proj = nn.Linear(width, qk_dim, bias=qk_bias), nn.Linear(width, qk_dim, bias=qk_bias)
        self.qk = make_fold(attention.variant, 1, qk_dim, seq_len=seq_len, l2norm_kernel="formula",
                            qk_gain_init=attention.qk_gain_init)
        self.probe = probes.Probe()  # ``attention_probes`` finds it: max logit, q/k norms, entropy

    def _qk_input(self, x: Tensor) -> Tensor:
        return x[..., :self.key_dim] if self.qk_input == "key" else x

    def keys(self, x: Tensor) -> Tensor:
        """The attention keys [B, N, qk_dim] before any normalisation (what the shortcut inflates)."""
        return self.k_proj(self._qk_input(x))

    def forward(self, x: Tensor) -> Tensor:
        source = self._qk_input(x)
        q, k = (proj(source)[:, None] for proj in (self.q_proj, self.k_proj))  # [B, 1 head, N, qk_dim]
        values = x[:, None, :, self.key_dim:]  # the one-hot labels
        qf, kf, scale = self.qk(q, k)
        with sdpa_kernel(SDPBackend.MATH):  # see RetrievalNet.forward
            out = attend_folded(qf, kf, values, scale, probe=self.probe, raw_qk=(q, k))
        return out[:, 0].mean(1).clamp_min(1e-6).log()


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


class Success(SubsetAccuracy):
    """1 when the accuracy on unbiased samples reaches ``threshold``, else 0 (NaN without such samples)."""

    def __init__(self, num_classes: int, threshold: float):
        super().__init__(num_classes, biased=False)
        self.threshold = threshold

    def compute(self) -> Tensor:
        acc = super().compute()
        return acc if acc.isnan() else (acc >= self.threshold).float()


class RetrievalTask(Task):
    """``acc`` is accuracy on unbiased samples (the robust solution), ``acc_biased`` on biased ones, and
    ``success`` is 1 when ``acc`` reaches ``success_threshold``. Every training step logs the answer token's
    key norm on biased and on unbiased samples (``train_stats``). Targets are rows (label, biased flag), so
    that the metrics can tell the two kinds of sample apart."""

    logit_dim = -1

    def __init__(self, net: RetrievalNet, num_classes: int, optim: Optim, *, success_threshold: float, seed: int = 0):
        metrics = {"acc": SubsetAccuracy(num_classes, biased=False),
                   "acc_biased": SubsetAccuracy(num_classes, biased=True),
                   "success": Success(num_classes, success_threshold)}
        super().__init__(net, optim, metrics, seed=seed)
        self.success_threshold = success_threshold

    def unpack(self, batch) -> tuple[Tensor, Tensor]:
        x, labels, biased, _ = batch
        return x, torch.stack([labels, biased.long()], dim=1)

    def loss(self, logits: Tensor, target: Tensor, stage: str) -> Tensor:
        return F.cross_entropy(logits, target[:, 0])

    @torch.no_grad()
    def train_stats(self, batch) -> dict[str, Tensor]:
        """Mean key norm of the answer token over the batch's biased and over its unbiased samples (NaN
        where the batch has none); written without data-dependent branches, so it runs under vmap."""
        x, _, biased, answer = batch
        norms = self.net.keys(x).norm(dim=-1).gather(1, answer[:, None])[:, 0]
        stats = {}
        for name, keep in (("biased", biased), ("unbiased", ~biased)):
            keep = keep.to(norms.dtype)
            stats[f"probe/answer_key_norm_{name}"] = (norms * keep).sum() / keep.sum()
        return stats

    def step(self, batch, stage: str) -> Tensor:
        loss = super().step(batch, stage)
        if stage == "train":
            for name, value in self.train_stats(batch).items():
                if torch.isfinite(value):  # NaN: no sample of that kind in this batch
                    self.log(name, value, on_step=True, on_epoch=False)
        return loss
