"""Graph domain, graph level: featurisation, the molecule and ZINC loaders (on fixtures in their on-disk
formats) and their splits (random from the split seed, by scaffold, as a CSV column ships it; none moves
with the training seed), the random-walk encodings, the attention state shared by the GPS layers in dense
and sparse mode, qknorm's initial gain from the train split's lengths, dense padding, the regression task's
scales, and the speed benchmark. Node-level tasks are tested in test_graph_nodes.py."""
from __future__ import annotations

import logging
import math
import pickle

import pytest
import torch
import torch.nn.functional as F
from conftest import CreatesAFile
from torch_geometric.data import Batch
from torch_geometric.transforms import AddRandomWalkPE
from torch_geometric.utils.smiles import e_map, x_map

from common.attention import LayerGain
from common.data import DataError
from common.errors import ConfigError
from common.registry import get_domain
from common.schema import RunConfig
from domains.graph import molecules
from domains.graph.config import Data
from domains.graph.data import GraphDataModule, random_walk_pe
from domains.graph.model import GPSNet, GraphRegression
from domains.graph.molecules import QM9_FILES, featurise, smiles_to_graph, table_labeller
from domains.graph.splits import scaffold, scaffold_parts
from runners.config import compose

MOLECULES = ["CCO", "c1ccccc1", "CC(=O)O", "C", "N#CC#N", "OCC(O)CO", "CCN(CC)CC", "O=C=O"] * 3
# The vocabularies of PyG's atom and bond featuriser, which every molecule of these tests comes from.
NODE_VOCAB, EDGE_VOCAB = [len(v) for v in x_map.values()], [len(v) for v in e_map.values()]


def smoke_config(*overrides: str) -> RunConfig:
    return compose(["domain=graph", "preset=smoke", *overrides])


def data_cfg(**overrides) -> Data:
    """The smoke preset's data section over a whole fixture (no subset), in batches of 4."""
    return Data(**{**dict(smoke_config().data), "subset": None, "batch_size": 4, **overrides})


@pytest.mark.parametrize("smiles, atoms, bonds", [("CCO", 3, 2), ("c1ccccc1", 6, 6), ("CC(=O)O", 4, 3), ("C", 1, 0)])
def test_featurisation_of_known_molecules(smiles, atoms, bonds):
    graph = smiles_to_graph(smiles)
    assert graph.x.shape == (atoms, 9) and graph.x.dtype == torch.long  # PyG's 9 atom features
    assert graph.edge_index.shape == (2, 2 * bonds)  # both directions
    assert graph.edge_attr.shape == (2 * bonds, 3)  # bond type, stereo, conjugation
    if smiles == "c1ccccc1":
        assert graph.x[:, 7].all()  # aromatic


def test_unparsable_smiles_are_skipped_and_counted_once(caplog):
    values = torch.tensor([[1.0], [2.0], [3.0], [float("nan")], [5.0]])
    with caplog.at_level(logging.WARNING, logger=molecules.__name__):
        graphs, kept = featurise(["CCO", "not a smiles", "C1CC", "CC", "O"], table_labeller(values), "test")
    assert [g.y.item() for g in graphs] == [1.0, 5.0] and kept == [0, 4]
    assert caplog.messages == ["skipped 3 of 5 molecules in test (unparsable SMILES or missing target)"]


def write_qm9_fixture(root, smiles=MOLECULES):
    """Three CSVs shaped like qm9pack's (a few of its columns)."""
    root.mkdir(parents=True, exist_ok=True)
    for i, name in enumerate(QM9_FILES):
        rows = [f'"m{i}_{j}.xyz",{j},"{s}",{0.2 + 0.01 * j},{-0.3 + 0.01 * j}' for j, s in enumerate(smiles)]
        (root / name).write_text("XYZ_file,Index,SMILES,HOMO_LUMO_gap_au,HOMO_au\n" + "\n".join(rows) + "\n")


def test_qm9_split_subset_and_cache(tmp_path, monkeypatch):
    write_qm9_fixture(tmp_path)
    cfg = data_cfg(root=str(tmp_path), subset=40, targets=["gap", "homo"])
    dm = GraphDataModule(cfg, cache_dir=tmp_path / "cache")
    dm.setup()
    sizes = [len(dm.datasets[s]) for s in ("train", "val", "test")]
    assert sizes == [32, 4, 4]
    batch = next(iter(dm.train_dataloader()))
    assert batch.y.shape == (4, 2) and batch.pe.shape == (batch.num_nodes, 4)
    assert dm.node_features[0] == 9 and dm.num_outputs == 2 and dm.level == "graph"  # atomic numbers up to 8 (O)
    mean, std = dm.target_stats()
    train_y = dm.datasets["train"].stacked.y
    assert torch.allclose(mean, train_y.mean(0)) and (std > 0).all()
    assert dm.split_info["source"] == "random" and "split seed 0" in dm.split_info["rule"]

    # A second run loads the cache instead of featurising; another subset size gets its own file.
    monkeypatch.setattr(molecules, "featurise", lambda *a: pytest.fail("featurised again"))
    again = GraphDataModule(cfg, cache_dir=tmp_path / "cache")
    again.setup()
    assert torch.equal(again.datasets["test"].stacked.y, dm.datasets["test"].stacked.y)
    assert again.split_info == dm.split_info
    assert GraphDataModule(cfg.model_copy(update={"subset": 20}), tmp_path / "cache").cache_path() != dm.cache_path()


def test_csv_loader_and_its_errors(tmp_path):
    path = tmp_path / "mols.csv"
    rows = [f"m{j},{s},{j}" for j, s in enumerate(MOLECULES + ["xyz?"])]
    path.write_text("name,smiles,logp\n" + "\n".join(rows) + "\n")
    dm = GraphDataModule(data_cfg(dataset="csv", root=str(path), targets=["logp"]), tmp_path / "cache")
    dm.setup()
    assert sum(len(dm.datasets[s]) for s in ("train", "val", "test")) == len(MOLECULES)  # the bad SMILES is skipped
    with pytest.raises(DataError, match="no column 'solubility'"):
        GraphDataModule(data_cfg(dataset="csv", root=str(path), targets=["solubility"]), tmp_path / "c2").setup()
    with pytest.raises(DataError, match="does not exist"):
        GraphDataModule(data_cfg(dataset="csv", root=str(tmp_path / "none.csv")), tmp_path / "c3").setup()
    with pytest.raises(DataError, match="does not exist"):
        GraphDataModule(data_cfg(root=str(tmp_path / "no_qm9")), tmp_path / "c4").setup()


def test_a_csv_split_column_is_used_as_shipped(tmp_path):
    path = tmp_path / "mols.csv"
    splits = ["train", "valid", "test", "train"] * 7  # OGB's word for val
    rows = [f"{s},{j},{split}" for j, (s, split) in enumerate(zip(MOLECULES + ["xyz?"], splits))]
    path.write_text("smiles,logp,fold\n" + "\n".join(rows) + "\n")
    data = data_cfg(dataset="csv", root=str(path), targets=["logp"], split_column="fold")
    loaded = molecules.csv_splits(data)
    assert loaded.split.source == "shipped" and loaded.split.rule == "column 'fold'"
    # Row 24 is the bad SMILES; every other row sits in the split its column names.
    assert loaded.split.members == {name: [str(j) for j in range(24) if splits[j] == word]
                                    for name, word in (("train", "train"), ("val", "valid"), ("test", "test"))}
    assert [g.y.item() for g in loaded.graphs["val"]] == [float(j) for j in range(24) if splits[j] == "valid"]
    path.write_text("smiles,logp,fold\nCCO,1,train\nCC,2,holdout\n")
    with pytest.raises(DataError, match="column 'fold' holds 'holdout' at line 3"):
        molecules.csv_splits(data)
    with pytest.raises(ConfigError, match="applies to dataset csv"):
        molecules.qm9_splits(data_cfg(split_column="fold"))


# Four scaffolds (benzene, cyclohexane, pyridine, cyclopropane) and acyclic molecules (scaffold "").
SCAFFOLD_MOLECULES = (["c1ccccc1C", "c1ccccc1O", "c1ccccc1CC", "c1ccccc1N", "c1ccccc1CO", "c1ccccc1Cl"]
                      + ["C1CCCCC1C", "C1CCCCC1O", "C1CCCCC1N"] + ["c1ccncc1", "c1ccncc1C"] + ["C1CC1C"]
                      + ["CCO", "CCCC", "CC(=O)O", "CCN"])


def test_scaffold_split_keeps_each_scaffold_in_one_split(tmp_path):
    parts = scaffold_parts(SCAFFOLD_MOLECULES, (0.6, 0.2, 0.2))
    scaffolds = [{scaffold(SCAFFOLD_MOLECULES[i]) for i in part} for part in parts]
    assert not (scaffolds[0] & scaffolds[1] or scaffolds[0] & scaffolds[2] or scaffolds[1] & scaffolds[2])
    assert sorted(i for part in parts for i in part) == list(range(len(SCAFFOLD_MOLECULES)))
    # MoleculeNet's order, largest group first, each into the first split it fits (train 9.6, val 3.2 of 16):
    # benzenes (6) to train, acyclic (4) past train's share to val, cyclohexanes (3) to train, the rest to test.
    assert scaffolds == [{"c1ccccc1", "C1CCCCC1"}, {""}, {"c1ccncc1", "C1CC1"}]

    # Through the CSV loader: the members (file rows) of each split share no scaffold, whatever the seed.
    path = tmp_path / "mols.csv"
    path.write_text("smiles,y\n" + "\n".join(f"{m},{j}" for j, m in enumerate(SCAFFOLD_MOLECULES)) + "\n")
    splits = [molecules.csv_splits(data_cfg(dataset="csv", root=str(path), targets=["y"], split_by="scaffold",
                                            split=[0.6, 0.2, 0.2], split_seed=seed)).split for seed in (0, 1)]
    assert splits[0] == splits[1] and splits[0].source == "grouped"
    assert [{scaffold(SCAFFOLD_MOLECULES[int(r)]) for r in rows} for rows in splits[0].members.values()] == scaffolds
    with pytest.raises(ConfigError, match=r"^unknown data.split_by='cluster'; choose from random, scaffold$"):
        compose(["domain=graph", "data.dataset=csv", f"data.root={path}", "data.targets=[y]", "data.split_by=cluster"])


def write_zinc_fixture(root):
    """PyG's ZINC raw format: per split a pickle of molecule dicts (atom types, bond-type adjacency,
    penalised logP) and a comma-separated index file selecting the 12k subset."""
    raw = root / "raw"
    raw.mkdir(parents=True)
    for split, n in (("train", 6), ("val", 3), ("test", 3)):
        mols = []
        for i in range(n):
            atoms = 3 + i % 3
            adj = torch.zeros(atoms, atoms, dtype=torch.long)
            for a in range(atoms - 1):  # a chain with single/double bonds
                adj[a, a + 1] = adj[a + 1, a] = 1 + a % 2
            mols.append({"atom_type": torch.arange(atoms) % 4, "bond_type": adj,
                         "logP_SA_cycle_normalized": torch.tensor([0.5 * i])})
        with open(raw / f"{split}.pickle", "wb") as f:
            pickle.dump(mols, f)
        (raw / f"{split}.index").write_text(",".join(str(i) for i in range(n - 1)) + "\n")


def test_zinc_fixture_in_pyg_format_loads(tmp_path):
    write_zinc_fixture(tmp_path / "ZINC")
    dm = GraphDataModule(data_cfg(dataset="zinc", root=str(tmp_path / "ZINC")), tmp_path / "cache")
    dm.setup()
    assert [len(dm.datasets[s]) for s in ("train", "val", "test")] == [5, 2, 2]  # the index files select
    graph = dm.datasets["train"][1]
    assert graph.x.shape == (4, 1) and graph.edge_attr.shape == (6, 1) and graph.y.shape == (1, 1)
    assert dm.edge_features == [3] and dm.node_features == [4]
    assert dm.split_info["source"] == "shipped"
    with pytest.raises(DataError, match="needs data.root"):
        GraphDataModule(data_cfg(dataset="zinc"), tmp_path / "cache").setup()
    marker = tmp_path / "ran-code"  # a raw pickle crafted to run code is refused, not run
    (tmp_path / "ZINC" / "raw" / "val.pickle").write_bytes(pickle.dumps([CreatesAFile(marker)]))
    with pytest.raises(DataError, match=r"val\.pickle: it names io\.open, which this dataset's files do not hold"):
        GraphDataModule(data_cfg(dataset="zinc", root=str(tmp_path / "ZINC")), tmp_path / "c3").setup()
    assert not marker.exists()
    (tmp_path / "ZINC" / "raw" / "val.index").unlink()
    with pytest.raises(DataError, match=r"ZINC files missing under .*raw: val\.index"):
        GraphDataModule(data_cfg(dataset="zinc", root=str(tmp_path / "ZINC")), tmp_path / "c4").setup()
    with pytest.raises(ConfigError, match="scaffold needs molecules read from SMILES"):
        GraphDataModule(data_cfg(dataset="zinc", root=str(tmp_path / "ZINC"), split_by="scaffold"),
                        tmp_path / "c2").setup()


def built_split(tmp_path, seed: int, *overrides: str) -> dict:
    """The split record of the graph domain built as a run of training seed ``seed`` builds it (global RNG
    seeded alike, a cache of its own, so nothing is shared between the seeds)."""
    cfg = compose(["domain=graph", "preset=smoke", f"seed={seed}", f"cache_dir={tmp_path / str(seed)}", *overrides])
    torch.manual_seed(seed)
    datamodule, _ = get_domain("graph").build(cfg)
    return datamodule.split_info


def assert_split_ignores_training_seed(tmp_path, *overrides: str) -> dict:
    """Two training seeds get the same split membership; returns it."""
    first = built_split(tmp_path / "a", 0, *overrides)
    assert built_split(tmp_path / "b", 1, *overrides) == first
    return first


@pytest.mark.parametrize("loader", ["qm9", "qm9 by scaffold", "csv", "csv with split column", "zinc"])
def test_no_split_moves_with_the_training_seed(loader, tmp_path):
    write_qm9_fixture(tmp_path / "qm9")
    write_qm9_fixture(tmp_path / "scaffolds", SCAFFOLD_MOLECULES)
    write_zinc_fixture(tmp_path / "ZINC")
    path = tmp_path / "mols.csv"
    path.write_text("smiles,y,fold\n" + "\n".join(f"{m},{j},{('train', 'val', 'test', 'train')[j % 4]}"
                                                   for j, m in enumerate(SCAFFOLD_MOLECULES)) + "\n")
    overrides, source = {
        "qm9": ([f"data.root={tmp_path / 'qm9'}"], "random"),
        "qm9 by scaffold": ([f"data.root={tmp_path / 'scaffolds'}", "data.split_by=scaffold"], "grouped"),
        "csv": (["data.dataset=csv", f"data.root={path}", "data.targets=[y]", "data.split=[0.5,0.25,0.25]"], "random"),
        "csv with split column": (["data.dataset=csv", f"data.root={path}", "data.targets=[y]",
                                   "data.split_column=fold"], "shipped"),
        "zinc": (["data.dataset=zinc", f"data.root={tmp_path / 'ZINC'}"], "shipped"),
    }[loader]
    split = assert_split_ignores_training_seed(tmp_path, *overrides)
    assert split["source"] == source
    if source == "random":  # the hashes name the membership: another split seed, another test set
        assert built_split(tmp_path / "c", 0, *overrides, "data.split_seed=1")["hash"]["test"] != split["hash"]["test"]


@pytest.mark.parametrize("block", [64, 3])
def test_random_walk_encoding_matches_pyg(block):
    """Exact in column blocks, also when a block is smaller than the graph (the large-graph path)."""
    graph = smiles_to_graph("c1ccc2c(c1)CCC2CO")
    expected = AddRandomWalkPE(6, attr_name="pe")(graph.clone()).pe
    assert torch.allclose(random_walk_pe(graph, 6, block=block), expected, atol=1e-6)


def tiny_batch() -> Batch:
    graphs = [smiles_to_graph(s) for s in ("CCO", "c1ccccc1", "C", "CC(=O)O")]
    for graph in graphs:
        graph.pe = random_walk_pe(graph, smoke_config().data.rwse_steps)
    return Batch.from_data_list(graphs)


def tiny_net(mode: str, variant: str, norm: str = "batch_norm") -> GPSNet:
    """The smoke preset's GPS net (two layers) for one target."""
    cfg = smoke_config(f"attention={variant}", f"model.attention_mode={mode}", f"model.norm={norm}")
    torch.manual_seed(0)
    model = cfg.model.model_dump(exclude={"seq_len_percentile"})  # the domain's build reads that one
    return GPSNet(NODE_VOCAB, EDGE_VOCAB, 1, rwse_steps=cfg.data.rwse_steps, seq_len=6, attention=cfg.attention,
                  **model)


def write_chains(path):
    """Carbon chains as a CSV with a split column: C_k has k nodes, in-degree 1 at its ends and 2 inside.
    Train holds k = 1..20; val and test one chain of 40, which no length rule may see."""
    rows = [f"{'C' * k},{k}.5,train" for k in range(1, 21)] + [f"{'C' * 40},0.5,{s}" for s in ("val", "test")]
    path.write_text("smiles,y,fold\n" + "\n".join(rows) + "\n")


@pytest.mark.parametrize("mode, percentile, length", [
    ("dense", 97.5, 20), ("dense", 50, 10),   # nearest rank over the train node counts 1..20
    ("sparse", 97.5, 3), ("sparse", 10, 2),   # over the 210 train nodes' degree + 1: one 1, 38 twos, 171 threes
])
def test_qknorm_gain_starts_from_the_train_length_percentile(tmp_path, mode, percentile, length):
    write_chains(tmp_path / "chains.csv")
    cfg = smoke_config("attention=qknorm", "data.dataset=csv", f"data.root={tmp_path / 'chains.csv'}", "data.subset=null",
                       "data.targets=[y]", "data.split_column=fold", f"model.attention_mode={mode}",
                       f"model.seq_len_percentile={percentile}", f"cache_dir={tmp_path / 'cache'}")
    _, task = get_domain("graph").build(cfg)
    gains = [m.gain for m in task.modules() if isinstance(m, LayerGain)]
    assert len(gains) == cfg.model.depth
    assert all(torch.allclose(g, torch.tensor(math.log2(length**2 - length))) for g in gains)
    for outside, bound in (("0", "> 0"), ("100.5", "<= 100")):  # refused as the config is composed, before any data
        with pytest.raises(ConfigError, match=f"'model.seq_len_percentile' must be {bound}, got {outside}$"):
            smoke_config(f"model.seq_len_percentile={outside}")


@pytest.mark.parametrize("mode", ["dense", "sparse"])
def test_elliptical_state_reaches_later_layers(mode):
    """With the same weights, elliptical differs from standard only if layer 2 read layer 1's values from
    the net's attention state."""
    batch = tiny_batch()
    standard, elliptical = tiny_net(mode, "standard").eval(), tiny_net(mode, "elliptical").eval()
    elliptical.load_state_dict(standard.state_dict())
    assert not torch.allclose(standard(batch), elliptical(batch))


def test_dense_padding_does_not_leak_between_graphs():
    batch = tiny_batch()
    net = tiny_net("dense", "quest", norm="layer_norm").eval()
    alone = net(Batch.from_data_list(batch.to_data_list()[:1]))
    assert torch.allclose(net(batch)[:1], alone, atol=1e-5)


@pytest.mark.parametrize("loss", ["l1", "mse"])
def test_task_trains_on_standardised_targets_and_reports_original_units(loss):
    batch = tiny_batch()
    batch.y = torch.tensor([[9.0], [11.0], [12.0], [7.0]])
    mean, std = torch.tensor([10.0]), torch.tensor([2.0])
    optim = compose(["domain=graph"]).optim
    task = GraphRegression(tiny_net("dense", "quest"), optim, mean, std, loss=loss)
    graph, target = task.unpack(batch)
    out = task(graph)
    expected = {"l1": F.l1_loss, "mse": F.mse_loss}[loss](out, (target - mean) / std)
    assert torch.allclose(task.loss(out, target, "train"), expected)
    preds, same_target = task.predictions(out, target)
    assert torch.allclose(preds, out * std + mean) and same_target is target


def test_bench_runs_both_layers(capsys):
    from domains.graph.bench import main

    rates = main(["--dim", "16", "--depth", "1", "--heads", "2", "--graphs", "2", "--steps", "1", "--rounds", "1"])
    assert len(rates) == 2 and all(r > 0 for r in rates.values())
    assert "ratio ours / PyG" in capsys.readouterr().out
