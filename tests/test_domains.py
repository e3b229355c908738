"""The domain contract, checked for every registered domain x every attention variant, so a new domain
is tested the day it is registered: its smoke preset builds, every attention module runs the variant
asked for, a training batch gives a finite loss, the backward pass reaches the attention with
finite gradients, and a few steps on one batch lower the loss. Then one `quest train` smoke run per domain,
and a throw-away domain written into a temporary folder goes through both, with no file of the project
touched. Naming the domains' datasets loads none of their data or model code."""
import importlib
import math
import subprocess
import sys
import textwrap

import pytest
import torch

from common import registry
from common.attention import VARIANTS, EdgeMultiheadAttention, MultiheadAttention
from common.records import find_records, read_record
from common.registry import domain_names, get_domain, register_domain
from common.schema import RunConfig
from common.task import Task
from runners.cli import main as cli
from runners.config import compose

DOMAINS = domain_names()


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


def check_contract(domain: str, variant: str, cache_dir, *overrides: str) -> None:
    """The contract on the domain's smoke preset; ``overrides`` reach other configurations of one domain
    (another task level, another dataset)."""
    cfg = compose([f"domain={domain}", "preset=smoke", f"attention={variant}", f"cache_dir={cache_dir}", *overrides])
    torch.manual_seed(0)
    datamodule, task = get_domain(domain).build(cfg)
    assert isinstance(task, Task)
    metric, mode = get_domain(domain).primary_of(task)  # the run is judged on a metric its task logs, its way
    assert task.directions().get(metric) == mode, (metric, mode, task.directions())
    attention = [m for m in task.modules() if isinstance(m, (MultiheadAttention, EdgeMultiheadAttention))]
    assert attention and {m.variant.name for m in attention} == {variant}

    datamodule.setup("fit")
    inputs, target = task.unpack(next(iter(datamodule.train_dataloader())))
    task.train()
    loss = task.loss(task(inputs), target, "train")
    assert loss.dim() == 0 and torch.isfinite(loss)
    loss.backward()
    grads = {name: p.grad for name, p in task.named_parameters() if p.grad is not None}
    assert all(torch.isfinite(g).all() for g in grads.values())
    for module in attention:  # the attention itself learns: its query/key projection gets a gradient
        projection = module.in_proj_weight if isinstance(module, MultiheadAttention) else module.in_proj.weight
        assert projection.grad is not None and projection.grad.abs().sum() > 0


def check_smoke_run(domain: str, tmp_path, cache_dir) -> dict:
    assert cli(["train", f"domain={domain}", "preset=smoke", f"output_dir={tmp_path}", f"cache_dir={cache_dir}",
                "trainer.enable_progress_bar=false"]) == 0
    record = read_record(find_records(tmp_path)[0])
    assert record.status == "ok" and record.probes, record.error
    assert math.isfinite(record.metrics[f"test/{record.primary_metric}"])
    return record


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("domain", DOMAINS)
def test_every_domain_trains_every_variant(domain, variant, cache_dir):
    check_contract(domain, variant, cache_dir)


@pytest.mark.parametrize("domain", DOMAINS)
def test_every_domain_learns(domain, cache_dir):
    """A domain that never learns (its loss does not move, its test metric at its trivial baseline) passed every
    check above: a few optimiser steps on one training batch must lower its loss."""
    cfg = compose([f"domain={domain}", "preset=smoke", "attention=quest", f"cache_dir={cache_dir}"])
    torch.manual_seed(0)
    datamodule, task = get_domain(domain).build(cfg)
    datamodule.setup("fit")
    inputs, target = task.unpack(next(iter(datamodule.train_dataloader())))
    optimizer = torch.optim.Adam(task.parameters(), lr=3e-3)
    losses = []
    for _ in range(10):
        optimizer.zero_grad()
        loss = task.loss(task(inputs), target, "train")
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.99 * losses[0], losses  # deterministic: a domain that does not learn stays at its first loss


@pytest.mark.parametrize("domain", DOMAINS)
def test_every_domain_is_ready_for_accelerators(domain, cache_dir):
    """What a GPU run would meet first, checked on CPU: bf16 autocast (as trainer.precision=bf16-mixed runs
    the model) for a normalising and a learnable variant, and torch.compile (aot_eager: dynamo and AOT
    autograd without minutes of code generation) giving the eager outputs."""
    for variant in ("quest", "qknorm_ds"):
        cfg = compose([f"domain={domain}", "preset=smoke", f"attention={variant}", f"cache_dir={cache_dir}"])
        torch.manual_seed(0)
        datamodule, task = get_domain(domain).build(cfg)
        datamodule.setup("fit")
        batch = datamodule.on_after_batch_transfer(next(iter(datamodule.train_dataloader())), 0)
        inputs, target = task.unpack(batch)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = task.loss(task.train()(inputs), target, "train")
        loss.backward()
        assert torch.isfinite(loss) and all(torch.isfinite(p.grad).all() for p in task.parameters() if p.grad is not None)
    net = task.net.eval()
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(net, backend="aot_eager")(inputs), net(inputs), atol=1e-4, rtol=1e-3)


@pytest.mark.parametrize("domain", DOMAINS)
def test_smoke_run_through_quest_train(domain, tmp_path, cache_dir):
    check_smoke_run(domain, tmp_path, cache_dir)


def test_naming_the_datasets_imports_no_torch():
    """`quest list` and the config check name every domain's datasets: a fresh interpreter doing so must not
    pay for torch (seconds); on failure, the project's modules it imported show which one pulled it in."""
    code = ("import sys, runners.config; from common.registry import domain_names, get_domain; "
            "[get_domain(n).datasets for n in domain_names()]; "
            "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if m.split('.')[0] in "
            "('common', 'domains', 'runners'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr



@pytest.mark.parametrize("domain", [name for name in DOMAINS if name in registry.package_domains()])
def test_every_named_dataset_has_its_loader(domain):
    """The names a domain registers (what the config check accepts) are exactly those its datamodule loads."""
    data = importlib.import_module(f"{registry.package_domains()[domain]}.data")
    assert set(data.LOADERS) == set(get_domain(domain).datasets)
    assert all(callable(loader) for loader in data.LOADERS.values())

PLUGIN = {
    "__init__.py": '''
        from pathlib import Path

        from common.registry import register_domain

        from .config import MajorityConfig

        @register_domain("majority", metric="acc", mode="max", config=MajorityConfig,
                         presets=Path(__file__).with_name("majority.yaml"))
        def build(cfg):
            from .data import MajorityData
            from .model import MajorityNet

            from common.task import ClassificationTask

            net = MajorityNet(cfg.data.vocab, attn_layer=cfg.attn_layer, **dict(cfg.model))
            return MajorityData(cfg.data, cfg.seed), ClassificationTask(net, cfg.data.vocab, cfg.optim, **dict(cfg.task))
    ''',
    "data.py": '''
        import torch
        from torch.utils.data import TensorDataset

        from common.data import SPLITS, SplitDataModule


        def random_tokens(data, seed):
            """Sequences of tokens labelled by their most frequent token."""
            g = torch.Generator().manual_seed(seed)
            tokens = torch.randint(data.vocab, (3 * data.size, data.length), generator=g)
            labels = torch.nn.functional.one_hot(tokens, data.vocab).sum(1).argmax(-1)
            return {s: TensorDataset(tokens[i::3], labels[i::3]) for i, s in enumerate(SPLITS)}


        class MajorityData(SplitDataModule):
            def __init__(self, data, seed):
                super().__init__(data.batch_size)
                self.datasets = {"random": random_tokens}[data.dataset](data, seed)
    ''',
    "model.py": '''
        from torch import nn

        from common.blocks import Encoder


        class MajorityNet(nn.Module):
            def __init__(self, vocab, *, dim, depth, heads, dropout, attn_layer):
                super().__init__()
                self.embed = nn.Embedding(vocab, dim)
                self.encoder = Encoder(dim, depth, heads, attn_layer=attn_layer, dropout=dropout)
                self.head = nn.Linear(dim, vocab)

            def forward(self, tokens):
                return self.head(self.encoder(self.embed(tokens)).mean(1))
    ''',
    "config.py": '''
        from typing import Literal

        from common.schema import Fraction, Positive, RunConfig
        from common.sections import Encoder, Loader
        from common.typed import Model


        class MajorityData(Loader):
            dataset: Literal["random"] = "random"
            vocab: Positive = 5
            length: Positive = 12
            size: Positive = 64
            """Sequences per split."""


        class MajorityTask(Model):
            label_smoothing: Fraction = 0.0


        class MajorityConfig(RunConfig):
            data: MajorityData = MajorityData(batch_size=16)
            model: Encoder = Encoder(dim=16, depth=2, heads=2)
            task: MajorityTask = MajorityTask()
    ''',
    "majority.yaml": '''
        presets:
          smoke:
            trainer: {max_epochs: 1, enable_progress_bar: false}
            probes: {every_n_steps: 1}
    ''',
}


def test_a_new_domain_is_one_package(tmp_path, monkeypatch, cache_dir):
    package = tmp_path / "plugins" / "majority"
    package.mkdir(parents=True)
    (package.parent / "__init__.py").write_text("")
    for name, text in PLUGIN.items():
        (package / name).write_text(textwrap.dedent(text).lstrip())
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "_PACKAGES", [*registry._PACKAGES, "plugins"])
    try:
        assert "majority" in domain_names()
        for variant in VARIANTS:
            check_contract("majority", variant, cache_dir)
        check_smoke_run("majority", tmp_path / "runs", cache_dir)
        assert get_domain("majority").datasets == ("random",)
        assert cli(["train", "domain=majority", "data.dataset=other", f"output_dir={tmp_path}"]) == 2
    finally:
        registry.unregister_domain("majority")


def test_a_variant_added_in_one_place_is_seen_everywhere(monkeypatch, cache_dir, tmp_path):
    """A variant is one ``Variant`` entry in ``VARIANTS`` (docs/guides/add-a-variant.md): the config check, a sweep's
    expansion and every domain's contract take it, none of them edited for it."""
    from common.attention import Variant
    from runners.sweeps.spec import expand, load_sweep

    added = Variant("quest_hs", norm_q=False, norm_k=True, scaled=False, fold="HeadGain")
    monkeypatch.setitem(VARIANTS, added.name, added)
    assert compose(["domain=timeseries", f"attention={added.name}"]).attention.variant == added.name
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text("domains: [timeseries]\nvariants: all\nseeds: [0, 1]\n")
    assert sum(f"attention={added.name}" in run for run in expand(load_sweep(sweep))) == 2
    sweep.write_text(f"domains: [timeseries]\nvariants: [{added.name}, standard]\n")
    assert load_sweep(sweep).variants == [added.name, "standard"]
    for domain in DOMAINS:
        check_contract(domain, added.name, cache_dir)


@pytest.mark.parametrize("kwargs, message", [
    ({"mode": "best"}, "mode must be 'min' or 'max'"),
    ({}, "data section must name its datasets"),
    ({"config": {"data": {"n": 1}}}, "config must be its common.schema.RunConfig subclass"),
])
def test_a_registration_that_cannot_work_is_refused(kwargs, message):
    """A domain is typed by its RunConfig subclass: a default config to guess types from is refused, as a bad mode."""
    arguments = {"metric": "acc", "mode": "max", "config": RunConfig, **kwargs}
    with pytest.raises(ValueError, match=message):
        register_domain("refused", **arguments)
    assert "refused" not in domain_names()
