"""A decoder-only GPT (GPT-2 / nanoGPT layout) on the shared encoder, sampling with a KV cache, and its task.

Positions are learned absolute embeddings, as in GPT-2 and nanoGPT: the ``paper`` preset is their recipe,
and the attention core stays as it is (rotary positions would rotate q and k inside
``common.attention`` between projection and fold). The cost is a fixed context: past it, generation
re-encodes the last ``context`` tokens at every step, exactly as nanoGPT's uncached sampler does.

Initialisation follows GPT-2 / nanoGPT: every linear, embedding and attention projection weight is
N(0, 0.02²), biases zero, and the two projections that write into the residual stream (attention output,
second MLP layer) N(0, (0.02/√(2·depth))²), so the 2·depth branches together add the same variance to
the residual stream whatever the depth. ``init="torch"`` is the second initialisation the study checks its
verdicts under: PyTorch's own defaults for every linear layer and the q/k/v projection (Xavier), embeddings kept
at N(0, 0.02²), since a tied N(0, 1) embedding would start the output logits at a spread of √dim.
The learnable scales of qknorm-style variants keep their own initial values. With QUEST there is no
1/√d: on LayerNorm-ed inputs a query has norm ≈ 0.02·√(dim·head_dim) and a logit ‖q‖·cos has spread
≈ 0.02·√dim (0.55 at dim 768), against 0.02²·dim for standard attention's q·k/√d (0.31), so the
initial scale 0.02 is what sets QUEST's initial sharpness.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics import Metric

from common.attention import KVCache, MultiheadAttention
from common.blocks import AttentionFactory, Encoder
from common.metrics import UnigramCrossEntropy
from common.task import Optim, Task

from .config import INITS

INIT_STD = 0.02


class GPT(nn.Module):
    """tokens [B, T] -> next-token logits [B, T, vocab]. Dropout after the embeddings and on every residual
    branch (``dropout``; the shared MLP also drops after its activation), and on the attention weights
    (``attn_dropout``)."""

    def __init__(self, vocab_size: int, *, context: int, dim: int, depth: int, heads: int, mlp_ratio: float,
                 dropout: float, attn_dropout: float, tie_weights: bool, attn_layer: AttentionFactory, init: str = "gpt2"):
        super().__init__()
        if init not in INITS:
            raise ValueError(f"unknown model.init {init!r}; choose from {', '.join(INITS)}")
        self.context = context
        self.token_embed = nn.Embedding(vocab_size, dim)
        self.pos_embed = nn.Embedding(context, dim)
        self.drop = nn.Dropout(dropout)
        self.encoder = Encoder(dim, depth, heads, mlp_ratio=mlp_ratio, dropout=dropout, attn_dropout=attn_dropout,
                               seq_len=context, attn_layer=attn_layer)
        self.head = nn.Linear(dim, vocab_size, bias=False)
        if init == "gpt2":
            self.init_weights(depth)
        else:
            for embedding in (self.token_embed, self.pos_embed):
                nn.init.normal_(embedding.weight, std=INIT_STD)
        if tie_weights:
            self.head.weight = self.token_embed.weight

    def init_weights(self, depth: int) -> None:
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=INIT_STD)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
            if isinstance(module, MultiheadAttention):  # its q/k/v projection is one parameter; biases start at 0
                nn.init.normal_(module.in_proj_weight, std=INIT_STD)
        for layer in self.encoder.layers:
            mlp_out = [m for m in layer.mlp.modules() if isinstance(m, nn.Linear)][-1]
            for projection in (layer.attn.out_proj, mlp_out):
                nn.init.normal_(projection.weight, std=INIT_STD / math.sqrt(2 * depth))

    def new_cache(self) -> list[KVCache]:
        return self.encoder.new_cache()

    def forward(self, tokens: Tensor, cache: list[KVCache] | None = None) -> Tensor:
        """With ``cache`` (``self.new_cache()``), ``tokens`` follow those already cached."""
        past = len(cache[0]) if cache else 0
        if past + tokens.shape[1] > self.context:
            raise ValueError(f"{past + tokens.shape[1]} positions exceed the context of {self.context}")
        positions = torch.arange(past, past + tokens.shape[1], device=tokens.device)
        x = self.drop(self.token_embed(tokens) + self.pos_embed(positions))
        return self.head(self.encoder(x, is_causal=True, cache=cache))


@torch.no_grad()
def generate(net: nn.Module, prompt: Tensor, max_new_tokens: int, *, temperature: float = 1.0, top_k: int | None = None,
             generator: torch.Generator | None = None, use_cache: bool = True) -> Tensor:
    """``prompt`` [B, T] followed by ``max_new_tokens`` sampled tokens, from our ``GPT`` or a ``TransformersLM``
    (``net(tokens, cache)``, ``net.new_cache()``, ``net.context``). ``temperature`` 0 is greedy; ``top_k`` keeps
    the k likeliest tokens. The cache holds every position until the context is full; from then on each step
    re-encodes the last ``context`` tokens (positions shift, so nothing is reusable), so cached and uncached
    generation agree token for token."""
    tokens, cache, cached = prompt, None, 0
    for _ in range(max_new_tokens):
        if cache is not None and cached < net.context:
            logits = net(tokens[:, -1:], cache)  # only the newest token; the rest is cached
            cached += 1
        else:
            cache = net.new_cache() if use_cache else None
            window = tokens[:, -net.context:]
            logits, cached = net(window, cache), window.shape[1]
        tokens = torch.cat([tokens, sample(logits[:, -1].float(), temperature, top_k, generator)], dim=1)
    return tokens


def sample(logits: Tensor, temperature: float, top_k: int | None, generator: torch.Generator | None) -> Tensor:
    """One token per row of logits [B, V] -> [B, 1]."""
    if temperature == 0:
        return logits.argmax(-1, keepdim=True)
    logits = logits / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.multinomial(logits.softmax(-1), 1, generator=generator)


class MeanNLL(Metric):
    """Mean negative log-likelihood in nats over every token seen, from per-token values."""

    full_state_update = False
    higher_is_better = False

    def __init__(self):
        super().__init__()
        # float64: a test split sums millions of token losses
        self.add_state("total", torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, nll: Tensor, target: Tensor) -> None:
        self.total += nll.double().sum()
        self.count += nll.numel()

    def compute(self) -> Tensor:
        return self.total / self.count


class BitsPerToken(MeanNLL):
    def compute(self) -> Tensor:
        return super().compute() / math.log(2)


class Perplexity(MeanNLL):
    def compute(self) -> Tensor:
        return super().compute().exp()


class LanguageTask(Task):
    """Next-token cross-entropy on ``(inputs, targets)`` windows. The step logs ``<stage>/loss`` (nats per
    token, the primary metric); the metrics add bits per token (``bpb`` for bytes, ``bpc`` for
    characters), perplexity (``ppl``) and the trivial baseline ``loss_baseline`` (the stage's unigram
    entropy), over every token of the stage. ``tokenizer`` is kept for sampling."""

    logit_dim = -1

    def __init__(self, net: GPT, tokenizer, optim: Optim, *, seed: int = 0):
        bits = f"bp{tokenizer.unit[0]}"
        super().__init__(net, optim, {bits: BitsPerToken(), "ppl": Perplexity(),
                                      "loss_baseline": UnigramCrossEntropy(tokenizer.vocab_size)}, seed=seed)
        self.tokenizer = tokenizer

    def loss(self, logits: Tensor, target: Tensor, stage: str) -> Tensor:
        return F.cross_entropy(logits.flatten(0, 1), target.flatten())

    def predictions(self, logits: Tensor, target: Tensor):
        nll = F.cross_entropy(logits.detach().flatten(0, 1).float(), target.flatten(), reduction="none")
        return nll, target
