"""Time-series forecasting: PatchTST on multivariate series (embedded Victoria electricity data, ETT,
Weather, Electricity, Exchange-rate or any ``date``+columns CSV). Primary metric: test MSE."""
from omegaconf import OmegaConf

from common.registry import register_domain

DATASETS = ("vic_elec", "ETTh1", "ETTh2", "ETTm1", "ETTm2", "weather", "electricity", "exchange_rate", "csv")


@register_domain("timeseries", metric="mse", mode="min", datasets=DATASETS)
def build(cfg):
    from .data import ForecastDataModule
    from .model import ForecastTask, PatchTST

    datamodule = ForecastDataModule(cfg.data)
    net = PatchTST(datamodule.num_channels, cfg.data.seq_len, cfg.data.pred_len,
                   **OmegaConf.to_container(cfg.model), attention=OmegaConf.to_container(cfg.attention))
    return datamodule, ForecastTask(net, cfg.optim)
