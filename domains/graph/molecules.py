"""Molecules read with RDKit from SMILES: QM9 as ``qm9pack`` ships it (the embedded default, with its
graph-level properties, or, as ``qm9_atoms``, per-atom targets RDKit computes: the node-level default) and
any CSV of SMILES + target columns.

A molecule becomes a PyG ``Data`` with PyG's categorical atom features ``x`` [N, 9] and bond features
``edge_attr`` [E, 3] (long). Graph-level targets are ``y`` [1, T]; per-atom ones are ``y`` [N] (classes)
or [N, T] (values) with ``target_mask`` [N] marking every atom as labelled. The molecules are split by
``data.split_column`` (a CSV's own split), else by ``data.split_by``: at random or by scaffold.
"""
from __future__ import annotations

import importlib.util
import logging
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import torch
from torch import Tensor
from torch_geometric.data import Data

from common.data import DataError, check_finite, read_csv, require_path
from common.errors import ConfigError
from common.optional import install_command, require

from .config import Data as DataConfig
from .splits import LoadedGraphs, by_members, check_split_by, column_split, random_split, scaffold_split

log = logging.getLogger(__name__)

QM9_FILES = ("qm9_part1.csv", "qm9_part2.csv", "qm9_part3.csv")
# The usual short names of the QM9 targets -> qm9pack's columns (any column name works as well).
QM9_COLUMNS = {
    "mu": "Dipole_debye", "alpha": "Polarizability_bohr3", "homo": "HOMO_au", "lumo": "LUMO_au",
    "gap": "HOMO_LUMO_gap_au", "r2": "R2_bohr2", "zpve": "ZPVE_au", "u0": "InternalEnergy_0K_au",
    "u298": "InternalEnergy_298K_au", "h298": "Enthalphy_298K_au", "g298": "GibbsFreeEnergy_298K_au",
    "cv": "Heatcapacity_Cv_cal_mol_K",
}
RING_CLASSES = ["none", "3", "4", "5", "6", "7+"]  # the smallest ring through an atom


def ring_size_class(mol) -> Tensor:
    """Per atom, the class of the smallest ring through it (``RING_CLASSES``): it takes a walk around
    the ring to tell, where PyG's features only say whether an atom is in a ring at all."""
    rings = mol.GetRingInfo()
    sizes = torch.tensor([rings.MinAtomRingSize(i) for i in range(mol.GetNumAtoms())])
    return torch.where(sizes == 0, 0, sizes.clamp(3, 7) - 2)


def gasteiger_charge(mol) -> Tensor:
    """Per atom, RDKit's Gasteiger partial charge (charge equalised over the bond graph)."""
    require("rdkit.Chem.rdPartialCharges", extra="graph").ComputeGasteigerCharges(mol)
    return torch.tensor([a.GetDoubleProp("_GasteigerCharge") for a in mol.GetAtoms()], dtype=torch.float32)


ATOM_TARGETS = {"ring": ring_size_class, "charge": gasteiger_charge}


def read_molecule(smiles):
    """The RDKit molecule of a SMILES string; None when RDKit cannot read it or it has no atoms."""
    Chem, logger = require("rdkit.Chem", extra="graph"), require("rdkit.RDLogger", extra="graph")
    logger.DisableLog("rdApp.*")  # one summary line instead of an RDKit message per bad SMILES
    mol = Chem.MolFromSmiles(smiles) if isinstance(smiles, str) else None
    return mol if mol is not None and mol.GetNumAtoms() > 0 else None


def smiles_to_graph(smiles: str) -> Data | None:
    """RDKit molecule -> PyG graph with PyG's atom/bond featuriser; None when RDKit cannot read it."""
    mol = read_molecule(smiles)
    return None if mol is None else mol_to_graph(mol)


def mol_to_graph(mol) -> Data | None:
    from torch_geometric.utils import from_rdmol

    try:
        return from_rdmol(mol)
    except ValueError:  # a feature outside PyG's vocabulary (e.g. degree > 10)
        return None


Labeller = Callable[[int, object], "Tensor | None"]  # (row position, RDKit molecule) -> y, or None to skip


def featurise(smiles: list[str], label: Labeller, source: str) -> tuple[list[Data], list[int]]:
    """Graphs of the readable molecules with ``y = label(position, mol)``, and their positions in
    ``smiles``; molecules RDKit cannot read or ``label`` rejects are skipped and reported once."""
    graphs, kept = [], []
    for position, text in enumerate(smiles):
        mol = read_molecule(text)
        graph = mol_to_graph(mol) if mol is not None else None
        y = label(position, mol) if graph is not None else None
        if y is not None:
            graph.y = y
            graphs.append(graph)
            kept.append(position)
    if skipped := len(smiles) - len(graphs):
        log.warning("skipped %d of %d molecules in %s (unparsable SMILES or missing target)", skipped, len(smiles),
                    source)
    return graphs, kept


def table_labeller(values: Tensor) -> Labeller:
    """Graph-level targets: row ``position`` of ``values`` as [1, T], unless one of them is missing."""
    return lambda position, mol: values[position].view(1, -1) if bool(torch.isfinite(values[position]).all()) else None


def atom_labeller(names: list[str]) -> Labeller:
    """One per-atom target of ``ATOM_TARGETS``: ``ring`` gives classes [N], ``charge`` values [N, 1]; a
    molecule with a non-finite value is skipped."""
    if len(names) != 1 or names[0] not in ATOM_TARGETS:
        raise ConfigError(f"qm9_atoms predicts one per-atom target: data.targets=[ring] (classes) or [charge] "
                          f"(values), not {names}")
    target = ATOM_TARGETS[names[0]]

    def label(position: int, mol) -> Tensor | None:
        y = target(mol)
        if not y.is_floating_point():
            return y
        return y.view(-1, 1) if bool(torch.isfinite(y).all()) else None

    return label


def read_table(path: Path, smiles_column: str, columns: list[str], targets: list[str]) -> pd.DataFrame:
    """``columns`` of a CSV (SMILES, targets, split column); a missing file or column is a DataError."""
    require_path(path, "CSV file")
    header = read_csv(path, "CSV file", nrows=0).columns
    missing = [c for c in (smiles_column, *columns) if c not in header]
    if missing:
        raise DataError(f"{path}: no column {', '.join(map(repr, missing))} (columns: {', '.join(header)})")
    table = read_csv(path, "CSV file", usecols=list(dict.fromkeys([smiles_column, *columns])))
    check_finite(table, targets, str(path), allow_missing=True)  # a missing target skips its molecule
    return table


def subset_rows(table: pd.DataFrame, data: DataConfig) -> pd.DataFrame:
    """``data.subset`` rows drawn with ``split_seed``, in file order; all of them when subset is null."""
    if data.subset is None or data.subset >= len(table):
        return table
    order = torch.randperm(len(table), generator=torch.Generator().manual_seed(data.split_seed))
    return table.iloc[order[: data.subset].sort().values.numpy()]


def split_table(table: pd.DataFrame, smiles_column: str, label: Labeller, source: str,
                data: DataConfig) -> LoadedGraphs:
    """The featurised molecules of a table, split by its split column if it ships one, else by
    ``data.split_by``; members are the molecules' rows in the file."""
    check_split_by(data, has_smiles=True)
    graphs, kept = featurise(table[smiles_column].tolist(), label, source)
    rows = table.index[kept]
    ids = [str(r) for r in rows]
    column = data.split_column
    if column is not None:
        split = column_split(table.loc[rows, column].tolist(), ids, column, source)
    elif data.split_by == "scaffold":
        split = scaffold_split(table.loc[rows, smiles_column].tolist(), ids, data.split)
    else:
        split = random_split(ids, data)
    return by_members(graphs, ids, split)


def qm9pack_folder() -> Path:
    # qm9pack's own loader imports pkg_resources (absent from recent setuptools): read its CSVs directly.
    spec = importlib.util.find_spec("qm9pack")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(f"qm9pack is not installed; install it with {install_command('graph')}")
    return Path(spec.submodule_search_locations[0]) / "data"


def qm9_table(data: DataConfig, targets: list[str]) -> tuple[pd.DataFrame, str]:
    """QM9's three CSVs as one table (rows numbered across them) with ``targets`` columns, its
    ``data.subset``, and its name."""
    if data.split_column is not None:
        raise ConfigError("data.split_column applies to dataset csv; QM9 ships no split")
    folder = require_path(data.root, "data.root (QM9 folder)") if data.root else qm9pack_folder()
    tables = [read_table(folder / name, "SMILES", targets, targets) for name in QM9_FILES]
    return subset_rows(pd.concat(tables, ignore_index=True), data), f"QM9 ({folder})"


def qm9_splits(data: DataConfig) -> LoadedGraphs:
    targets = [QM9_COLUMNS.get(t, t) for t in data.targets]
    table, source = qm9_table(data, targets)
    values = torch.tensor(table[targets].to_numpy(dtype="float32"))
    return split_table(table, "SMILES", table_labeller(values), source, data)


def qm9_atom_splits(data: DataConfig) -> LoadedGraphs:
    """The node-level default: QM9's molecules with per-atom targets (``ATOM_TARGETS``), split by molecule."""
    label = atom_labeller(data.targets)
    table, source = qm9_table(data, [])
    loaded = split_table(table, "SMILES", label, source, data)
    for graphs in loaded.graphs.values():
        for graph in graphs:
            graph.target_mask = torch.ones(graph.num_nodes, dtype=torch.bool)  # every atom is labelled
    loaded.classes = RING_CLASSES if data.targets == ["ring"] else []
    return loaded


def csv_splits(data: DataConfig) -> LoadedGraphs:
    if data.root is None:
        raise DataError("dataset csv needs data.root=<file.csv>")
    path = require_path(data.root, "data.root (a CSV file)")
    columns = [*data.targets, *([data.split_column] if data.split_column else [])]
    table = subset_rows(read_table(path, data.smiles_column, columns, data.targets), data)
    values = torch.tensor(table[data.targets].to_numpy(dtype="float32"))
    return split_table(table, data.smiles_column, table_labeller(values), str(path), data)
