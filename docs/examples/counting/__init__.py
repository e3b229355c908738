"""The domain of docs/guides/add-a-domain.md, whole: count how often token 0 occurs in a sequence of random tokens.

Registration only: importing this file must stay cheap (no torch), since `quest list` and every config check
import it. The heavy imports are inside ``build``. Copied to ``domains/counting/`` it is found by name; here, in
the docs, the test (tests/test_guides.py) puts its folder on the path and registers it the same way.
"""
from pathlib import Path

from common.registry import register_domain

from .config import CountingConfig  # pydantic only: cheap


@register_domain("counting", metric="acc", mode="max", config=CountingConfig,
                 presets=Path(__file__).with_name("counting.yaml"))  # left out: configs/domain/counting.yaml
def build(cfg: CountingConfig):
    from common.task import ClassificationTask

    from .data import CountingData
    from .model import CountingNet

    datamodule = CountingData(cfg.data)
    net = CountingNet(datamodule.num_classes, vocab=cfg.data.vocab, length=cfg.data.length,
                      attn_layer=cfg.attn_layer, **dict(cfg.model))
    return datamodule, ClassificationTask(net, datamodule.num_classes, cfg.optim, seed=cfg.seed, **dict(cfg.task))
