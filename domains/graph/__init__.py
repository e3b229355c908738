"""Graph domain: a GPS graph transformer (GINE + global attention) on molecules and other graphs, for
regression or classification of whole graphs (molecular properties) or of their nodes (citation graphs,
per-atom targets). The data decides which: see ``data.py``."""
import logging

from common.registry import BuildConfig, register_domain

from .data import DATASETS

log = logging.getLogger(__name__)
DENSE_NODES = 10_000  # beyond this many nodes in a graph, dense attention's N² logits per head hurt


@register_domain("graph", metric="mae", mode="min", datasets=DATASETS)
def build(cfg: BuildConfig):
    from .data import GraphDataModule
    from .model import GPSNet, GraphClassification, GraphRegression

    datamodule = GraphDataModule(cfg.data, cache_dir=cfg.cache_dir)
    datamodule.setup()  # the model's encoders, outputs, target scale and typical sizes come from the data
    # qknorm's gain starts from the typical number of keys per query: graph size (dense) or degree + 1 (sparse).
    sparse = cfg.model["attention_mode"] == "sparse"
    keys = datamodule.mean_degree + 1 if sparse else datamodule.mean_nodes
    if not sparse and datamodule.max_nodes > DENSE_NODES:
        log.warning("dense attention over a graph of %d nodes forms %d² logits per head; "
                    "model.attention_mode=sparse attends over its edges instead", datamodule.max_nodes,
                    datamodule.max_nodes)
    level = datamodule.level
    net = GPSNet(datamodule.node_features, datamodule.edge_features, datamodule.num_outputs, level=level,
                 rwse_steps=cfg.data["rwse_steps"], seq_len=max(2, round(keys)), attention=cfg.attention, **cfg.model)
    if datamodule.num_classes:
        return datamodule, GraphClassification(net, cfg.optim, datamodule.num_classes, level=level)
    return datamodule, GraphRegression(net, cfg.optim, *datamodule.target_stats(), level=level, **cfg.task)
