"""Point-MAE-style classifier trained from scratch: farthest-point centres, k-nearest-neighbour groups,
a mini-PointNet per group as the token, an MLP positional embedding of the centre, the shared
Transformer encoder, and a head on [cls token, max over tokens]. The task adds test accuracy under
jitter and point dropout (its test-time perturbations) beside the clean accuracy."""
from __future__ import annotations

import torch
from torch import Tensor, nn

from common.blocks import AttentionFactory, Encoder
from common.task import ClassificationTask

from .config import Jitter, PointDropout
from .data import drop_points, jitter


@torch.no_grad()
def farthest_point_sample(points: Tensor, num: int) -> Tensor:
    """Indices [B, num] of ``num`` farthest-point samples of each cloud [B, N, 3], starting from point 0
    (as the PointNet++ kernel does); each next point is the one farthest from those chosen so far."""
    batch, n, _ = points.shape
    rows = torch.arange(batch, device=points.device)
    chosen = torch.empty(batch, num, dtype=torch.long, device=points.device)
    nearest = torch.full((batch, n), float("inf"), device=points.device, dtype=points.dtype)
    current = torch.zeros(batch, dtype=torch.long, device=points.device)
    for i in range(num):
        chosen[:, i] = current
        offset = points - points[rows, current][:, None]
        nearest = torch.minimum(nearest, offset.pow(2).sum(-1))
        current = nearest.argmax(-1)
    return chosen


@torch.no_grad()
def knn(query: Tensor, points: Tensor, k: int) -> Tensor:
    """Indices [B, M, k] of the ``k`` points of [B, N, 3] nearest to each query [B, M, 3], nearest first."""
    return torch.cdist(query, points).topk(k, dim=-1, largest=False).indices


def gather_points(points: Tensor, index: Tensor) -> Tensor:
    """points [B, N, C] at index [B, ...] -> [B, ..., C]."""
    flat = index.reshape(index.shape[0], -1, 1).expand(-1, -1, points.shape[-1])
    return points.gather(1, flat).reshape(*index.shape, points.shape[-1])


class MiniPointNet(nn.Module):
    """Point-MAE's group encoder: a shared per-point MLP, the group max joined back to every point, a
    second MLP, and a max over the group. BatchNorm as in Point-MAE: a LayerNorm right after the 3-d
    input would normalise away each offset's length and keep only its direction."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.first = nn.Sequential(nn.Linear(3, hidden), nn.BatchNorm1d(hidden), nn.ReLU(),
                                   nn.Linear(hidden, 2 * hidden))
        self.second = nn.Sequential(nn.Linear(4 * hidden, 4 * hidden), nn.BatchNorm1d(4 * hidden), nn.ReLU(),
                                    nn.Linear(4 * hidden, dim))

    def forward(self, groups: Tensor) -> Tensor:  # [B, G, k, 3] -> [B, G, dim]
        batch, num_groups, k, _ = groups.shape
        features = self.first(groups.reshape(-1, 3)).view(batch * num_groups, k, -1)
        pooled = features.amax(1, keepdim=True).expand_as(features)
        features = self.second(torch.cat([pooled, features], -1).flatten(0, 1)).view(batch * num_groups, k, -1)
        return features.amax(1).view(batch, num_groups, -1)


class PointTransformer(nn.Module):
    """Clouds [B, N, 3] -> logits: ``num_groups`` tokens of ``group_size`` neighbours each, plus a cls token."""

    def __init__(self, num_classes: int, *, dim: int, depth: int, heads: int, num_groups: int, group_size: int,
                 tokenizer_hidden: int, pos_hidden: int, head_hidden: int, head_dropout: float,
                 mlp_ratio: float, dropout: float, attn_dropout: float, drop_path: float, attn_layer: AttentionFactory):
        super().__init__()
        self.num_groups, self.group_size = num_groups, group_size
        self.tokenizer = MiniPointNet(dim, tokenizer_hidden)
        self.pos_embed = nn.Sequential(nn.Linear(3, pos_hidden), nn.GELU(), nn.Linear(pos_hidden, dim))
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.cls_pos = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
        self.encoder = Encoder(dim, depth, heads, mlp_ratio=mlp_ratio, dropout=dropout, attn_dropout=attn_dropout,
                               drop_path=drop_path, seq_len=num_groups + 1, attn_layer=attn_layer)
        self.head = nn.Sequential(nn.Linear(2 * dim, head_hidden), nn.LayerNorm(head_hidden), nn.GELU(),
                                  nn.Dropout(head_dropout), nn.Linear(head_hidden, num_classes))

    def forward(self, points: Tensor) -> Tensor:  # [B, N, 3] -> logits [B, classes]
        centres = gather_points(points, farthest_point_sample(points, self.num_groups))
        groups = gather_points(points, knn(centres, points, self.group_size)) - centres[:, :, None]
        tokens = self.tokenizer(groups) + self.pos_embed(centres)
        cls = (self.cls_token + self.cls_pos).expand(points.shape[0], -1, -1)
        x = self.encoder(torch.cat([cls, tokens], 1))
        return self.head(torch.cat([x[:, 0], x[:, 1:].amax(1)], -1))


# Test-time perturbations by condition name; a condition's settings are the function's keyword arguments.
PERTURBATIONS = {"jitter": jitter, "dropout": drop_points}


class PointCloudTask(ClassificationTask):
    """Classification; at test time also on the test clouds under each of ``perturbations`` (the
    task config): ``jitter`` (clipped Gaussian noise: sigma, clip) and ``dropout`` (a ratio of each
    cloud's points dropped), logged as ``test/acc_jitter`` and ``test/acc_dropout``."""

    def perturb(self, points: Tensor, condition: str, settings: Jitter | PointDropout,
                generator: torch.Generator) -> Tensor:
        return PERTURBATIONS[condition](points, **dict(settings), generator=generator)
