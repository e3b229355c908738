"""Speech: keyword spotting with a Conformer on eSpeak NG words (offline default), Speech Commands v2 or
any class-per-folder audio tree; accuracy clean and under added noise."""
from common.registry import register_domain

from .config import SpeechConfig


def network(cfg: SpeechConfig, num_classes: int):
    """The ``KeywordSpotter`` of a config; the clip length sets the typical token count."""
    from .model import KeywordSpotter

    rate = cfg.data.sample_rate
    return KeywordSpotter(num_classes, sample_rate=rate, clip_samples=int(round(cfg.data.clip_seconds * rate)),
                          attn_layer=cfg.attn_layer, **dict(cfg.model))


@register_domain("speech", metric="acc", mode="max", config=SpeechConfig,
                 commands={"speech-bench": "domains.speech.bench"})
def build(cfg: SpeechConfig):
    from .data import SpeechDataModule
    from .model import KeywordTask

    datamodule = SpeechDataModule(cfg.data, cache_dir=cfg.cache_dir)
    num_classes = len(datamodule.classes)
    return datamodule, KeywordTask(network(cfg, num_classes), num_classes, cfg.optim, seed=cfg.seed, **dict(cfg.task))
