"""Image classification with a ViT on MNIST digits or an ImageFolder tree (the paper presets: DeiT-Tiny,
ViT-S, ViT-B and ViT-L with DeiT's recipe on ImageNet, ViT-B with DeiT-III's); adversarial and corruption
robustness via ``quest robustness`` (``common.perturbations``); ImageNet-ReaL, -C and -A results of a run via
``quest imagenet`` (``evaluate.py``)."""
from common.registry import register_domain

from .config import VisionConfig


@register_domain("vision", metric="acc", mode="max", config=VisionConfig,
                 commands={"imagenet": "domains.vision.evaluate"})
def build(cfg: VisionConfig):
    from .data import VisionDataModule
    from .model import VisionTask, ViT

    datamodule = VisionDataModule(cfg.data, cfg.cache_dir, seed=cfg.seed)
    data = cfg.data
    net = ViT(datamodule.num_classes, image_size=data.image_size, channels=data.channels, mean=data.mean, std=data.std,
              attn_layer=cfg.attn_layer, **dict(cfg.model))
    return datamodule, VisionTask(net, datamodule.num_classes, cfg.optim, seed=cfg.seed, **dict(cfg.task))
