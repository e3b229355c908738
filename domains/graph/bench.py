"""Training steps per second: our GPS layer (``common.attention``, variant standard, dense mode) against
PyG's ``GPSConv`` (``torch.nn.MultiheadAttention``) at the same size, in one process, on the same
random ZINC-sized graph batch. Rounds alternate between the two so machine load hits both alike.

    quest graph-bench [--dim 64 --depth 10 --heads 4 --graphs 32 --nodes 23 --steps 20]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn
from torch_geometric import seed_everything
from torch_geometric.data import Batch
from torch_geometric.datasets import FakeDataset
from torch_geometric.nn import GPSConv, global_add_pool

from common.attention import AttentionState
from common.schema import Attention

from .model import GPSLayer, graph_attention_layer, local_mpnn


class OursStack(nn.Module):
    def __init__(self, dim: int, depth: int, heads: int):
        super().__init__()
        attn_layer = graph_attention_layer("dense", Attention(variant="standard"))
        self.layers = nn.ModuleList(GPSLayer(dim, heads, "dense", attn_layer) for _ in range(depth))

    def forward(self, g: Batch) -> torch.Tensor:
        x, state = g.x, AttentionState()
        for layer in self.layers:
            x = layer(x, g.edge_index, g.edge_attr, g.batch, state=state)
        return x


class PygStack(nn.Module):
    def __init__(self, dim: int, depth: int, heads: int):
        super().__init__()
        self.layers = nn.ModuleList(GPSConv(dim, local_mpnn("gine", dim, heads), heads=heads) for _ in range(depth))

    def forward(self, g: Batch) -> torch.Tensor:
        x = g.x
        for layer in self.layers:
            x = layer(x, g.edge_index, g.batch, edge_attr=g.edge_attr)
        return x


def steps_per_second(model: nn.Module, graph: Batch, steps: int) -> float:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step():
        optimizer.zero_grad(set_to_none=True)
        global_add_pool(model(graph), graph.batch).square().mean().backward()
        optimizer.step()

    step()  # warm-up: allocator, lazy init
    if graph.x.is_cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    if graph.x.is_cuda:
        torch.cuda.synchronize()
    return steps / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(prog="quest graph-bench", description=__doc__.splitlines()[0])
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--depth", type=int, default=10)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--graphs", type=int, default=32, help="graphs per batch")
    parser.add_argument("--nodes", type=int, default=23, help="average nodes per graph (ZINC: 23)")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    seed_everything(args.seed)  # FakeDataset draws graph sizes from `random`
    graphs = FakeDataset(args.graphs, avg_num_nodes=args.nodes, avg_degree=2, num_channels=args.dim,
                         edge_dim=args.dim, task="graph")
    graph = Batch.from_data_list(list(graphs)).to(args.device)
    models = {
        "ours: GPSLayer (standard)": OursStack(args.dim, args.depth, args.heads),
        "PyG: GPSConv (nn.MultiheadAttention)": PygStack(args.dim, args.depth, args.heads),
    }
    rates = {name: [] for name in models}
    for _ in range(args.rounds):
        for name, model in models.items():
            rates[name].append(steps_per_second(model.to(args.device).train(), graph, args.steps))

    medians = {name: statistics.median(r) for name, r in rates.items()}
    print(f"device {args.device} ({torch.get_num_threads()} threads), {args.graphs} graphs x ~{args.nodes} nodes "
          f"({graph.num_nodes} nodes, {graph.num_edges} edges), dim {args.dim}, depth {args.depth}, "
          f"heads {args.heads}, median of {args.rounds} rounds x {args.steps} steps")
    print(f"{'model':40s} {'params':>8s} {'steps/s':>9s}")
    for name, model in models.items():
        print(f"{name:40s} {sum(p.numel() for p in model.parameters()):8d} {medians[name]:9.2f}")
    ours, pyg = medians.values()
    print(f"ratio ours / PyG: {ours / pyg:.3f}")
    return medians


if __name__ == "__main__":
    main()
