"""How the graph domain's datasets are split, and what each loader hands the datamodule.

A loader returns ``LoadedGraphs``: the graphs of each split and a ``common.data.Split`` saying how they
were split (``shipped``, ``random`` or ``grouped``, the rule in words, and each split's member ids, which
the run record hashes). A dataset's own split is used as shipped (ZINC's index files, Planetoid's public
split, a PyG file's masks or split files, a CSV's split column); only data that ships none is split here,
at random from ``data.split_seed`` or, for molecules, by Bemis–Murcko scaffold (MoleculeNet's rule, no
randomness at all). No split depends on the training seed.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from torch import Tensor
from torch_geometric.data import Data

from common.data import SPLITS, DataError, Split, check_fractions, split_names
from common.errors import ConfigError
from common.optional import require

from .config import Data as DataConfig

# What a CSV's split column may hold, and the split each value names (OGB writes "valid").
COLUMN_VALUES = {"train": "train", "val": "val", "valid": "val", "validation": "val", "test": "test"}


@dataclass
class LoadedGraphs:
    """A loader's graphs per split and how they were split. A transductive node task (one graph whose
    nodes are split, as in Planetoid) has its one graph in every split and ``masks``: the nodes each split
    labels. ``classes`` names the classes of integer targets when the data knows their names."""

    graphs: dict[str, list[Data]]
    split: Split
    masks: dict[str, Tensor] | None = None
    classes: list[str] = field(default_factory=list)


def by_members(graphs: list[Data], ids: list[str], split: Split) -> LoadedGraphs:
    """The graphs of each split of ``split``, whose members are ids out of ``ids`` (one per graph)."""
    index = dict(zip(ids, graphs))
    return LoadedGraphs({s: [index[i] for i in split.members[s]] for s in SPLITS}, split)


def random_split(ids: list[str], data: DataConfig) -> Split:
    """``data.split`` fractions of ``ids`` at random, from ``data.split_seed``."""
    return split_names(ids, data.split, data.split_seed)


def check_split_by(data: DataConfig, has_smiles: bool) -> None:
    """``data.split_by`` is scaffold only for data read from SMILES."""
    if data.split_by == "scaffold" and not has_smiles:
        raise ConfigError(f"data.split_by=scaffold needs molecules read from SMILES (qm9, qm9_atoms, csv), "
                          f"not dataset {data.dataset!r}")


def scaffold(smiles: str) -> str:
    """The Bemis–Murcko scaffold of a molecule as canonical SMILES, without chirality (MoleculeNet's
    choice); "" for a molecule without rings."""
    return require("rdkit.Chem.Scaffolds.MurckoScaffold", extra="graph").MurckoScaffoldSmiles(smiles=smiles, includeChirality=False)


def scaffold_parts(smiles: list[str], fractions) -> tuple[list[int], list[int], list[int]]:
    """MoleculeNet's scaffold split (DeepChem's ``ScaffoldSplitter``) of range(len(smiles)): molecules
    grouped by scaffold, the groups taken from largest to smallest (ties: the group seen last first), each
    into train while it fits its fraction, else into val while that fits, else into test. Rare scaffolds
    thus land in val and test, which then hold structures that training never saw."""
    fractions = check_fractions(fractions)
    groups: dict[str, list[int]] = defaultdict(list)
    for i, text in enumerate(smiles):
        groups[scaffold(text)].append(i)
    ordered = sorted(groups.values(), key=lambda g: (len(g), g[0]), reverse=True)
    train_cut, val_cut = fractions[0] * len(smiles), (fractions[0] + fractions[1]) * len(smiles)
    parts: tuple[list[int], list[int], list[int]] = ([], [], [])
    for group in ordered:
        if len(parts[0]) + len(group) <= train_cut:
            parts[0].extend(group)
        elif len(parts[0]) + len(parts[1]) + len(group) <= val_cut:
            parts[1].extend(group)
        else:
            parts[2].extend(group)
    return parts


def scaffold_split(smiles: list[str], ids: list[str], fractions) -> Split:
    parts = scaffold_parts(smiles, fractions)
    shares = "/".join(f"{fraction:.4g}" for fraction in check_fractions(fractions))  # as split_names writes them
    return Split("grouped", f"fractions {shares} by Bemis-Murcko scaffold, largest groups first (MoleculeNet)",
                 {split: [ids[i] for i in part] for split, part in zip(SPLITS, parts)})


def column_split(values: list, ids: list[str], column: str, source: str) -> Split:
    """The split a column ships: each row's value names its split (train, val or valid, test). ``ids`` are
    the rows' 0-based positions in the file, which locate a bad value by its line."""
    members: dict[str, list[str]] = {split: [] for split in SPLITS}
    for row, value in zip(ids, values):
        split = COLUMN_VALUES.get(str(value).strip().lower())
        if split is None:
            raise DataError(f"{source}: column {column!r} holds {value!r} at line {int(row) + 2}; "
                            "expected train, val (or valid) or test")
        members[split].append(row)
    return Split("shipped", f"column {column!r}", members)
