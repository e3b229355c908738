"""Point-cloud classification: a Point-MAE-style patch transformer on generated shapes or ModelNet."""
from common.registry import register_domain

from .config import PointcloudConfig


@register_domain("pointcloud", metric="acc", mode="max", config=PointcloudConfig)
def build(cfg: PointcloudConfig):
    from .data import PointCloudDataModule
    from .model import PointCloudTask, PointTransformer

    datamodule = PointCloudDataModule(cfg.data, cache_dir=cfg.cache_dir)
    net = PointTransformer(datamodule.num_classes, attn_layer=cfg.attn_layer, **dict(cfg.model))
    return datamodule, PointCloudTask(net, datamodule.num_classes, cfg.optim, seed=cfg.seed, **dict(cfg.task))
