"""Graphs stored in PyG's formats under a local path, each used in the split it ships where it has one:

- ``zinc``: ZINC-12k from PyG's raw pickles (``raw/{train,val,test}.{pickle,index}``), its own split, read
  through ``RestrictedUnpickler`` (tensors only).
- ``cora``, ``citeseer``, ``pubmed``: a Planetoid citation graph from its raw files
  ``ind.<name>.{x,tx,allx,y,ty,ally,graph,test.index}``, read by PyG with the standard public split
  (the labelled training nodes, the next 500 for validation, the 1,000 of ``test.index``). The files are
  Python pickles, and unpickling runs what a file names: each is first read by ``RestrictedUnpickler``,
  which builds only what a Planetoid file holds (numpy arrays, a scipy CSR matrix, the adjacency lists),
  and a file that names anything else is refused before PyG reads it.
- ``pyg``: any dataset PyG saved (``InMemoryDataset.save``, e.g. a ``processed/data.pt``): one file, or
  a folder of ``train.pt`` with ``val.pt`` and/or ``test.pt`` (its split). Targets ``y`` with a row per
  node make a node task, one row per graph a graph task; integer targets are classes, floats are
  regressed. One graph with a target per node is split by its nodes: by its ``train_mask``/``val_mask``/
  ``test_mask`` if it has them, else at random; otherwise the graphs are split, at random unless the
  folder ships the split.

Graphs come out with ``x`` (categorical long or float features; one constant feature where a dataset has
none), ``edge_attr`` (one constant bond type where it has none) and ``y``, and a node task's graphs
with ``target_mask`` or, transductive, the split's node ``masks``.
"""
from __future__ import annotations

import collections
import io
import pickle
from pathlib import Path

import numpy as np
import scipy.sparse
import torch
from torch import Tensor
from torch_geometric.data import Data, InMemoryDataset

from common.data import SPLITS, DataError, Split, data_root, refused_global, require_path, shipped_split
from common.files import MiB, read_text

from .config import Data as DataConfig
from .splits import LoadedGraphs, by_members, check_split_by, random_split

ZINC_RAW_FILES = [f"{split}.{ext}" for ext in ("pickle", "index") for split in SPLITS]
PLANETOID = {"cora": "Cora", "citeseer": "CiteSeer", "pubmed": "PubMed"}  # dataset name -> PyG's folder name
SHIPPED_CORA = Path(__file__).parent / "planetoid"  # Cora's ind.cora.* files, with the release's LICENSE
PLANETOID_FILES = ("x", "tx", "allx", "y", "ty", "ally", "graph", "test.index")
# The classes and functions a Planetoid pickle names (Python 2's pickles, with the module paths of their
# day), and what each is today; ndarray's own reduction gives numpy's array-rebuilding function.
PLANETOID_GLOBALS = {("numpy", "ndarray"): np.ndarray, ("numpy", "dtype"): np.dtype,
                     ("numpy.core.multiarray", "_reconstruct"): np.ndarray((0,)).__reduce__()[0],
                     ("scipy.sparse.csr", "csr_matrix"): scipy.sparse.csr_matrix,
                     ("collections", "defaultdict"): collections.defaultdict, ("__builtin__", "list"): list}
PLANETOID_GLOBALS |= {("numpy._core.multiarray", "_reconstruct"): PLANETOID_GLOBALS["numpy.core.multiarray", "_reconstruct"],
                      ("scipy.sparse._csr", "csr_matrix"): scipy.sparse.csr_matrix, ("builtins", "list"): list}  # Python 3's
# What ZINC's raw pickles name: lists of dicts of tensors, whose storages were written by torch.save and
# are read back with weights_only (``torch.storage._load_from_bytes`` would unpickle anything).
ZINC_GLOBALS = {("torch._utils", "_rebuild_tensor_v2"): torch._utils._rebuild_tensor_v2,
                ("torch._utils", "_rebuild_tensor"): torch._utils._rebuild_tensor,
                ("torch.storage", "_load_from_bytes"): lambda b: torch.load(io.BytesIO(b), weights_only=True),
                ("collections", "OrderedDict"): collections.OrderedDict}
# What reading a file that is not what it should be raises, from pickle, torch and PyG.
MAX_INDEX_BYTES = 16 * MiB  # a ZINC split's index: comma-separated molecule numbers (the full set's train is about 1.5 MiB)
UNREADABLE = (OSError, EOFError, pickle.UnpicklingError, KeyError, RuntimeError, ValueError, TypeError,
              AttributeError, AssertionError, IndexError)


def standard_graph(graph: Data) -> Data:
    """``graph`` with 2-D ``x`` and ``edge_attr``, one constant categorical column where it has none, and
    nothing else but ``edge_index``, ``y`` and split masks (other attributes would not collate alike)."""
    x = graph.x if graph.x is not None else torch.zeros(graph.num_nodes, dtype=torch.long)
    edges = graph.edge_attr if graph.edge_attr is not None else torch.zeros(graph.num_edges, dtype=torch.long)
    kept = Data(x=x.view(graph.num_nodes, -1), edge_index=graph.edge_index, edge_attr=edges.view(graph.num_edges, -1),
                y=graph.y)
    for split in SPLITS:
        if f"{split}_mask" in graph:
            kept[f"{split}_mask"] = graph[f"{split}_mask"]
    return kept


def zinc_splits(data: DataConfig) -> LoadedGraphs:
    """ZINC-12k from PyG's raw files in its own split, read as PyG's ``ZINC`` dataset reads them (atom types,
    the bond-type adjacency, penalised logP), but each pickle through ``RestrictedUnpickler`` and without a
    processed cache under root, which PyG would load by unpickling whatever it holds. Graphs get 2-D edge
    features and [1, 1] targets like the molecules."""
    check_split_by(data, has_smiles=False)
    # common's data_root reads a mapping (data.root, data.dataset): it gets the section's fields as one
    raw = data_root(data, "folder for PyG's ZINC (raw/ holds its pickles)", folder=True) / "raw"
    missing = [name for name in ZINC_RAW_FILES if not (raw / name).is_file()]
    if missing:
        raise DataError(f"ZINC files missing under {raw}: {', '.join(missing)}")
    graphs, members = {}, {}
    for split in SPLITS:
        molecules = unpickle(raw / f"{split}.pickle", ZINC_GLOBALS)
        try:
            index = read_text(raw / f"{split}.index", "ZINC index file", MAX_INDEX_BYTES)
            indices = [int(i) for i in index.strip().split(",")]
            graphs[split] = [zinc_graph(molecules[i]) for i in indices]
        except UNREADABLE as err:
            raise DataError(f"ZINC files under {raw} are unreadable ({split}: {type(err).__name__})") from None
        members[split] = [f"{split}/{i}" for i in range(len(indices))]
    return LoadedGraphs(graphs, Split("shipped", "ZINC-12k's split (raw/<split>.index)", members))


def zinc_graph(molecule: dict) -> Data:
    """One molecule of ZINC's raw pickles as PyG's ``ZINC.process`` builds it."""
    adjacency = molecule["bond_type"]
    edge_index = adjacency.nonzero().t().contiguous()
    return Data(x=molecule["atom_type"].long().view(-1, 1), edge_index=edge_index,
                edge_attr=adjacency[edge_index[0], edge_index[1]].long().view(-1, 1),
                y=molecule["logP_SA_cycle_normalized"].float().view(1, 1))


def planetoid_folder(root: Path, name: str) -> Path:
    """The folder holding ``ind.<name>.*``: root itself, its raw/, or PyG's <root>/<Name>/raw/."""
    for folder in (root, root / "raw", root / PLANETOID[name] / "raw"):
        if (folder / f"ind.{name}.x").exists():
            return folder
    raise DataError(f"no ind.{name}.x under {root} (nor its raw/ or {PLANETOID[name]}/raw/); the Planetoid files "
                    f"are ind.{name}.{{{','.join(PLANETOID_FILES)}}}")


class RestrictedUnpickler(pickle.Unpickler):
    """An unpickler that builds only the globals ``allowed`` maps to what it builds them with, and refuses
    any other: unpickling calls what a file names, so a dataset's pickles are read by what its format holds."""

    def __init__(self, file, allowed: dict[tuple[str, str], object]):
        super().__init__(file, encoding="latin1")  # Python 2's pickles hold str as bytes
        self.allowed = allowed

    def find_class(self, module: str, name: str):
        if (module, name) not in self.allowed:
            raise pickle.UnpicklingError(f"it names {module}.{name}, which this dataset's files do not hold")
        return self.allowed[module, name]


def unpickle(path: Path, allowed: dict[tuple[str, str], object]):
    """``path`` read by ``RestrictedUnpickler``; a file naming anything else is a one-line ``DataError``."""
    try:
        with open(path, "rb") as file:
            return RestrictedUnpickler(file, allowed).load()
    except pickle.UnpicklingError as err:
        if "which this dataset's files do not hold" in str(err):
            raise DataError(f"{path}: {err}; refused, since unpickling it would run code") from None
        raise DataError(f"{path}: unreadable ({err})") from None
    except (OSError, EOFError) as err:
        raise DataError(f"{path}: unreadable ({type(err).__name__})") from None


def check_planetoid_files(folder: Path, name: str) -> None:
    """Every ``ind.<name>.*`` file there and not empty, each named in the one line if not, and each pickled
    one read with ``RestrictedUnpickler`` before PyG unpickles it."""
    for part in PLANETOID_FILES:
        path = folder / f"ind.{name}.{part}"
        if not path.is_file() or not path.stat().st_size:
            raise DataError(f"{path}: {'empty' if path.is_file() else 'missing'}; the Planetoid files are "
                            f"ind.{name}.{{{','.join(PLANETOID_FILES)}}}")
        if part != "test.index":  # text
            unpickle(path, PLANETOID_GLOBALS)


def planetoid_splits(data: DataConfig) -> LoadedGraphs:
    """The Planetoid citation graph ``data.dataset`` in its public split: node classification over
    bag-of-words features."""
    from torch_geometric.io import read_planetoid_data

    name = data.dataset
    check_split_by(data, has_smiles=False)
    if name == "cora" and data.root is None:  # shipped with the domain: the node-level default
        data = data.model_copy(update={"root": str(SHIPPED_CORA)})
    folder = planetoid_folder(data_root(data, f"folder of the ind.{name}.* files"), name)
    check_planetoid_files(folder, name)
    try:
        graph = read_planetoid_data(str(folder), name)
    except UNREADABLE as err:
        raise DataError(f"{folder}: the ind.{name}.* files are missing or unreadable ({type(err).__name__}: "
                        f"{str(err).splitlines()[0] if str(err) else ''})") from None
    return transductive(standard_graph(graph), mask_split(graph, f"Planetoid's public split (ind.{name}.*)"))


def mask_split(graph: Data, rule: str) -> Split:
    """The split a graph ships as node masks; of masks with a column per split (WikiCS, WebKB), the first."""
    members, columns = {}, 1
    for split in SPLITS:
        mask = graph[f"{split}_mask"]
        columns = max(columns, mask.shape[1] if mask.dim() == 2 else 1)
        mask = (mask[:, 0] if mask.dim() == 2 else mask).bool()
        members[split] = [str(i) for i in mask.nonzero().view(-1).tolist()]
    return Split("shipped", rule + (f" (column 0 of {columns})" if columns > 1 else ""), members)


def transductive(graph: Data, split: Split) -> LoadedGraphs:
    """One graph whose nodes are split: every split holds the graph, its mask the split's nodes (ids)."""
    masks = {}
    for s in SPLITS:
        masks[s] = torch.zeros(graph.num_nodes, dtype=torch.bool)
        masks[s][torch.tensor([int(i) for i in split.members[s]], dtype=torch.long)] = True
    graph = Data(x=graph.x, edge_index=graph.edge_index, edge_attr=graph.edge_attr, y=node_targets(graph))
    return LoadedGraphs({s: [graph] for s in SPLITS}, split, masks)


def node_targets(graph: Data) -> Tensor:
    """Per-node targets: classes as [N] (integer), values as [N, T] (float)."""
    y = graph.y
    if y.is_floating_point():
        return y.view(graph.num_nodes, -1)
    if y.numel() != graph.num_nodes:
        raise DataError(f"integer node targets must be one class per node, not shape {list(y.shape)} "
                        "(multi-label targets are not supported)")
    return y.view(-1).long()


def graph_targets(graph: Data) -> Tensor:
    """Per-graph targets: a class as [1] (integer), values as [1, T] (float)."""
    y = graph.y
    if y.is_floating_point():
        return y.view(1, -1)
    if y.numel() != 1:
        raise DataError(f"integer graph targets must be one class per graph, not shape {list(y.shape)}")
    return y.view(1).long()


def read_pyg(path: Path) -> list[Data]:
    """The graphs of a file written by ``InMemoryDataset.save`` (what PyG's datasets keep as processed/)."""
    require_path(path, "PyG dataset file")
    store = InMemoryDataset()
    try:  # InMemoryDataset.load itself retries a file that weights_only refuses by unpickling it whole
        saved = torch.load(path, map_location="cpu", weights_only=True)
        data, store.slices, data_cls = saved if len(saved) == 3 else (*saved, Data)
        store.data = data_cls.from_dict(data) if isinstance(data, dict) else data
        graphs = [store[i] for i in range(len(store))]
    except pickle.UnpicklingError as err:
        unsafe = refused_global(err)
        raise DataError(f"{path}: " + (f"holds objects other than tensors and PyG's data classes ({unsafe}); refused, "
                                       "since loading them would run code" if unsafe else
                                       "not a dataset saved by PyG's InMemoryDataset.save (not a torch file)")) from None
    except UNREADABLE as err:
        raise DataError(f"{path}: not a dataset saved by PyG's InMemoryDataset.save ({type(err).__name__})") from None
    if not graphs or not all(isinstance(g, Data) and g.y is not None for g in graphs):
        raise DataError(f"{path}: holds no graphs with targets y (heterogeneous graphs are not supported)")
    return [standard_graph(g) for g in graphs]


def is_node_level(graphs: list[Data]) -> bool:
    """Targets with a row per node (and some graph of several nodes, so a row is not also a graph's)."""
    return all(g.y.shape[0] == g.num_nodes for g in graphs) and any(g.num_nodes > 1 for g in graphs)


def label_graphs(graphs: list[Data], node_level: bool) -> list[Data]:
    for graph in graphs:
        if node_level:
            graph.y = node_targets(graph)
            graph.target_mask = torch.ones(graph.num_nodes, dtype=torch.bool)
        else:
            graph.y = graph_targets(graph)
    return graphs


def pyg_splits(data: DataConfig) -> LoadedGraphs:
    check_split_by(data, has_smiles=False)
    root = data_root(data, "a PyG dataset file, or a folder of train.pt, val.pt and test.pt")
    if root.is_dir():
        return pyg_folder_splits(root, data)
    graphs = read_pyg(root)
    if len(graphs) == 1 and is_node_level(graphs):
        graph = graphs[0]
        if all(f"{s}_mask" in graph for s in SPLITS):
            return transductive(graph, mask_split(graph, f"{root.name}'s train/val/test masks"))
        return transductive(graph, random_split([str(i) for i in range(graph.num_nodes)], data))
    ids = [str(i) for i in range(len(graphs))]
    return by_members(label_graphs(graphs, is_node_level(graphs)), ids, random_split(ids, data))


def pyg_folder_splits(root: Path, data: DataConfig) -> LoadedGraphs:
    """A folder's train.pt with val.pt and/or test.pt: the split it ships (``shipped_split``: without
    test.pt val is also the test set; without val.pt val is carved out of train, from ``split_seed``)."""
    files = [root / f"{s}.pt" for s in SPLITS if (root / f"{s}.pt").exists()]
    if not (root / "train.pt").exists() or len(files) < 2:
        raise DataError(f"{root} holds no train.pt with val.pt or test.pt beside it; pass one PyG dataset file "
                        "or a folder of train.pt, val.pt and test.pt")
    graphs = {f"{path.stem}/{i}": graph for path in files for i, graph in enumerate(read_pyg(path))}
    label_graphs(list(graphs.values()), is_node_level(list(graphs.values())))
    members = {path.stem: [i for i in graphs if i.startswith(f"{path.stem}/")] for path in files}
    split = shipped_split(members, " ".join(path.name for path in files), data.split, data.split_seed)
    return by_members(list(graphs.values()), list(graphs), split)
