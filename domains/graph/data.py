"""Molecular graphs for the graph domain: QM9 shipped by ``qm9pack`` (embedded default), ZINC-12k in
PyG's on-disk format, or any CSV of SMILES + target column(s).

Every molecule becomes a PyG ``Data`` with long-typed categorical atom features ``x`` [N, F], bond
features ``edge_attr`` [E, F'], targets ``y`` [1, T] and random-walk structural encodings ``pe``
[N, rwse_steps]. ``DATASETS`` maps each dataset name to the function that loads its graphs per split;
the featurised splits are cached under ``cache_dir`` (one file per data config), so only the first run
pays for RDKit and the encodings.
"""
from __future__ import annotations

import importlib.util
import logging
import pickle
from pathlib import Path

import pandas as pd
import torch
from torch_geometric.data import Data, InMemoryDataset
from torch_geometric.loader import DataLoader
from torch_geometric.transforms import AddRandomWalkPE

from common.data import (
    SPLITS,
    DataError,
    SplitDataModule,
    cached,
    check_finite,
    require_path,
    seeded_split,
    short_hash,
)

log = logging.getLogger(__name__)

QM9_FILES = ("qm9_part1.csv", "qm9_part2.csv", "qm9_part3.csv")
# The usual short names of the QM9 targets -> qm9pack's columns (any column name works as well).
QM9_COLUMNS = {
    "mu": "Dipole_debye", "alpha": "Polarizability_bohr3", "homo": "HOMO_au", "lumo": "LUMO_au",
    "gap": "HOMO_LUMO_gap_au", "r2": "R2_bohr2", "zpve": "ZPVE_au", "u0": "InternalEnergy_0K_au",
    "u298": "InternalEnergy_298K_au", "h298": "Enthalphy_298K_au", "g298": "GibbsFreeEnergy_298K_au",
    "cv": "Heatcapacity_Cv_cal_mol_K",
}
ZINC_RAW_FILES = [f"{split}.{ext}" for ext in ("pickle", "index") for split in SPLITS]


class GraphSet(InMemoryDataset):
    """Graphs held collated in memory (PyG's storage format), built from a list or a cached collation."""

    def __init__(self, collated: tuple):
        super().__init__()
        self.data, self.slices = collated

    @property
    def stacked(self) -> Data:
        """All graphs of the set as one Data (node, edge and target rows concatenated)."""
        return self._data


def qm9pack_folder() -> Path:
    # qm9pack's own loader imports pkg_resources (absent from recent setuptools): read its CSVs directly.
    spec = importlib.util.find_spec("qm9pack")
    if spec is None or not spec.submodule_search_locations:
        raise DataError("package qm9pack is not installed (pip install qm9pack)")
    return Path(spec.submodule_search_locations[0]) / "data"


def smiles_to_graph(smiles: str) -> Data | None:
    """RDKit molecule -> PyG graph with PyG's atom/bond featuriser; None when RDKit cannot read it."""
    from rdkit import Chem, RDLogger
    from torch_geometric.utils import from_rdmol

    RDLogger.DisableLog("rdApp.*")  # one summary line instead of an RDKit message per bad SMILES
    mol = Chem.MolFromSmiles(smiles) if isinstance(smiles, str) else None
    if mol is None or mol.GetNumAtoms() == 0:
        return None
    try:
        return from_rdmol(mol)
    except ValueError:  # a feature outside PyG's vocabulary (e.g. degree > 10)
        return None


def featurise(smiles: list[str], targets: torch.Tensor, source: str) -> list[Data]:
    """Graphs of the readable molecules with their target rows; the rest are skipped and reported once."""
    graphs = []
    for text, y in zip(smiles, targets):
        graph = smiles_to_graph(text)
        if graph is not None and bool(torch.isfinite(y).all()):
            graph.y = y.view(1, -1)
            graphs.append(graph)
    if skipped := len(smiles) - len(graphs):
        log.warning("skipped %d of %d molecules in %s (unparsable SMILES or missing target)", skipped, len(smiles),
                    source)
    return graphs


def read_table(path: Path, smiles_column: str, targets: list[str]) -> pd.DataFrame:
    """The SMILES and target columns of a CSV; a missing file or column is a DataError."""
    require_path(path, "CSV file")
    try:
        header = pd.read_csv(path, nrows=0).columns
    except Exception as err:
        raise DataError(f"{path}: not a readable CSV ({type(err).__name__})") from None
    missing = [c for c in (smiles_column, *targets) if c not in header]
    if missing:
        raise DataError(f"{path}: no column {', '.join(map(repr, missing))} (columns: {', '.join(header)})")
    table = pd.read_csv(path, usecols=[smiles_column, *targets])
    check_finite(table, targets, str(path), allow_missing=True)  # a missing target skips its molecule
    return table


Splits = dict[str, list[Data]]  # graphs per split


def subset_rows(table: pd.DataFrame, data: dict) -> pd.DataFrame:
    """``data.subset`` rows drawn with ``split_seed``, in file order; all of them when subset is null."""
    if data["subset"] is None or data["subset"] >= len(table):
        return table
    order = torch.randperm(len(table), generator=torch.Generator().manual_seed(data["split_seed"]))
    return table.iloc[order[: data["subset"]].sort().values.numpy()]


def table_splits(table: pd.DataFrame, smiles_column: str, targets: list[str], source: str, data: dict) -> Splits:
    """The featurised molecules of a table, split by ``data.split`` with ``split_seed``."""
    table = subset_rows(table, data)
    values = torch.tensor(table[targets].to_numpy(dtype="float32"))
    graphs = featurise(table[smiles_column].tolist(), values, source)
    parts = seeded_split(len(graphs), tuple(data["split"]), data["split_seed"])
    return {split: [graphs[i] for i in idx] for split, idx in zip(SPLITS, parts)}


def qm9_splits(data: dict) -> Splits:
    folder = require_path(data["root"], "QM9 folder") if data["root"] else qm9pack_folder()
    targets = [QM9_COLUMNS.get(t, t) for t in data["targets"]]
    tables = [read_table(folder / name, "SMILES", targets) for name in QM9_FILES]
    return table_splits(pd.concat(tables, ignore_index=True), "SMILES", targets, f"QM9 ({folder})", data)


def csv_splits(data: dict) -> Splits:
    if data["root"] is None:
        raise DataError("dataset csv needs data.root=<file.csv>")
    path = Path(data["root"]).expanduser()
    table = read_table(path, data["smiles_column"], data["targets"])
    return table_splits(table, data["smiles_column"], data["targets"], str(path), data)


def zinc_splits(data: dict) -> Splits:
    """ZINC-12k through PyG (its own processed cache lives under root) in its own split; graphs get 2-D
    edge features and [1, 1] targets like the other datasets. Without files PyG tries to download them."""
    from torch_geometric.datasets import ZINC

    if data["root"] is None:
        raise DataError("dataset zinc needs data.root=<folder for PyG's ZINC (raw/ holds its pickles)>")
    root = Path(data["root"]).expanduser()
    present = all((root / "raw" / name).exists() for name in ZINC_RAW_FILES)
    splits = {}
    for split in SPLITS:
        try:
            dataset = ZINC(str(root), subset=True, split=split)
        except (OSError, pickle.UnpicklingError, KeyError, RuntimeError, ValueError) as err:
            what = "unreadable" if present else f"missing ({', '.join(ZINC_RAW_FILES)}) and could not be downloaded"
            raise DataError(f"ZINC files under {root / 'raw'} are {what}: {type(err).__name__}") from None
        splits[split] = [Data(x=g.x, edge_index=g.edge_index, edge_attr=g.edge_attr.view(-1, 1), y=g.y.view(1, 1))
                         for g in dataset]
    return splits


DATASETS = {"qm9": qm9_splits, "zinc": zinc_splits, "csv": csv_splits}


class GraphDataModule(SplitDataModule):
    """Train/val/test molecule graphs; after ``setup()`` also the vocabulary sizes of the categorical
    atom/bond features, the train-split target mean/std, and the typical graph size and degree."""

    loader_class = DataLoader  # PyG's: batches graphs

    def __init__(self, data: dict, cache_dir: str | Path):
        super().__init__(data["batch_size"], num_workers=data["num_workers"])
        self.cfg = data
        self.cache_dir = Path(cache_dir)

    def cache_path(self) -> Path:
        cfg = self.cfg
        keys = ("dataset", "root", "targets", "smiles_column", "subset", "split", "split_seed", "rwse_steps")
        content = {k: cfg[k] for k in keys}
        if cfg["root"] is not None:
            content["root"] = str(Path(cfg["root"]).expanduser().resolve())
        return self.cache_dir / "graph" / f"{cfg['dataset']}-{cfg['subset'] or 'all'}-{short_hash(content)}.pt"

    def setup(self, stage: str | None = None) -> None:
        if self.datasets:
            return
        collated = cached(self.cache_path(), self._build)
        self.datasets = {split: GraphSet(collated[split]) for split in SPLITS}

    def _build(self) -> dict:
        splits = DATASETS[self.cfg["dataset"]](self.cfg)
        for split, graphs in splits.items():
            if not graphs:
                raise DataError(f"{self.cfg['dataset']}: the {split} split is empty "
                                "(use more data or other split fractions)")
        encode = AddRandomWalkPE(self.cfg["rwse_steps"], attr_name="pe")
        return {split: GraphSet.collate([encode(g) for g in graphs]) for split, graphs in splits.items()}

    # -- statistics the model is built from ----------------------------------------------------
    def _all(self, key: str) -> torch.Tensor:
        return torch.cat([getattr(self.datasets[s].stacked, key) for s in SPLITS])

    @property
    def node_vocab(self) -> list[int]:
        return (self._all("x").amax(0) + 1).tolist()

    @property
    def edge_vocab(self) -> list[int]:
        edge_attr = self._all("edge_attr")
        return (edge_attr.amax(0) + 1).tolist() if len(edge_attr) else [1] * edge_attr.shape[1]

    @property
    def num_targets(self) -> int:
        return self.datasets["train"].stacked.y.shape[1]

    def target_stats(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean and std of the train targets: the model predicts standardised targets."""
        y = self.datasets["train"].stacked.y
        return y.mean(0), y.std(0, correction=0).clamp_min(1e-8)

    @property
    def mean_nodes(self) -> float:
        train = self.datasets["train"]
        return train.stacked.num_nodes / len(train)

    @property
    def mean_degree(self) -> float:
        train = self.datasets["train"]
        return train.stacked.edge_index.shape[1] / max(1, train.stacked.num_nodes)
