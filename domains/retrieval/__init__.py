"""The paper's mechanism study: retrieve the label of an out-of-distribution answer token, with a
key-norm shortcut available on half the training samples."""
from common.registry import register_domain


@register_domain("retrieval", metric="acc", mode="max", datasets=("generated",))
def build(cfg):
    from .data import RetrievalDataModule
    from .model import RetrievalNet, RetrievalTask

    datamodule = RetrievalDataModule(**cfg.data, seed=cfg.seed)
    net = RetrievalNet(datamodule.input_dim, cfg.data.num_classes, seq_len=cfg.data.num_tokens, **cfg.model,
                       attention=cfg.attention)
    return datamodule, RetrievalTask(net, cfg.data.num_classes, cfg.optim, success_threshold=cfg.eval.success_threshold)
