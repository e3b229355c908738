"""Time-series forecasting: PatchTST on multivariate series (embedded Victoria electricity data, ETT,
Weather, Electricity, Exchange-rate or any ``date``+columns CSV). Primary metric: test MSE."""
from common.registry import BuildConfig, register_domain

from .data import DATASETS


@register_domain("timeseries", metric="mse", mode="min", datasets=DATASETS)
def build(cfg: BuildConfig):
    from .data import ForecastDataModule
    from .model import ForecastTask, PatchTST

    datamodule = ForecastDataModule(cfg.data)
    net = PatchTST(datamodule.num_channels, cfg.data["seq_len"], cfg.data["pred_len"], attention=cfg.attention,
                   **cfg.model)
    return datamodule, ForecastTask(net, cfg.optim)
