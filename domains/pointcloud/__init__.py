"""Point-cloud classification: a Point-MAE-style patch transformer on generated shapes or ModelNet."""
from common.registry import BuildConfig, register_domain

from .data import DATASETS, PointCloudDataModule
from .model import PointCloudTask, PointTransformer


@register_domain("pointcloud", metric="acc", mode="max", datasets=DATASETS)
def build(cfg: BuildConfig):
    datamodule = PointCloudDataModule(cfg.data, cache_dir=cfg.cache_dir)
    net = PointTransformer(datamodule.num_classes, attention=cfg.attention, **cfg.model)
    return datamodule, PointCloudTask(net, datamodule.num_classes, cfg.optim, seed=cfg.seed, **cfg.task)
