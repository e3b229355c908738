"""Segmentation domain: Segmenter (ViT encoder + mask-transformer decoder) on digit scenes, ADE20K or a
folder of images and masks, scored by mIoU on clean test images and under the corruptions of
``task.perturbations``, with per-class IoU by class name. ``model.init_from`` starts the encoder from a
finished vision run of the same attention variant."""
from common.registry import register_domain

from .config import SegmentationConfig


@register_domain("segmentation", metric="miou", mode="max", config=SegmentationConfig)
def build(cfg: SegmentationConfig):
    from .data import SegmentationDataModule
    from .model import SegmentationTask, Segmenter, corruption_conditions, init_encoder_from_vision

    datamodule = SegmentationDataModule(cfg.data, cfg.cache_dir)
    shape = dict(cfg.model)
    del shape["init_from"]  # where the encoder starts, not the network's shape
    net = Segmenter(datamodule.num_classes, crop_size=cfg.data.crop_size, attn_layer=cfg.attn_layer, **shape)
    if cfg.model.init_from:
        init_encoder_from_vision(net, cfg.model, cfg.attention.variant)
    conditions = corruption_conditions(**dict(cfg.task.perturbations))
    task = SegmentationTask(net, datamodule.class_names, datamodule.ignore_index, cfg.optim, perturbations=conditions,
                            seed=cfg.seed)
    return datamodule, task
