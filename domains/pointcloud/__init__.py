"""Point-cloud classification: a Point-MAE-style patch transformer on generated shapes or ModelNet."""
from common.registry import register_domain


@register_domain("pointcloud", metric="acc", mode="max", datasets=("shapes", "modelnet", "folder"))
def build(cfg):
    from omegaconf import OmegaConf

    from .data import PointCloudDataModule
    from .model import PointCloudTask, PointTransformer

    datamodule = PointCloudDataModule(cfg.data, cache_dir=cfg.cache_dir, seed=cfg.seed)
    model = OmegaConf.to_container(cfg.model)
    label_smoothing = model.pop("label_smoothing")
    net = PointTransformer(datamodule.num_classes, attention=OmegaConf.to_container(cfg.attention), **model)
    task = PointCloudTask(net, datamodule.num_classes, cfg.optim, OmegaConf.to_container(cfg.data.robustness),
                          label_smoothing=label_smoothing)
    return datamodule, task
