"""Time-series forecasting: PatchTST on multivariate series (embedded Victoria electricity data, ETT,
Weather, Electricity, Exchange-rate or any ``date``+columns CSV). Primary metric: test MSE."""
from common.registry import register_domain

from .config import TimeseriesConfig


@register_domain("timeseries", metric="mse", mode="min", config=TimeseriesConfig)
def build(cfg: TimeseriesConfig):
    from .data import ForecastDataModule
    from .model import ForecastTask, PatchTST

    datamodule = ForecastDataModule(cfg.data)
    net = PatchTST(datamodule.num_channels, cfg.data.seq_len, cfg.data.pred_len, attn_layer=cfg.attn_layer,
                   **dict(cfg.model))
    return datamodule, ForecastTask(net, cfg.optim)
