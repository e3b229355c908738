"""Graph domain: a GPS graph transformer (GINE + global attention) on molecules and other graphs, for
regression or classification of whole graphs (molecular properties) or of their nodes (citation graphs,
per-atom targets). The data decides which: see ``data.py``."""
import logging

from common.registry import register_domain

from .config import GraphConfig

log = logging.getLogger(__name__)
DENSE_NODES = 10_000  # beyond this many nodes in a graph, dense attention's N² logits per head hurt


@register_domain("graph", metric="mae", mode="min", config=GraphConfig,
                 commands={"graph-bench": "domains.graph.bench", "gcn-reference": "domains.graph.gcn_reference"})
def build(cfg: GraphConfig):
    from .data import GraphDataModule, nearest_rank
    from .model import GPSNet, GraphClassification, GraphRegression

    model = dict(cfg.model)
    percentile = model.pop("seq_len_percentile")
    datamodule = GraphDataModule(cfg.data, cache_dir=cfg.cache_dir)
    datamodule.setup()  # the model's encoders, outputs, target scale and typical sizes come from the data
    # qknorm's gain starts at log2(L² − L) (Henry et al. 2020), L the keys per query at the given percentile
    # of the train split (they take the 97.5th of sequence lengths): graph sizes (dense), degree + 1 (sparse).
    sparse = cfg.model.attention_mode == "sparse"
    seq_len = max(2, nearest_rank(datamodule.keys_per_query(sparse), percentile))
    log.info("qknorm length L = %d: percentile %g of the train split's %s", seq_len, percentile,
             "degrees + 1" if sparse else "graph sizes")
    if not sparse and datamodule.max_nodes > DENSE_NODES:
        log.warning("dense attention over a graph of %d nodes forms %d² logits per head; "
                    "model.attention_mode=sparse attends over its edges instead", datamodule.max_nodes,
                    datamodule.max_nodes)
    level = datamodule.level
    net = GPSNet(datamodule.node_features, datamodule.edge_features, datamodule.num_outputs, level=level,
                 rwse_steps=cfg.data.rwse_steps, seq_len=seq_len, attention=cfg.attention, **model)
    if datamodule.num_classes:
        return datamodule, GraphClassification(net, cfg.optim, datamodule.num_classes, level=level)
    return datamodule, GraphRegression(net, cfg.optim, *datamodule.target_stats(), level=level, **dict(cfg.task))
