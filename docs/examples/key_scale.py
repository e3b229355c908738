"""The example of docs/guides/add-a-variant.md: a variant with a fold of its own, QUEST with a learnable scale per key
dimension (logit q·(c ⊙ k̂)). In the project, the class goes into common/attention/folds.py (and into its
``FOLDS``), and the two declarations at the end into common/attention/variants.py (``FOLD_SCALES`` and
``VARIANTS``); the tests (tests/test_attention.py) register all three from this file and check the variant as they
check the study's own."""
import torch
from torch import Tensor, nn

from common.attention.folds import QKFold
from common.attention.variants import Variant


class KeyScale(QKFold):
    """q·(c ⊙ k̂) with a learnable c ∈ R^d, started at 1 (plain QUEST)."""

    def __init__(self, variant: Variant, num_heads: int, head_dim: int, **settings):
        super().__init__(variant, num_heads, head_dim, eps=settings.get("eps", 1e-6),
                         l2norm_kernel=settings.get("l2norm_kernel", "fused"))
        self.k_scale = nn.Parameter(torch.ones(head_dim))

    def rescale(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:  # the fast path: k is already k̂ here
        return q, k * self.k_scale

    def reference_logits(self, q: Tensor, k: Tensor) -> Tensor:  # the same logits, written out
        return q @ (self.k_scale * k).transpose(-2, -1)


KEY_SCALE_SCALES = ("k_scale",)  # FOLD_SCALES["KeyScale"]: the parameters it creates, so its variants are learnable
QUEST_KS = Variant("quest_ks", norm_q=False, norm_k=True, scaled=False, fold="KeyScale")
