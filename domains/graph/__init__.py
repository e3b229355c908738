"""Graph domain: a GPS graph transformer (GINE + global attention) regressing molecular properties."""
from common.registry import BuildConfig, register_domain

from .data import DATASETS


@register_domain("graph", metric="mae", mode="min", datasets=DATASETS)
def build(cfg: BuildConfig):
    from .data import GraphDataModule
    from .model import GPSNet, GraphTask

    datamodule = GraphDataModule(cfg.data, cache_dir=cfg.cache_dir)
    datamodule.setup()  # the model's vocabularies, target scale and typical sizes come from the data
    # qknorm's gain starts from the typical number of keys per query: graph size (dense) or degree + 1 (sparse).
    sparse = cfg.model["attention_mode"] == "sparse"
    keys = datamodule.mean_degree + 1 if sparse else datamodule.mean_nodes
    net = GPSNet(datamodule.node_vocab, datamodule.edge_vocab, datamodule.num_targets,
                 rwse_steps=cfg.data["rwse_steps"], seq_len=max(2, round(keys)), attention=cfg.attention, **cfg.model)
    return datamodule, GraphTask(net, cfg.optim, *datamodule.target_stats(), **cfg.task)
