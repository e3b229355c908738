"""Graph domain: featurisation, the three loaders (on fixtures in their on-disk formats), the attention
state shared by the GPS layers in dense and sparse mode, dense padding, the regression task's scales,
and the speed benchmark."""
from __future__ import annotations

import logging
import pickle

import pytest
import torch
import torch.nn.functional as F
from torch_geometric.data import Batch
from torch_geometric.transforms import AddRandomWalkPE
from torch_geometric.utils.smiles import e_map, x_map

from common.data import DataError
from common.registry import BuildConfig
from domains.graph import data as graph_data
from domains.graph.data import QM9_FILES, GraphDataModule, featurise, smiles_to_graph
from domains.graph.model import GPSNet, GraphTask
from runners.config import build_config, compose

MOLECULES = ["CCO", "c1ccccc1", "CC(=O)O", "C", "N#CC#N", "OCC(O)CO", "CCN(CC)CC", "O=C=O"] * 3
# The vocabularies of PyG's atom and bond featuriser, which every molecule of these tests comes from.
NODE_VOCAB, EDGE_VOCAB = [len(v) for v in x_map.values()], [len(v) for v in e_map.values()]


def smoke_config(*overrides: str) -> BuildConfig:
    return build_config(compose(["domain=graph", "preset=smoke", *overrides]))


def data_cfg(**overrides) -> dict:
    """The smoke preset's data section over a whole fixture (no subset), in batches of 4."""
    return {**smoke_config().data, "subset": None, "batch_size": 4, **overrides}


@pytest.mark.parametrize("smiles, atoms, bonds", [("CCO", 3, 2), ("c1ccccc1", 6, 6), ("CC(=O)O", 4, 3), ("C", 1, 0)])
def test_featurisation_of_known_molecules(smiles, atoms, bonds):
    graph = smiles_to_graph(smiles)
    assert graph.x.shape == (atoms, 9) and graph.x.dtype == torch.long  # PyG's 9 atom features
    assert graph.edge_index.shape == (2, 2 * bonds)  # both directions
    assert graph.edge_attr.shape == (2 * bonds, 3)  # bond type, stereo, conjugation
    if smiles == "c1ccccc1":
        assert graph.x[:, 7].all()  # aromatic


def test_unparsable_smiles_are_skipped_and_counted_once(caplog):
    with caplog.at_level(logging.WARNING, logger=graph_data.__name__):
        graphs = featurise(["CCO", "not a smiles", "C1CC", "CC"], torch.tensor([[1.0], [2.0], [3.0], [float("nan")]]),
                           "test")
    assert [g.y.item() for g in graphs] == [1.0]
    assert caplog.messages == ["skipped 3 of 4 molecules in test (unparsable SMILES or missing target)"]


def write_qm9_fixture(root):
    """Three CSVs shaped like qm9pack's (a few of its columns)."""
    for i, name in enumerate(QM9_FILES):
        rows = [f'"m{i}_{j}.xyz",{j},"{s}",{0.2 + 0.01 * j},{-0.3 + 0.01 * j}' for j, s in enumerate(MOLECULES)]
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
    assert dm.node_vocab[0] == 9 and dm.num_targets == 2  # atomic numbers up to oxygen (8)
    mean, std = dm.target_stats()
    train_y = dm.datasets["train"].stacked.y
    assert torch.allclose(mean, train_y.mean(0)) and (std > 0).all()

    # A second run loads the cache instead of featurising; another subset size gets its own file.
    monkeypatch.setattr(graph_data, "featurise", lambda *a: pytest.fail("featurised again"))
    again = GraphDataModule(cfg, cache_dir=tmp_path / "cache")
    again.setup()
    assert torch.equal(again.datasets["test"].stacked.y, dm.datasets["test"].stacked.y)
    assert GraphDataModule(dict(cfg, subset=20), tmp_path / "cache").cache_path() != dm.cache_path()


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
    assert dm.edge_vocab == [3] and dm.node_vocab == [4]
    with pytest.raises(DataError, match="needs data.root"):
        GraphDataModule(data_cfg(dataset="zinc"), tmp_path / "cache").setup()


def tiny_batch() -> Batch:
    encode = AddRandomWalkPE(smoke_config().data["rwse_steps"], attr_name="pe")
    return Batch.from_data_list([encode(smiles_to_graph(s)) for s in ("CCO", "c1ccccc1", "C", "CC(=O)O")])


def tiny_net(mode: str, variant: str, norm: str = "batch_norm") -> GPSNet:
    """The smoke preset's GPS net (two layers) for one target."""
    cfg = smoke_config(f"attention={variant}", f"model.attention_mode={mode}", f"model.norm={norm}")
    torch.manual_seed(0)
    return GPSNet(NODE_VOCAB, EDGE_VOCAB, 1, rwse_steps=cfg.data["rwse_steps"], seq_len=6, attention=cfg.attention,
                  **cfg.model)


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
    task = GraphTask(tiny_net("dense", "quest"), {"lr": 1e-3}, mean, std, loss=loss)
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
