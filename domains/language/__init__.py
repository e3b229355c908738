"""Causal language modelling: a decoder-only GPT on bytes or characters of Python's standard library
(embedded), any UTF-8 text, enwik8, text8 or WikiText-103. Primary metric: test loss in nats per token.
``quest generate <run dir>`` samples from a trained run with the KV cache."""
from common.registry import BuildConfig, register_domain

from .data import DATASETS


@register_domain("language", metric="loss", mode="min", datasets=DATASETS)
def build(cfg: BuildConfig):
    from .data import LanguageDataModule
    from .model import GPT, LanguageTask

    datamodule = LanguageDataModule(cfg.data)
    net = GPT(datamodule.tokenizer.vocab_size, context=cfg.data["context"], attention=cfg.attention, **cfg.model)
    return datamodule, LanguageTask(net, datamodule.tokenizer, cfg.optim, seed=cfg.seed, **cfg.task)
