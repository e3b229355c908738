"""Speech: keyword spotting with a Conformer on eSpeak NG words (offline default), Speech Commands v2 or
any class-per-folder audio tree; accuracy clean and under added noise."""
from common.registry import register_domain


@register_domain("speech", metric="acc", mode="max", datasets=("espeak", "speech_commands", "folder"))
def build(cfg):
    from omegaconf import OmegaConf

    from .data import SpeechDataModule
    from .model import KeywordSpotter, KeywordTask

    datamodule = SpeechDataModule(cfg.data, cache_dir=cfg.cache_dir)
    model = OmegaConf.to_container(cfg.model, resolve=True)
    label_smoothing = model.pop("label_smoothing")
    num_classes = len(datamodule.classes)
    net = KeywordSpotter(num_classes, sample_rate=cfg.data.sample_rate,
                         clip_samples=int(round(cfg.data.clip_seconds * cfg.data.sample_rate)),
                         attention=OmegaConf.to_container(cfg.attention), **model)
    return datamodule, KeywordTask(net, num_classes, cfg.optim, label_smoothing, cfg.data.robustness.snrs)
