"""Image classification with a ViT (DeiT shape in the paper preset) on MNIST digits or an ImageFolder tree;
adversarial and corruption robustness via ``quest robustness`` (``common.robustness``)."""
from common.registry import register_domain


@register_domain("vision", metric="acc", mode="max", datasets=("mnist", "imagefolder"))
def build(cfg):
    from omegaconf import OmegaConf

    from .data import VisionDataModule
    from .model import ViT, VisionTask

    datamodule = VisionDataModule(cfg.data, cache_dir=cfg.cache_dir, seed=cfg.seed)
    model = OmegaConf.to_container(cfg.model)
    task_keys = ("label_smoothing", "mixup", "cutmix", "mix_switch_prob")
    task_kwargs = {key: model.pop(key) for key in task_keys}
    net = ViT(datamodule.num_classes, image_size=cfg.data.image_size, channels=cfg.data.channels,
              mean=list(cfg.data.mean), std=list(cfg.data.std), attention=OmegaConf.to_container(cfg.attention), **model)
    return datamodule, VisionTask(net, datamodule.num_classes, cfg.optim, **task_kwargs)
