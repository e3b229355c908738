"""The paper's mechanism study: retrieve the label of an out-of-distribution answer token, with a
key-norm shortcut available on half the training samples (``data.py`` describes the task)."""
from common.registry import BuildConfig, register_domain

DATASETS = {"generated": "domains.retrieval.data:generated"}


@register_domain("retrieval", metric="acc", mode="max", datasets=DATASETS,
                 commands={"retrieval-report": "domains.retrieval.report", "retrieval-aniso": "domains.retrieval.anisotropy"})
def build(cfg: BuildConfig):
    from .data import RetrievalDataModule
    from .model import FORMS, FaithfulRetrievalNet, RetrievalNet, RetrievalTask

    datamodule = RetrievalDataModule(cfg.data, cfg.seed)
    num_classes, seq_len, model = cfg.data["num_classes"], cfg.data["num_tokens"], dict(cfg.model)
    form = model.pop("form")
    if form not in FORMS:
        raise ValueError(f"unknown model.form {form!r}; choose from {', '.join(FORMS)}")
    if form == "faithful":
        net = FaithfulRetrievalNet(cfg.data["key_dim"], num_classes, seq_len=seq_len, attention=cfg.attention,
                                   **{k: model[k] for k in ("qk_dim", "qk_input", "qk_bias")})
    else:
        net = RetrievalNet(datamodule.input_dim, num_classes, seq_len=seq_len, attn_layer=cfg.attn_layer,
                           **{k: model[k] for k in ("heads", "hidden")})
    return datamodule, RetrievalTask(net, num_classes, cfg.optim, seed=cfg.seed, **cfg.task)
