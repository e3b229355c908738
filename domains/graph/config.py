"""The graph domain's config: its typed ``data``, ``model`` and ``task`` sections and its defaults of the shared
ones. Its presets are in configs/domain/graph.yaml."""
from typing import Annotated, Literal

from pydantic import Field

from common.schema import Count, Fraction, Optim, Positive, RunConfig, Seed, Trainer
from common.sections import Encoder, Loader
from common.typed import Model

# dataset name -> loader: the molecules of molecules.py, the PyG-format data of stored.py
DATASETS = ("qm9", "qm9_atoms", "csv", "zinc", "pyg", "cora", "citeseer", "pubmed")  # their loaders: data.LOADERS


class Data(Loader):
    """The graphs, their targets and their split. The data decides the task: node level when targets come per
    node, classes when they are integers."""

    dataset: Literal[DATASETS] = "qm9"
    """qm9 (embedded, from qm9pack) | qm9_atoms (embedded, node level: per-atom targets of QM9's molecules) | zinc
    (PyG's ZINC-12k under root) | csv (SMILES + targets at root) | cora | citeseer | pubmed (Planetoid raw files
    ind.<name>.* under root) | pyg (a file saved by PyG's InMemoryDataset.save, or a folder of train.pt with val.pt
    and/or test.pt)."""
    root: str | None = None
    """qm9: folder of qm9pack-format CSVs (null = the package's); csv: file; others: path."""
    targets: list[str] = ["gap"]
    """qm9: short names (gap homo lumo mu alpha r2 zpve u0 u298 h298 g298 cv) or columns; csv: columns; qm9_atoms:
    [ring] (classes: smallest ring through each atom) or [charge] (Gasteiger); others: the data's y."""
    smiles_column: str = "smiles"
    """csv only."""
    subset: Positive | None = None
    """Molecules drawn (seeded) before splitting; null = all."""
    split_by: Literal["random", "scaffold"] = "random"
    """How data that ships no split is split into ``split`` fractions: random (from split_seed) | scaffold (SMILES
    data: Bemis-Murcko groups, MoleculeNet). A shipped split is used as shipped: zinc's, Planetoid's public split, a
    pyg file's masks or split files, a csv's split_column."""
    split_column: str | None = None
    """csv: a column naming each row's split (train, val or valid, test)."""
    split: list[Fraction] = [0.8, 0.1, 0.1]
    """Train/val/test fractions."""
    split_seed: Seed = 0
    """Fixed across training seeds, so every run sees the same test set."""
    rwse_steps: Positive = 16
    """Random-walk structural encoding: return probabilities after 1..k steps."""
    normalize_features: bool = False
    """Float node features scaled to sum to 1 per node (GCN's bag-of-words rows)."""


class Net(Encoder):
    """GPSNet's keyword arguments (``domains.graph.model.GPSNet``), but ``seq_len_percentile``, which the build
    reads."""

    pe_dim: Count = 16
    """Channels of dim carrying the projected RWSE (the rest embed atom features); 0: none."""
    attention_mode: Literal["dense", "sparse"] = "dense"
    """dense: all nodes of a graph (padded + masked) | sparse: graph edges + self-loops (for graphs too large for
    dense attention, e.g. pubmed's 19,717 nodes)."""
    seq_len_percentile: Annotated[float, Field(gt=0, le=100)] = 97.5
    """qknorm's gain starts at log2(L² − L), L the number of keys per query at this percentile (nearest rank) of
    the train split: graph sizes (dense), node in-degree + 1 (sparse). Henry et al. (2020) take the 97.5th
    percentile of training sequence lengths (their code, CyndxAI/QKNorm layers.py)."""
    local: Literal["gine", "gcn", "gat"] = "gine"
    """The local MPNN: gine (molecules: messages carry bond features) | gcn | gat (citation graphs)."""
    local_residual: bool = True
    """The local branch's skip connection (false: its messages alone, as in GCN's layers)."""
    global_residual: bool = True
    """The attention branch's skip connection (false: its output alone, as in GAT's layers)."""
    ffn: bool = True
    """Each layer's feed-forward block (false: the branches' sum is the layer's output)."""
    attn_dropout: Fraction = 0.0
    """On the attention weights."""
    input_dropout: Fraction = 0.0
    """Dropout on float node features before their encoder (GCN: 0.5 on bag-of-words rows)."""
    decay: Literal["all", "input"] = "all"
    """Weight decay on: all weight matrices | input: the node encoder's only (as GCN)."""
    norm: Literal["batch_norm", "layer_norm", "none"] = "batch_norm"
    pool: Literal["add", "mean"] = "add"
    """How a graph-level task pools its nodes."""
    head: Literal["mlp", "linear"] = "mlp"
    """mlp (Linear-ReLU-Linear) | linear."""


class Task(Model):
    loss: Literal["l1", "mse"] = "l1"
    """Regression: l1 | mse (on targets standardised with the train split's mean and std); classes always take
    cross-entropy."""


class GraphConfig(RunConfig):
    """GPS graph transformer (GINE local MPNN + global attention), graph- or node-level tasks."""

    task: Task = Task()
    optim: Optim = Optim(lr=1.0e-3, weight_decay=1.0e-5)
    trainer: Trainer = Trainer(max_epochs=20)
    data: Data = Data()
    model: Net = Net(dim=64)
