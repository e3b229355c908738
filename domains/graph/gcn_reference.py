"""The reference beside the citation preset: Kipf & Welling's two-layer GCN (2017) on a Planetoid graph's public
split, read by the graph domain's own loader, so both see the same nodes, features and split.

GCN's recipe: bag-of-words rows scaled to sum to 1, dropout 0.5 on each layer's input, 16 hidden units, Adam at
0.01 with L2 5e-4 on the first layer's weights only, 200 full-graph epochs, the epoch of best validation accuracy
kept (its test accuracy reported). Published on Cora's public split: 81.5%.

    quest gcn-reference [--dataset cora --root <folder of ind.<name>.*> --seeds 0 1 2 3 4]
"""
from __future__ import annotations

import argparse
import math
import statistics

import torch
import torch.nn.functional as F
from scipy import stats
from torch import nn
from torch_geometric import seed_everything
from torch_geometric.nn import GCNConv

from .config import Data
from .data import normalized_rows
from .stored import planetoid_splits


class GCN(nn.Module):
    def __init__(self, features: int, hidden: int, classes: int, dropout: float = 0.5):
        super().__init__()
        self.conv1, self.conv2 = GCNConv(features, hidden), GCNConv(hidden, classes)
        self.dropout = dropout

    def forward(self, x, edge_index):
        x = F.dropout(x, self.dropout, self.training)
        x = F.relu(self.conv1(x, edge_index))
        return self.conv2(F.dropout(x, self.dropout, self.training), edge_index)


def train(graph, masks: dict, seed: int, epochs: int = 200) -> tuple[float, float]:
    """(validation, test) accuracy at the epoch of best validation accuracy (the first, on ties)."""
    seed_everything(seed)
    model = GCN(graph.x.shape[1], 16, int(graph.y.max()) + 1)
    optimizer = torch.optim.Adam([{"params": model.conv1.parameters(), "weight_decay": 5e-4},
                                  {"params": model.conv2.parameters(), "weight_decay": 0.0}], lr=0.01)
    best = (-1.0, 0.0)
    for _ in range(epochs):
        model.train()
        optimizer.zero_grad()
        F.cross_entropy(model(graph.x, graph.edge_index)[masks["train"]], graph.y[masks["train"]]).backward()
        optimizer.step()
        model.eval()
        with torch.no_grad():
            correct = model(graph.x, graph.edge_index).argmax(-1) == graph.y
        val = correct[masks["val"]].float().mean().item()
        if val > best[0]:
            best = (val, correct[masks["test"]].float().mean().item())
    return best


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="quest gcn-reference", description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default="cora", choices=["cora", "citeseer", "pubmed"])
    parser.add_argument("--root", default=None, help="folder of ind.<name>.* (Cora: the shipped files)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    loaded = planetoid_splits(Data(dataset=args.dataset, root=args.root))
    graph, masks = loaded.graphs["train"][0], loaded.masks
    graph.x, graph.y = normalized_rows(graph.x), graph.y.view(-1)
    tests = []
    for seed in args.seeds:
        val, test = train(graph, masks, seed)
        tests.append(test)
        print(f"seed {seed}: val {val:.3f} test {test:.3f}")
    line = f"GCN on {args.dataset}: test accuracy {statistics.fmean(tests):.4f}"
    if len(tests) > 1:
        half = stats.t.ppf(0.975, len(tests) - 1) * statistics.stdev(tests) / math.sqrt(len(tests))
        line += f" ± {half:.4f} (95% t-interval, {len(tests)} seeds)"
    print(line)


if __name__ == "__main__":
    main()
