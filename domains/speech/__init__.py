"""Speech: keyword spotting with a Conformer on eSpeak NG words (offline default), Speech Commands v2 or
any class-per-folder audio tree; accuracy clean and under added noise."""
from common.registry import BuildConfig, register_domain

from .data import DATASETS, SpeechDataModule
from .model import KeywordSpotter, KeywordTask


def network(cfg: BuildConfig, num_classes: int) -> KeywordSpotter:
    """The keyword spotter of a config; the clip length sets the typical token count."""
    rate = cfg.data["sample_rate"]
    return KeywordSpotter(num_classes, sample_rate=rate, clip_samples=int(round(cfg.data["clip_seconds"] * rate)),
                          attention=cfg.attention, **cfg.model)


@register_domain("speech", metric="acc", mode="max", datasets=DATASETS)
def build(cfg: BuildConfig):
    datamodule = SpeechDataModule(cfg.data, cache_dir=cfg.cache_dir)
    num_classes = len(datamodule.classes)
    return datamodule, KeywordTask(network(cfg, num_classes), num_classes, cfg.optim, seed=cfg.seed, **cfg.task)
