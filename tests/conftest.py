import pytest
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torchmetrics import MeanSquaredError

from common.attention import MultiheadAttention
from common.records import SCHEMA_VERSION
from common.registry import register_domain, unregister_domain
from common.task import Task

# The tests use tiny tensors, for which one thread beats the overhead of several.
torch.set_num_threads(1)


@pytest.fixture
def run_args(tmp_path):
    """Arguments that keep a test run's outputs and caches inside its temporary directory."""
    return [f"output_dir={tmp_path / 'runs'}", f"cache_dir={tmp_path / 'cache'}", "trainer.enable_progress_bar=false"]


class ToyData(pl.LightningDataModule):
    def __init__(self, data: dict):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        x = torch.randn(data["n"], 4, 8, generator=g)
        self.data = TensorDataset(x, x.sum((1, 2)))

    def train_dataloader(self):
        return DataLoader(self.data, 16)

    val_dataloader = test_dataloader = train_dataloader


class ToyNet(nn.Module):
    def __init__(self, attention: dict):
        super().__init__()
        self.attn = MultiheadAttention(8, 2, **attention)
        self.head = nn.Linear(8, 1)

    def forward(self, x):
        return self.head(self.attn(x)[0].mean(1)).squeeze(-1)


class ToyTask(Task):
    def __init__(self, net: nn.Module, optim: dict, nan_after: int):
        super().__init__(net, optim, {"mse": MeanSquaredError()})
        self.nan_after = nan_after

    def loss(self, pred, target, stage):
        loss = F.mse_loss(pred, target)
        if stage == "train" and 0 <= self.nan_after <= self.global_step:
            loss = loss * float("nan")
        return loss


TOY_CONFIG = {
    "data": {"dataset": "random", "n": 64},
    "task": {"nan_after": -1},
    "trainer": {"max_epochs": 2},
    "presets": {"smoke": {}, "demo": {"trainer": {"max_epochs": 1}}},
}


@pytest.fixture
def toy_domain():
    """A domain registered from the test itself: the plugin contract, no project file touched."""

    @register_domain("toy", metric="mse", mode="min", datasets={"random": ToyData}, config=TOY_CONFIG)
    def build(cfg):
        return ToyData(cfg.data), ToyTask(ToyNet(cfg.attention), cfg.optim, **cfg.task)

    yield "toy"
    unregister_domain("toy")


class CreatesAFile:
    """Unpickled, this would run ``open(path, "w")``: the proof that a loader ran code from a file."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return open, (self.path, "w")


def make_record(variant, seed, metrics, domain="a", dataset="d", status="ok", **fields):
    """A valid record of one run; ``metrics`` without the ``test/`` prefix."""
    return {
        "schema": SCHEMA_VERSION, "domain": domain, "dataset": dataset, "variant": variant, "seed": seed,
        "preset": "study", "status": status, "config": {}, "metrics": {f"test/{k}": v for k, v in metrics.items()},
        "primary_metric": "mse", "mode": "min", "best_val": {"value": None, "epoch": None},
        "divergence": {"step": 5, "reason": "non-finite loss"} if status == "diverged" else None, "error": None,
        "probes": {"max_logit": 1.0}, "wall_time_s": 1.0, "params": 10, "hardware": {}, "versions": {},
        "git_commit": None, **fields,
    }
