"""Time-series domain: split borders and window counts worked out by hand on generated ETT-format and
generic CSV fixtures, a CSV's own split column, splits that never follow the training seed, no look-ahead
between splits, one-line errors on bad input, RevIN round trip, PatchTST patching and channel
independence, and the persistence baseline of the test split."""
import numpy as np
import pandas as pd
import pytest
import pytorch_lightning as pl
import torch
import torch.nn.functional as F

from common.data import DataError
from common.schema import RunConfig
from domains.timeseries import build
from domains.timeseries.data import ForecastDataModule, split_borders
from domains.timeseries.model import RevIN
from runners.config import compose

ETT_COLUMNS = ["HUFL", "HULL", "MUFL", "MULL", "LUFL", "LULL", "OT"]
OT = ETT_COLUMNS.index("OT")  # variables keep the file's column order, date removed
HOURLY_ROWS = 12 * 30 * 24, 4 * 30 * 24, 4 * 30 * 24  # 8640, 2880, 2880


def write_ett(path, rows: int):
    """An ETT-format CSV whose OT column is the row index, so every window can be traced to its rows."""
    frame = pd.DataFrame(np.random.default_rng(0).normal(size=(rows, 7)), columns=ETT_COLUMNS)
    frame["OT"] = np.arange(rows, dtype=float)
    frame.insert(0, "date", pd.date_range("2016-07-01", periods=rows, freq="h").strftime("%Y-%m-%d %H:%M:%S"))
    frame.to_csv(path, index=False)
    return path


def config(*overrides: str) -> RunConfig:
    return compose(["domain=timeseries", "preset=smoke", *overrides])


def datamodule(*overrides: str) -> ForecastDataModule:
    return ForecastDataModule(config(*overrides).data)


def row_index(dm: ForecastDataModule, scaled_ot: torch.Tensor) -> torch.Tensor:
    """Undo the train-split standardisation of OT = row index (train rows 0..8639)."""
    train_rows = np.arange(HOURLY_ROWS[0], dtype=np.float64)
    return torch.round(scaled_ot.double() * train_rows.std() + train_rows.mean()).long()


@pytest.fixture(scope="module")
def ett_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ett")
    write_ett(folder / "ETTh1.csv", sum(HOURLY_ROWS) + 100)  # like the real file, rows past month 20 are unused
    return folder


def test_ett_hourly_window_counts_and_borders(ett_folder):
    dm = datamodule("data.dataset=ETTh1", f"data.root={ett_folder}", "data.seq_len=48", "data.pred_len=24",
                    "data.eval_batch_size=100")
    # A split of R rows holds R - 48 - 24 + 1 windows; val/test hold 2880 + 48 rows (look-back before the border).
    assert [len(dm.windows(s)) for s in ("train", "val", "test")] == [8640 - 71, 2928 - 71, 2928 - 71]
    first_val_x, first_val_y = dm.windows("val")[0]
    assert row_index(dm, first_val_x[:, OT]).tolist() == list(range(8592, 8640))
    assert row_index(dm, first_val_y[:, OT]).tolist() == list(range(8640, 8664))
    first_test_y = dm.windows("test")[0][1]
    assert row_index(dm, first_test_y[0, OT]).item() == 11520
    last_test_y = dm.windows("test")[len(dm.windows("test")) - 1][1]
    assert row_index(dm, last_test_y[-1, OT]).item() == 14399
    # Evaluation keeps every window: 2857 = 28 full batches of 100 + 57.
    dm.setup("test")
    sizes = [len(y) for _, y in dm.test_dataloader()]
    assert len(sizes) == 29 and sizes[-1] == 57 and sum(sizes) == 2857
    # Validation may thin its windows (val_stride); test never does.
    sparse = datamodule("data.dataset=ETTh1", f"data.root={ett_folder}", "data.seq_len=48", "data.pred_len=24",
                        "data.val_stride=8")
    val = sparse.windows("val")
    assert len(val) == -(-2857 // 8) and len(sparse.windows("test")) == 2857
    ninth_x, ninth_y = val[1]
    assert row_index(sparse, ninth_x[:, OT]).tolist() == list(range(8600, 8648))  # the ninth window: its look-back
    assert row_index(sparse, ninth_y[:, OT]).tolist() == list(range(8648, 8672))  # and its horizon
    assert row_index(sparse, val[len(val) - 1][1][-1, OT]).item() == 11519  # 2856 = 357 x 8: the last window


def test_ett_minute_borders():
    # 15-minute files have four times the rows: 34560 / 11520 / 11520; val and test start seq_len early.
    borders = split_borders("ETTm1", 69680, seq_len=96, fractions=(0.7, 0.1, 0.2), source="ETTm1.csv")
    assert borders == [(0, 34560), (34560 - 96, 46080), (46080 - 96, 57600)]


def test_no_lookahead_between_splits(ett_folder, tmp_path):
    dm = datamodule("data.dataset=ETTh1", f"data.root={ett_folder}", "data.seq_len=48", "data.pred_len=24")
    target_rows = {}
    for split in ("train", "val", "test"):
        windows = dm.windows(split)
        first, last = windows[0][1][:, OT], windows[len(windows) - 1][1][:, OT]
        target_rows[split] = (row_index(dm, first).min().item(), row_index(dm, last).max().item())
    assert target_rows == {"train": (48, 8639), "val": (8640, 11519), "test": (11520, 14399)}
    # The scaler sees train rows only: rewriting every later row changes nothing in the train split,
    # nor in the val look-back that lies before the border.
    frame = pd.read_csv(ett_folder / "ETTh1.csv")
    frame.loc[8640:, ETT_COLUMNS] = frame.loc[8640:, ETT_COLUMNS] * 100 + 5
    frame.to_csv(tmp_path / "ETTh1.csv", index=False)
    changed = datamodule("data.dataset=ETTh1", f"data.root={tmp_path}", "data.seq_len=48", "data.pred_len=24")
    assert torch.equal(changed.splits["train"], dm.splits["train"])
    assert torch.equal(changed.splits["val"][:48], dm.splits["val"][:48])
    assert not torch.equal(changed.splits["val"][48:], dm.splits["val"][48:])


def write_generic(path, rows: int):
    frame = pd.DataFrame({"date": pd.date_range("2020-01-01", periods=rows, freq="10min").astype(str),
                          "p (mbar)": np.linspace(990, 1010, rows), "T (degC)": np.sin(np.arange(rows) / 10),
                          "count": np.arange(rows)})
    frame.to_csv(path, index=False)
    return path


@pytest.mark.parametrize("dataset", ["csv", "weather"])
def test_generic_split_is_70_10_20(tmp_path, dataset):
    path = write_generic(tmp_path / "weather.csv", 1000)
    dm = datamodule(f"data.dataset={dataset}", f"data.root={path if dataset == 'csv' else tmp_path}",
                    "data.seq_len=48", "data.pred_len=24")
    # 700 / 100 / 200 rows; val and test also get the 48 look-back rows before their border.
    assert [len(dm.windows(s)) for s in ("train", "val", "test")] == [700 - 71, 148 - 71, 248 - 71]
    assert dm.num_channels == 3


def test_a_split_column_is_used_as_shipped(tmp_path):
    path = write_generic(tmp_path / "labelled.csv", 1000)
    frame = pd.read_csv(path)
    frame["split"] = ["train"] * 600 + ["valid"] * 150 + ["test"] * 250
    frame.to_csv(path, index=False)
    dm = datamodule("data.dataset=csv", f"data.root={path}", "data.seq_len=48", "data.pred_len=24")
    assert [len(dm.windows(s)) for s in ("train", "val", "test")] == [600 - 71, 198 - 71, 298 - 71]
    assert dm.num_channels == 3 and dm.split_info["source"] == "shipped"  # the split column is no variable
    with pytest.raises(DataError, match="column 'split' is not numeric"):  # null: the column is one more variable
        datamodule("data.dataset=csv", f"data.root={path}", "data.seq_len=48", "data.pred_len=24",
                   "data.split_column=null").setup("fit")
    for labels, message in ((["train"] * 500 + ["test"] * 250 + ["val"] * 250, "(found train -> test -> val)"),
                            (["train"] * 999 + ["holdout"], "holds 'holdout'")):
        frame["split"] = labels
        frame.to_csv(path, index=False)
        with pytest.raises(DataError, match="column 'split'") as err:
            datamodule("data.dataset=csv", f"data.root={path}", "data.seq_len=48", "data.pred_len=24").setup("fit")
        assert message in str(err.value)


@pytest.mark.parametrize("dataset, source", [("vic_elec", "ordered"), ("ETTh1", "shipped"), ("csv", "ordered")])
def test_split_is_the_same_for_every_training_seed(ett_folder, tmp_path, dataset, source):
    root = {"vic_elec": None, "ETTh1": ett_folder, "csv": write_generic(tmp_path / "series.csv", 1000)}[dataset]
    first, second = (build(config(f"data.dataset={dataset}", f"data.root={root}", f"seed={seed}"))[0]
                     for seed in (0, 1))
    assert first.split_info == second.split_info and first.split_info["source"] == source
    assert all(torch.equal(first.splits[s], second.splits[s]) for s in ("train", "val", "test"))


def test_embedded_vic_elec():
    dm = datamodule("data.seq_len=336", "data.pred_len=96")
    # 52,608 half-hourly rows: 36825 / 5262 / 10521 by int(0.7 n), n - train - test, int(0.2 n).
    assert dm.num_channels == 2
    assert [len(dm.windows(s)) for s in ("train", "val", "test")] == [36825 - 431, 5262 - 95, 10521 - 95]
    train = dm.splits["train"]
    assert torch.allclose(train.mean(0), torch.zeros(2), atol=1e-4)
    assert torch.allclose(train.std(0, unbiased=False), torch.ones(2), atol=1e-4)


def test_bad_input_is_a_one_line_data_error(tmp_path):
    write_generic(tmp_path / "short.csv", 100)
    bad = pd.read_csv(write_generic(tmp_path / "text.csv", 1000))
    bad["station"] = "A"
    bad.to_csv(tmp_path / "text.csv", index=False)
    write_generic(tmp_path / "nodate.csv", 1000).write_text("time,x\n1,2\n")
    write_ett(tmp_path / "ETTh2.csv", 1000)
    cases = {
        ("data.dataset=csv", f"data.root={tmp_path / 'missing.csv'}"): "does not exist",
        ("data.dataset=csv", f"data.root={tmp_path / 'text.csv'}"): "column 'station' is not numeric",
        ("data.dataset=csv", f"data.root={tmp_path / 'nodate.csv'}"): "no 'date' column",
        ("data.dataset=csv", f"data.root={tmp_path / 'short.csv'}"):
            "train split has 70 rows, fewer than seq_len + pred_len = 72",
        ("data.dataset=csv", f"data.root={tmp_path}"): "must be the CSV file",
        ("data.dataset=ETTh2", f"data.root={tmp_path}"): "1000 rows, but ETTh2's 12/4/4-month split needs 14400",
        ("data.dataset=ETTm1",): "needs data.root",
    }
    for overrides, message in cases.items():
        with pytest.raises(DataError) as err:
            datamodule(*overrides, "data.seq_len=48", "data.pred_len=24").setup("fit")
        assert message in str(err.value) and "\n" not in str(err.value), (overrides, str(err.value))


@pytest.mark.parametrize("affine", [True, False])
def test_revin_round_trip(affine):
    torch.manual_seed(0)
    revin = RevIN(3, affine=affine)
    if affine:
        torch.nn.init.uniform_(revin.weight, 0.5, 2.0)
        torch.nn.init.normal_(revin.bias)
    x = torch.randn(4, 50, 3) * torch.tensor([1.0, 10.0, 0.1]) + torch.tensor([5.0, -300.0, 0.0])
    normalized, stats = revin.normalize(x)
    if not affine:
        assert torch.allclose(normalized.mean(1), torch.zeros(4, 3), atol=1e-5)
        assert torch.allclose(normalized.std(1, unbiased=False), torch.ones(4, 3), atol=1e-3)
    assert torch.allclose(revin.denormalize(normalized, stats), x, rtol=1e-5, atol=1e-4)


def test_patching_and_channel_independence(ett_folder):
    # The paper's PatchTST/42: look-back 336, patches of 16 at stride 8, plus one from end padding.
    cfg = config("preset=paper", f"data.root={ett_folder}")
    datamodule_, task = build(cfg)
    net = task.net.eval()
    assert net.num_patches == 42 and datamodule_.num_channels == 7 and len(net.encoder.layers) == 3
    x = torch.randn(2, 336, 7)
    patches = net.patches(x)
    assert patches.shape == (14, 42, 16)
    assert torch.equal(patches[0, -1], torch.cat([x[0, -8:, 0], x[0, -1:, 0].expand(8)]))
    nudged = x.clone()
    nudged[:, :, 3] += torch.randn(2, 336)
    with torch.no_grad():
        out, out_nudged = net(x), net(nudged)
    assert out.shape == (2, 96, 7)
    others = [c for c in range(7) if c != 3]
    assert torch.allclose(out[..., others], out_nudged[..., others], atol=1e-5)
    assert not torch.allclose(out[..., 3], out_nudged[..., 3])


def test_persistence_baseline_is_logged_on_test():
    """``test/persistence_*`` score the last look-back value held over the horizon, beside the forecast's."""
    cfg = config()
    datamodule_, task = build(cfg)
    trainer = pl.Trainer(accelerator="cpu", limit_test_batches=2, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    results = trainer.test(task, datamodule=datamodule_, verbose=False)[0]
    windows = datamodule_.windows("test")
    x, y = (torch.stack(part) for part in zip(*(windows[i] for i in range(2 * cfg.data.eval_batch_size))))
    held = x[:, -1:].expand_as(y)
    assert results["test/mse_baseline"] == pytest.approx(F.mse_loss(held, y).item(), rel=1e-5)
    assert results["test/mae_baseline"] == pytest.approx(F.l1_loss(held, y).item(), rel=1e-5)
    assert {"test/loss", "test/mse", "test/mae"} <= results.keys()
