"""The counting domain's network: embeddings, the project's encoder (any attention variant), a classifier."""
import torch
from torch import nn

from common.blocks import Encoder


class CountingNet(nn.Module):
    def __init__(self, num_classes: int, *, vocab: int, length: int, dim: int, depth: int, heads: int, dropout: float,
                 attn_layer):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.position = nn.Parameter(torch.zeros(1, length, dim))
        # attn_layer carries the run's variant and settings; Encoder makes every layer's attention with it
        self.encoder = Encoder(dim, depth, heads, attn_layer=attn_layer, seq_len=length, dropout=dropout)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(tokens) + self.position).mean(1))
