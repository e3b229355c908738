"""The graph domain's datasets and datamodule.

``LOADERS`` (at the end) maps each dataset name to its loader: the molecules of ``molecules.py`` (qm9,
the embedded default; qm9_atoms, the embedded node-level default; csv) and the PyG-format data of
``stored.py`` (zinc; the Planetoid graphs cora, citeseer, pubmed; pyg). ``GraphDataModule`` adds
random-walk structural encodings ``pe`` [N, rwse_steps] to every graph, caches the result under
``cache_dir`` (one file per data config, so only the first run pays for RDKit and the encodings), and
describes the split for the run record. Its task follows from the data: a node task when the graphs carry ``target_mask`` (the nodes a
split labels), else a graph task; classes for integer targets, regression for float ones.
"""
from __future__ import annotations

import math
from pathlib import Path

import torch
from torch import Tensor
from torch_geometric.data import Data, InMemoryDataset
from torch_geometric.loader import DataLoader
from torch_geometric.utils import degree

from common.data import SPLITS, DataError, SplitDataModule, cached, short_hash

from .config import Data as DataConfig
from .molecules import csv_splits, qm9_atom_splits, qm9_splits
from .splits import LoadedGraphs
from .stored import planetoid_splits, pyg_splits, zinc_splits

CACHE_FORMAT = 3  # bump when what the cache holds changes, so old files are not read as new ones


class GraphSet(InMemoryDataset):
    """Graphs held collated in memory (PyG's storage format), from ``stored``: the plain form of a
    collation (its attributes as a dict, and its slices), which a cache file holds without pickled classes."""

    def __init__(self, stored: tuple[dict, dict]):
        super().__init__()
        attributes, self.slices = stored
        self.data = Data.from_dict(attributes)

    @staticmethod
    def stored(graphs: list[Data]) -> tuple[dict, dict]:
        """The plain form of ``graphs`` collated, for ``GraphSet(...)``."""
        data, slices = GraphSet.collate(graphs)
        return data.to_dict(), slices

    @property
    def stacked(self) -> Data:
        """All graphs of the set as one Data (node, edge and target rows concatenated)."""
        return self._data

    @property
    def sizes(self) -> Tensor:
        """Nodes per graph (a set of one graph is stored without slices)."""
        return self.slices["x"].diff() if self.slices else torch.tensor([self._data.num_nodes])


def random_walk_pe(graph: Data, steps: int, block: int = 2048) -> Tensor:
    """The return probabilities of the random walk P = D⁻¹A after 1..``steps`` steps, diag(P^k), as
    [N, steps] (what PyG's ``AddRandomWalkPE`` computes). Exact, on ``block`` columns of P^k at a time
    (P^k applied to unit vectors), so memory stays O(N·block) for any graph: powers of a sparse P fill
    in, which on a 20k-node citation graph would take gigabytes."""
    n = graph.num_nodes
    src, dst = graph.edge_index
    weight = 1.0 / degree(src, n).clamp(min=1)[src]
    if n <= block:
        walk_step = torch.zeros(n, n)
        walk_step[src, dst] = weight
    else:
        walk_step = torch.sparse_coo_tensor(graph.edge_index, weight, (n, n), check_invariants=True).coalesce()
    pe = torch.empty(n, steps)
    for start in range(0, n, block):
        nodes = torch.arange(start, min(n, start + block))
        columns = torch.arange(len(nodes))
        walk = torch.zeros(n, len(nodes))
        walk[nodes, columns] = 1.0
        for k in range(steps):
            walk = walk_step @ walk
            pe[nodes, k] = walk[nodes, columns]
    return pe


def normalized_rows(x: Tensor) -> Tensor:
    """Float features scaled to sum to 1 per node (GCN's preprocessing of bag-of-words rows); an all-zero
    row stays zero, and categorical (integer) features are left as they are."""
    return x / x.sum(-1, keepdim=True).clamp(min=1e-12) if x.is_floating_point() else x


class GraphDataModule(SplitDataModule):
    """Train/val/test graphs; after ``setup()`` also the split description, the class names (classes), what
    the node and edge encoders need, the train targets' mean/std, and how many keys each query attends over.

    ``data``: the domain's typed ``data`` section (``domains.graph.config.Data``).
    """

    loader_class = DataLoader  # PyG's: batches graphs

    def __init__(self, data: DataConfig, cache_dir: str | Path):
        super().__init__(data.batch_size, num_workers=data.num_workers)
        self.cfg = data
        self.cache_dir = Path(cache_dir)

    def cache_path(self) -> Path:
        cfg = self.cfg
        keys = ("dataset", "root", "targets", "smiles_column", "subset", "split", "split_by", "split_column",
                "split_seed", "rwse_steps", "normalize_features")
        content = {"format": CACHE_FORMAT, **{k: getattr(cfg, k) for k in keys}}
        if cfg.root is not None:
            content["root"] = str(Path(cfg.root).expanduser().resolve())
        return self.cache_dir / "graph" / f"{cfg.dataset}-{cfg.subset or 'all'}-{short_hash(content)}.pt"

    def setup(self, stage: str | None = None) -> None:
        if self.datasets:
            return
        stored = cached(self.cache_path(), self._build)
        self.datasets = {split: GraphSet(stored["graphs"][split]) for split in SPLITS}
        self.classes = stored["classes"]
        self.describe_split(*stored["split"])

    def _build(self) -> dict:
        loaded = LOADERS[self.cfg.dataset](self.cfg)
        for split in SPLITS:
            if not (loaded.masks[split].any() if loaded.masks else loaded.graphs[split]):
                raise DataError(f"{self.cfg.dataset}: the {split} split is empty "
                                "(use more data or other split fractions)")
        graphs = self._encode(loaded)
        return {"graphs": {split: GraphSet.stored(graphs[split]) for split in SPLITS},
                "split": tuple(loaded.split), "classes": class_names(graphs, loaded.classes)}

    def _encode(self, loaded: LoadedGraphs) -> dict[str, list[Data]]:
        """The graphs of each split with their encodings; a transductive graph is encoded once and shared
        (tensors and all) by its splits, each with its own ``target_mask``."""
        steps = self.cfg.rwse_steps
        if self.cfg.normalize_features:
            for graph in (g for split in SPLITS for g in loaded.graphs[split]):
                graph.x = normalized_rows(graph.x)
        if loaded.masks is None:
            for graph in (g for split in SPLITS for g in loaded.graphs[split]):
                graph.pe = random_walk_pe(graph, steps)
            return loaded.graphs
        graph = loaded.graphs["train"][0]
        graph.pe = random_walk_pe(graph, steps)
        return {split: [Data(**graph.to_dict(), target_mask=loaded.masks[split])] for split in SPLITS}

    # -- what the model and task are built from ------------------------------------------------
    def _feature_spec(self, key: str) -> list[int] | int:
        """What a feature encoder needs: the number of float features, or each categorical column's
        vocabulary size over all splits."""
        parts = [getattr(self.datasets[s].stacked, key) for s in SPLITS]
        if parts[0].is_floating_point():
            return parts[0].shape[1]
        values = torch.cat(parts)
        return (values.amax(0) + 1).tolist() if len(values) else [1] * values.shape[1]

    @property
    def level(self) -> str:
        """``node`` when the graphs carry ``target_mask`` (the nodes each split labels), else ``graph``."""
        return "node" if "target_mask" in self.datasets["train"].stacked else "graph"

    @property
    def node_features(self) -> list[int] | int:
        return self._feature_spec("x")

    @property
    def edge_features(self) -> list[int] | int:
        return self._feature_spec("edge_attr")

    def labelled(self, split: str) -> Tensor:
        """The targets of a split's labelled graphs or nodes."""
        stacked = self.datasets[split].stacked
        return stacked.y[stacked.target_mask] if self.level == "node" else stacked.y

    @property
    def num_outputs(self) -> int:
        """Outputs per graph or node: one logit per class, or one value per target."""
        return self.num_classes or self.labelled("train").shape[1]

    def target_stats(self) -> tuple[Tensor, Tensor]:
        """Mean and std of the train targets: the model predicts standardised targets."""
        y = self.labelled("train")
        return y.mean(0), y.std(0, correction=0).clamp_min(1e-8)

    @property
    def max_nodes(self) -> int:
        """Nodes of the largest graph of any split."""
        return max(int(self.datasets[s].sizes.max()) for s in SPLITS)

    def keys_per_query(self, sparse: bool) -> Tensor:
        """How many keys the queries of the train split attend over: dense attention spans a whole graph,
        so one count per train graph, its nodes; sparse attention spans a node's incoming edges and the
        self-loop the net adds, so one count per train node, its in-degree + 1."""
        train = self.datasets["train"]
        if not sparse:
            return train.sizes
        stacked = train.stacked
        targets = stacked.edge_index[1]
        if train.slices:  # collated edge indices count from their own graph's first node
            first_node = train.slices["x"][:-1]
            targets = targets + first_node.repeat_interleave(train.slices["edge_index"].diff())
        return degree(targets, stacked.num_nodes).long() + 1


def nearest_rank(values: Tensor, percentile: float) -> int:
    """The ``percentile`` of ``values`` by nearest rank: the smallest value that at least ``percentile``
    percent of them do not exceed (always one of the values, so a count stays a count)."""
    rank = max(1, math.ceil(percentile * len(values) / 100))
    return int(torch.kthvalue(values.flatten(), rank).values)


def class_names(graphs: dict[str, list[Data]], named: list[str]) -> list[str]:
    """Integer targets' class names: ``named`` (the loader's), else their numbers up to the largest label
    of a labelled graph or node; none for float targets. A negative label is a DataError."""
    labels = torch.cat([g.y[g.target_mask] if "target_mask" in g else g.y for split in SPLITS for g in graphs[split]])
    if labels.is_floating_point():
        return []
    if int(labels.min()) < 0:
        raise DataError(f"class labels must be >= 0, found {int(labels.min())}")
    return named or [str(c) for c in range(int(labels.max()) + 1)]


# data.dataset -> its loader (config.DATASETS names them)
LOADERS = {"qm9": qm9_splits, "qm9_atoms": qm9_atom_splits, "csv": csv_splits, "zinc": zinc_splits, "pyg": pyg_splits,
           **dict.fromkeys(("cora", "citeseer", "pubmed"), planetoid_splits)}
