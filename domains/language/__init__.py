"""Causal language modelling: a decoder-only GPT (ours, or a transformers architecture: ``model.arch``) on bytes
or characters of Python's standard library (embedded), any UTF-8 text, enwik8, text8 or WikiText-103. Primary
metric: test loss in nats per token. ``quest generate <run dir>`` (``generate.py``) samples from a trained run with the KV cache."""
from common.registry import register_domain

from .config import LanguageConfig


@register_domain("language", metric="loss", mode="min", config=LanguageConfig,
                 commands={"generate": "domains.language.generate", "language-bench": "domains.language.bench"})
def build(cfg: LanguageConfig):
    from .data import LanguageDataModule
    from .model import GPT, LanguageTask

    datamodule = LanguageDataModule(cfg.data)
    vocab, context, size = datamodule.tokenizer.vocab_size, cfg.data.context, dict(cfg.model)
    arch = size.pop("arch")
    if arch == "gpt":
        net = GPT(vocab, context=context, attn_layer=cfg.attn_layer, **size)
    else:
        from .hf import TransformersLM

        net = TransformersLM(vocab, arch=arch, context=context, attention=cfg.attention, **size)
    return datamodule, LanguageTask(net, datamodule.tokenizer, cfg.optim, seed=cfg.seed)
