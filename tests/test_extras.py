"""A package of one domain's extra (pyproject.toml) that cannot be imported is a one-line error naming the
extra, exit code 2, found before any training."""
import sys

import pytest
import torch
from torch import nn

from runners.cli import main

CASES = [  # (domain, a package its default data or model needs, the extra that installs it)
    ("pointcloud", "open3d", "pointcloud"),
    ("graph", "rdkit.Chem", "graph"),
    ("graph", "qm9pack", "graph"),
    ("speech", "torchaudio", "speech"),
    ("speech", "soundfile", "speech"),
    ("speech", "espeakng_loader", "speech"),
    ("timeseries", "sklearn.preprocessing", "timeseries"),
    ("timeseries", "tsdata.fpp3", "timeseries"),
]


def hide(monkeypatch, module: str, domain: str | None = None) -> None:
    """Make ``import module`` fail, and forget the domain's modules that imported it already."""
    monkeypatch.setitem(sys.modules, module, None)
    for name in [n for n in sys.modules if domain and n.startswith(f"domains.{domain}.")]:
        monkeypatch.delitem(sys.modules, name)


@pytest.mark.parametrize("domain,module,extra", CASES)
def test_a_domain_without_its_extra_says_which_to_install(domain, module, extra, run_args, monkeypatch, capsys):
    hide(monkeypatch, module, domain)
    assert main(["train", f"domain={domain}", "preset=smoke", *run_args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and module in err and f"pip install 'quest-study[{extra}]'" in err


def test_autoattack_without_the_vision_extra_is_refused_before_any_attack(monkeypatch):
    from common.errors import ConfigError
    from common.perturbations import evaluate_robustness
    from common.schema import Robustness

    hide(monkeypatch, "pyautoattack")
    attacked = []
    model = nn.Sequential(nn.Flatten(), nn.Linear(4, 2))
    model.register_forward_hook(lambda *_: attacked.append(1))
    cfg = {"input_range": [0.0, 1.0], "eps": [0.1], "pgd": {"steps": 1, "rel_step_size": 0.5, "random_start": True},
           "corruptions": [], "severities": [1], "autoattack": {"max_samples": 2, "version": "standard"},
           "max_samples": None, "seed": 0}
    with pytest.raises(ConfigError, match=r"pyautoattack .*quest-study\[vision\]"):
        evaluate_robustness(model, [(torch.rand(2, 1, 2, 2), torch.tensor([0, 1]))], Robustness.model_validate(cfg))
    assert not attacked


def test_slurm_launcher_without_submitit_names_the_slurm_extra(monkeypatch, tmp_path):
    from common.errors import ConfigError
    from runners.sweeps.slurm import launch_slurm

    hide(monkeypatch, "submitit")
    with pytest.raises(ConfigError, match=r"submitit .*quest-study\[slurm\]"):
        launch_slurm([["domain=toy"]], {}, tmp_path)
