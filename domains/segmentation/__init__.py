"""Segmentation domain: Segmenter (ViT encoder + mask-transformer decoder) on digit scenes or ADE20K,
scored by mIoU on clean and corrupted test images."""
from omegaconf import OmegaConf

from common.registry import register_domain


@register_domain("segmentation", metric="miou", mode="max", datasets=("digits", "ade20k", "folder"))
def build(cfg):
    from .data import SegmentationDataModule
    from .model import SegmentationTask, Segmenter

    datamodule = SegmentationDataModule(cfg.data, cache_dir=cfg.cache_dir, seed=cfg.seed)
    model = OmegaConf.to_container(cfg.model, resolve=True)
    net = Segmenter(datamodule.num_classes, crop_size=cfg.data.crop_size,
                    attention=OmegaConf.to_container(cfg.attention, resolve=True), **model)
    robustness = cfg.data.robustness
    task = SegmentationTask(net, datamodule.num_classes, datamodule.ignore_index, datamodule.class_names, cfg.optim,
                            list(robustness.corruptions), list(robustness.severities), seed=cfg.seed)
    return datamodule, task
