"""The paper's mechanism study: retrieve the label of an out-of-distribution answer token, with a
key-norm shortcut available on half the training samples (``data.py`` describes the task)."""
from common.registry import BuildConfig, register_domain

DATASETS = {"generated": "domains.retrieval.data:generated"}


@register_domain("retrieval", metric="acc", mode="max", datasets=DATASETS)
def build(cfg: BuildConfig):
    from .data import RetrievalDataModule
    from .model import RetrievalNet, RetrievalTask

    datamodule = RetrievalDataModule(cfg.data, cfg.seed)
    num_classes = cfg.data["num_classes"]
    net = RetrievalNet(datamodule.input_dim, num_classes, seq_len=cfg.data["num_tokens"], attention=cfg.attention,
                       **cfg.model)
    return datamodule, RetrievalTask(net, num_classes, cfg.optim, seed=cfg.seed, **cfg.task)
