"""The paper's mechanism study: retrieve the label of an out-of-distribution answer token, with a
key-norm shortcut available on half the training samples (``data.py`` describes the task)."""
from common.registry import register_domain

from .config import RetrievalConfig


@register_domain("retrieval", metric="acc", mode="max", config=RetrievalConfig,
                 commands={"retrieval-report": "domains.retrieval.report", "retrieval-aniso": "domains.retrieval.anisotropy"})
def build(cfg: RetrievalConfig):
    from .data import RetrievalDataModule
    from .model import FaithfulRetrievalNet, RetrievalNet, RetrievalTask

    datamodule = RetrievalDataModule(cfg.data, cfg.seed)
    data, model = cfg.data, cfg.model
    if model.form == "faithful":
        net = FaithfulRetrievalNet(data.key_dim, data.num_classes, seq_len=data.num_tokens, attention=cfg.attention,
                                   qk_dim=model.qk_dim, qk_input=model.qk_input, qk_bias=model.qk_bias)
    else:
        net = RetrievalNet(datamodule.input_dim, data.num_classes, seq_len=data.num_tokens, attn_layer=cfg.attn_layer,
                           heads=model.heads, hidden=model.hidden)
    return datamodule, RetrievalTask(net, data.num_classes, cfg.optim, seed=cfg.seed, **dict(cfg.task))
