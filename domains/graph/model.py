"""GPS graph transformer (Rampášek et al. 2022) with the shared attention core, and its tasks: regression
or classification, of each graph (pooled) or of each node.

One GPS layer runs a local message-passing layer (GINEConv on bond features) and global attention in
parallel, each with a residual and a norm, sums them, then applies an MLP with its own residual and
norm. Global attention is either dense (every node of a graph attends over all nodes of that graph:
``to_dense_batch`` + key-padding mask) or sparse (each node attends over its neighbours and itself
through ``EdgeMultiheadAttention``). In both modes the layers of a net share one ``AttentionState`` per
forward pass, which carries what each attention layer leaves for the next (elliptical variants need it).
Sparse mode is the one for graphs too large for dense attention (a citation graph of 20k nodes would
need 20k² logits per head); its cost grows with the edges.

A node task answers for the nodes its split labels (``graph.target_mask``): the net predicts every
node, since all of them pass messages and are attended to, and the task keeps the labelled ones.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch_geometric.nn import GATConv, GCNConv, GINEConv, global_add_pool, global_mean_pool
from torch_geometric.utils import add_self_loops, to_dense_batch
from torchmetrics import MeanAbsoluteError, MeanSquaredError

from common.attention import AttentionState, EdgeMultiheadAttention, MultiheadAttention, attention_layer
from common.blocks import AttentionFactory
from common.metrics import MeanPredictorError
from common.schema import Attention
from common.task import Optim, Task, classification_metrics

NORMS = {"batch_norm": nn.BatchNorm1d, "layer_norm": nn.LayerNorm, "none": lambda dim: nn.Identity()}
POOLS = {"add": global_add_pool, "mean": global_mean_pool}
LOSSES = {"l1": F.l1_loss, "mse": F.mse_loss}


def local_mpnn(kind: str, dim: int, heads: int) -> nn.Module:
    """The local message passing of a GPS layer. ``gine``, GPS's choice for molecules: a two-layer MLP on
    messages that carry bond features. ``gcn`` and ``gat``, the citation-graph layers (Kipf and Welling 2017,
    Veličković et al. 2018): one linear map of the neighbours and the node itself, degree-normalised or
    attention-weighted, without edge features."""
    layers = {"gine": lambda: GINEConv(nn.Sequential(nn.Linear(dim, dim), nn.ReLU(), nn.Linear(dim, dim))),
              "gcn": lambda: GCNConv(dim, dim), "gat": lambda: GATConv(dim, dim // heads, heads=heads)}
    return _choice(layers, kind, "local")()


def _choice(table: dict, name: str, what: str):
    if name not in table:
        raise ValueError(f"unknown {what} {name!r}; choose from {', '.join(table)}")
    return table[name]


ATTENTION_LAYERS = {"dense": MultiheadAttention, "sparse": EdgeMultiheadAttention}  # by model.attention_mode


def graph_attention_layer(mode: str, settings: Attention) -> AttentionFactory:
    """The factory of a GPS net's attention layers: ``mode``'s layer (``ATTENTION_LAYERS``) with the run's
    attention ``settings``."""
    return attention_layer(_choice(ATTENTION_LAYERS, mode, "attention_mode"), **dict(settings))


class GlobalAttention(nn.Module):
    """Attention of each node over its whole graph (``dense``) or over its incoming edges (``sparse``), by a
    layer of ``attn_layer`` (``graph_attention_layer`` of the same mode)."""

    def __init__(self, dim: int, heads: int, mode: str, attn_layer: AttentionFactory, *, dropout: float = 0.0,
                 seq_len: int | None = None):
        super().__init__()
        self.mode = mode
        self.attn = attn_layer(dim, heads, dropout=dropout, seq_len=seq_len)

    def forward(self, x: Tensor, batch: Tensor, attn_edge_index: Tensor | None, state: AttentionState | None) -> Tensor:
        if self.mode == "sparse":
            return self.attn(x, attn_edge_index, batch=batch, state=state)
        dense, mask = to_dense_batch(x, batch)
        out, _ = self.attn(dense, dense, dense, key_padding_mask=~mask, state=state)
        return out[mask]


class GPSLayer(nn.Module):
    """Post-norm GPS layer, shaped like PyG's ``GPSConv`` (MLP width 2·dim, ReLU). Citation graphs may drop parts
    GCN's and GAT's layers lack: each branch's skip connection (``local_residual``, ``global_residual``: off, the
    branch passes on its messages alone) and the feed-forward block (``ffn``: off, the sum of the branches is the
    layer's output)."""

    def __init__(self, dim: int, heads: int, mode: str, attn_layer: AttentionFactory, *, local: str = "gine",
                 local_residual: bool = True, global_residual: bool = True, ffn: bool = True, dropout: float = 0.0,
                 attn_dropout: float = 0.0, norm: str = "batch_norm", seq_len: int | None = None):
        super().__init__()
        norm_cls = _choice(NORMS, norm, "norm")
        self.local = local_mpnn(local, dim, heads)
        self.local_residual, self.global_residual = local_residual, global_residual
        self.attn = GlobalAttention(dim, heads, mode, attn_layer, dropout=attn_dropout, seq_len=seq_len)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.ReLU(), nn.Dropout(dropout),
                                 nn.Linear(2 * dim, dim), nn.Dropout(dropout)) if ffn else None
        self.norm_local, self.norm_attn = norm_cls(dim), norm_cls(dim)
        self.norm_out = norm_cls(dim) if ffn else None
        self.drop = nn.Dropout(dropout)

    def forward(self, x: Tensor, edge_index: Tensor, edge_attr: Tensor, batch: Tensor, *,
                attn_edge_index: Tensor | None = None, state: AttentionState | None = None) -> Tensor:
        messages = self.local(x, edge_index, edge_attr) if isinstance(self.local, GINEConv) else self.local(x, edge_index)
        local = self.norm_local((x if self.local_residual else 0) + self.drop(messages))
        h = self.attn(x, batch, attn_edge_index, state)
        out = local + self.norm_attn((x if self.global_residual else 0) + self.drop(h))
        return out if self.mlp is None else self.norm_out(out + self.mlp(out))


class CategoricalEmbedding(nn.Module):
    """Sum of one embedding per categorical feature column (OGB's AtomEncoder/BondEncoder scheme)."""

    def __init__(self, vocab: list[int], dim: int):
        super().__init__()
        self.tables = nn.ModuleList(nn.Embedding(n, dim) for n in vocab)

    def forward(self, features: Tensor) -> Tensor:
        return sum(table(features[:, i]) for i, table in enumerate(self.tables))


def feature_encoder(spec: list[int] | int, dim: int) -> nn.Module:
    """Categorical features (``spec``: each column's vocabulary size) or float ones (``spec``: how many)."""
    return CategoricalEmbedding(spec, dim) if isinstance(spec, list) else nn.Linear(spec, dim)


class GPSNet(nn.Module):
    """Node features ‖ projected RWSE → GPS layers → (graph level: pooling →) MLP head, ``num_outputs``
    per graph or per node (``level``: graph | node). ``node_features`` / ``edge_features`` say what the
    encoders take (see ``feature_encoder``). ``attention`` holds the run's attention settings (variant,
    qk_gain_init, ...), made here into the factory of ``attention_mode``'s layers (``graph_attention_layer``), since
    the layer a mode takes is the model's to choose; ``seq_len`` is the typical number of keys per query, from
    which qknorm's gain starts. ``input_dropout`` drops node features before they are encoded (GCN drops its
    bag-of-words inputs at 0.5). Weight decay applies to every weight matrix (``decay: all``) or, as in GCN,
    to the node encoder's only (``decay: input``). ``pe_dim: 0`` leaves the RWSE out; ``local_residual``,
    ``global_residual`` and ``ffn`` are ``GPSLayer``'s, and ``head: linear`` drops the head's hidden layer."""

    def __init__(self, node_features: list[int] | int, edge_features: list[int] | int, num_outputs: int, *,
                 dim: int, depth: int, heads: int, rwse_steps: int, pe_dim: int, attention: Attention,
                 level: str = "graph", seq_len: int | None = None, attention_mode: str = "dense",
                 local: str = "gine", local_residual: bool = True, global_residual: bool = True, ffn: bool = True,
                 dropout: float = 0.0, attn_dropout: float = 0.0, input_dropout: float = 0.0, decay: str = "all",
                 norm: str = "batch_norm", pool: str = "add", head: str = "mlp"):
        super().__init__()
        if not 0 <= pe_dim < dim:
            raise ValueError(f"pe_dim ({pe_dim}) must lie in [0, dim ({dim})); 0 leaves the RWSE out")
        if head not in ("mlp", "linear"):
            raise ValueError(f"unknown head {head!r}; choose from mlp, linear")
        if decay not in ("all", "input"):
            raise ValueError(f"unknown decay {decay!r}; choose from all, input")
        self.decay_input_only = decay == "input"
        self.sparse = attention_mode == "sparse"
        attn_layer = graph_attention_layer(attention_mode, attention)
        self.input_drop = nn.Dropout(input_dropout)
        self.nodes = feature_encoder(node_features, dim - pe_dim)
        # return probabilities differ in scale per step; on a citation graph of few labels they let a net
        # tell the labelled nodes apart by their place in the graph, and it memorises them (pe_dim: 0)
        self.pe_norm = nn.BatchNorm1d(rwse_steps) if pe_dim else None
        self.pe = nn.Linear(rwse_steps, pe_dim) if pe_dim else None
        self.edges = feature_encoder(edge_features, dim) if local == "gine" else None  # GCN and GAT take none
        self.layers = nn.ModuleList(
            GPSLayer(dim, heads, attention_mode, attn_layer, local=local, local_residual=local_residual,
                     global_residual=global_residual, ffn=ffn, dropout=dropout, attn_dropout=attn_dropout, norm=norm,
                     seq_len=seq_len)
            for _ in range(depth))
        self.pool = _choice(POOLS, pool, "pool") if level == "graph" else None
        self.head = (nn.Sequential(nn.Linear(dim, dim), nn.ReLU(), nn.Linear(dim, num_outputs)) if head == "mlp"
                     else nn.Linear(dim, num_outputs))

    def no_weight_decay(self) -> set[str]:
        """With ``decay: input``, every parameter but the node encoder's (``common.task.Task.decayed``)."""
        if not self.decay_input_only:
            return set()
        return {name for name, _ in self.named_parameters() if not name.startswith("nodes.")}

    def forward(self, graph) -> Tensor:
        features = self.input_drop(graph.x) if graph.x.is_floating_point() else graph.x  # not categories
        x = self.nodes(features)
        if self.pe is not None:
            x = torch.cat([x, self.pe(self.pe_norm(graph.pe))], dim=-1)
        edge_attr = self.edges(graph.edge_attr) if self.edges is not None else None
        # Sparse attention: neighbours plus the node itself, so an isolated atom still attends somewhere.
        attn_edges = add_self_loops(graph.edge_index, num_nodes=x.shape[0])[0] if self.sparse else None
        state = AttentionState()
        for layer in self.layers:
            x = layer(x, graph.edge_index, edge_attr, graph.batch, attn_edge_index=attn_edges, state=state)
        return self.head(x if self.pool is None else self.pool(x, graph.batch))


class GraphTask(Task):
    """What graph and node tasks share: at node level the outputs and targets of the labelled nodes."""

    def __init__(self, net: nn.Module, optim: Optim, metrics: dict, *, level: str):
        super().__init__(net, optim, metrics)
        self.node_level = level == "node"

    def forward(self, graph) -> Tensor:
        out = self.net(graph)
        return out[graph.target_mask] if self.node_level else out

    def unpack(self, graph) -> tuple:
        return graph, graph.y[graph.target_mask] if self.node_level else graph.y


class GraphRegression(GraphTask):
    """Regression of ``y``: the net predicts targets standardised with the train split's mean and std
    (``loss``: l1 | mse on that scale), while ``mae`` and ``rmse`` are reported in the original units."""

    def __init__(self, net: nn.Module, optim: Optim, target_mean: Tensor, target_std: Tensor, *, level: str = "graph",
                 loss: str = "l1"):
        super().__init__(net, optim, {"mae": MeanAbsoluteError(), "rmse": MeanSquaredError(squared=False),
                                      "mae_baseline": MeanPredictorError(target_mean)}, level=level)
        self.loss_fn = _choice(LOSSES, loss, "loss")
        self.register_buffer("target_mean", target_mean.float())
        self.register_buffer("target_std", target_std.float())

    def loss(self, output: Tensor, target: Tensor, stage: str) -> Tensor:
        return self.loss_fn(output, (target - self.target_mean) / self.target_std)

    def predictions(self, output: Tensor, target: Tensor) -> tuple[Tensor, Tensor]:
        return output.detach() * self.target_std + self.target_mean, target


class GraphClassification(GraphTask):
    """Cross-entropy over the classes of ``y``; ``acc`` (the headline, higher is better) and ``macc``."""

    primary = ("acc", "max")  # the runner's metric for this task, in place of the domain's mae
    logit_dim = -1

    def __init__(self, net: nn.Module, optim: Optim, num_classes: int, *, level: str = "graph"):
        super().__init__(net, optim, classification_metrics(num_classes), level=level)

    def loss(self, output: Tensor, target: Tensor, stage: str) -> Tensor:
        return F.cross_entropy(output, target)
