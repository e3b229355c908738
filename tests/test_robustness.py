"""Adversarial attacks, corruptions and the `quest robustness` command."""
import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from common import perturbations as robustness
from common.data import load_mnist
from common.errors import ConfigError
from common.perturbations import CORRUPTIONS, corrupt, evaluate_robustness, fgsm, pgd
from common.records import read_record
from common.schema import Robustness

CFG = {"input_range": [0.0, 1.0], "eps": [0.05, 0.1, 0.2],
       "pgd": {"steps": 10, "rel_step_size": 0.25, "random_start": True},
       "corruptions": [], "severities": [1, 5], "autoattack": {"max_samples": 0, "version": "standard"},
       "max_samples": None, "seed": 0}


@pytest.fixture(scope="module")
def tiny():
    """A fixed small nonlinear classifier and inputs in [0, 1] with their true labels."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4)).eval()
    images = torch.rand(96, 1, 4, 4)
    with torch.no_grad():
        labels = model(images).argmax(-1)
    return model, images, labels


def loader(images, labels, batch=32):
    return [(images[i:i + batch], labels[i:i + batch]) for i in range(0, len(labels), batch)]


@pytest.mark.parametrize("input_range", [(0.0, 1.0), None])
def test_attacks_respect_eps_and_range(tiny, input_range):
    model, images, labels = tiny
    for eps in (0.03, 0.3):
        for adv in (fgsm(model, images, labels, eps, input_range),
                    pgd(model, images, labels, eps, steps=5, step_size=eps / 4, input_range=input_range)):
            assert (adv - images).abs().max() <= eps + 1e-6
            if input_range is not None:
                assert adv.min() >= 0 and adv.max() <= 1
        if input_range is None:  # unbounded inputs may leave [0, 1]
            assert fgsm(model, images, labels, 0.3).min() < 0


def test_pgd_never_better_for_the_model_than_fgsm(tiny):
    model, images, labels = tiny
    results = evaluate_robustness(model, loader(images, labels), Robustness.model_validate(CFG))
    assert results["acc_clean"] == 1.0 and results["n_samples"] == 96
    for eps in CFG["eps"]:
        assert results[f"acc_pgd_eps{eps:g}"] <= results[f"acc_fgsm_eps{eps:g}"]
    assert results["acc_pgd_eps0.2"] < 1.0  # the attack does something
    # PGD's per-sample loss is at least FGSM's (it keeps the strongest iterate) on this model.
    loss = nn.functional.cross_entropy
    with torch.no_grad():
        for eps in CFG["eps"]:
            a_fgsm = fgsm(model, images, labels, eps, (0.0, 1.0))
            a_pgd = pgd(model, images, labels, eps, steps=10, step_size=eps / 4, input_range=(0.0, 1.0),
                        generator=torch.Generator().manual_seed(0))
            fooled_fgsm = model(a_fgsm).argmax(-1) != labels
            fooled_pgd = model(a_pgd).argmax(-1) != labels
            assert not (fooled_fgsm & ~fooled_pgd).any()
            assert loss(model(a_pgd), labels) >= loss(model(a_fgsm), labels)


def test_attack_is_deterministic_per_seed(tiny):
    model, images, labels = tiny
    runs = [pgd(model, images, labels, 0.1, steps=3, step_size=0.03, input_range=(0.0, 1.0),
                generator=torch.Generator().manual_seed(seed)) for seed in (0, 0, 1)]
    assert torch.equal(runs[0], runs[1]) and not torch.equal(runs[0], runs[2])
    cfg = Robustness.model_validate({**CFG, "corruptions": ["gaussian_noise", "impulse_noise"]})
    assert evaluate_robustness(model, loader(images, labels), cfg) == evaluate_robustness(model, loader(images, labels), cfg)


def test_tuple_inputs_perturb_only_the_first_element():
    class Masked(nn.Module):  # (features [B, T, F], lengths [B]) -> logits
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(3, 5)

        def forward(self, inputs):
            features, lengths = inputs
            mask = torch.arange(features.shape[1])[None, :, None] < lengths[:, None, None]
            return self.linear((features * mask).sum(1) / lengths[:, None])

    torch.manual_seed(0)
    model, features, lengths = Masked(), torch.randn(8, 6, 3) * 3, torch.randint(1, 7, (8,))
    labels = torch.randint(0, 5, (8,))
    adv = pgd(model, (features, lengths), labels, 0.5, steps=3, step_size=0.2)
    assert adv.shape == features.shape and (adv - features).abs().max() <= 0.5 + 1e-6
    cfg = Robustness.model_validate({**CFG, "input_range": None, "eps": [0.5], "max_samples": 6})
    results = evaluate_robustness(model, [((features, lengths), labels)], cfg)
    assert results["n_samples"] == 6 and set(results) == {"acc_clean", "acc_fgsm_eps0.5", "acc_pgd_eps0.5", "n_samples"}
    with pytest.raises(ValueError, match="corruptions"):
        evaluate_robustness(model, [((features, lengths), labels)], cfg.model_copy(update={"corruptions": ["contrast"]}))


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    """16 MNIST digits [16, 1, 28, 28] in [0, 1], the vision domain's default images."""
    return load_mnist(tmp_path_factory.mktemp("cache"))["images"][:16].float() / 255


def scenes(digits):
    """Colour images of the size of segmentation's digit scenes: [4, 3, 32, 32] in [0, 1]."""
    padded = F.pad(digits[:4], (2, 2, 2, 2))
    return torch.cat([padded, padded.flip(-1) * 0.5, 1 - padded], 1)


RANDOM = ("gaussian_noise", "shot_noise", "impulse_noise", "speckle_noise")  # the rest draw nothing


@pytest.mark.parametrize("name", CORRUPTIONS)
def test_each_corruption_keeps_shape_dtype_and_range_and_is_deterministic_given_the_generator(digits, name):
    numpy_state = np.random.get_state()
    for images in (digits, scenes(digits).double()):
        for severity in range(1, 6):
            out = corrupt(images, name, severity, torch.Generator().manual_seed(0))
            assert out.shape == images.shape and out.dtype == images.dtype and out.device == images.device
            assert out.min() >= 0 and out.max() <= 1 and torch.equal(out, (out * 255).round() / 255)
            assert torch.equal(out, corrupt(images, name, severity, torch.Generator().manual_seed(0)))
            assert torch.equal(out, corrupt(images, name, severity, torch.Generator().manual_seed(1))) == (name not in RANDOM)
    assert np.random.get_state()[1].tolist() == numpy_state[1].tolist()  # numpy's global generator left as it was


def test_corruptions_grow_with_severity_on_average(digits):
    for name in CORRUPTIONS:
        change = [(corrupt(digits, name, s, torch.Generator().manual_seed(0)) - digits).abs().mean() for s in range(1, 6)]
        assert all(a < b for a, b in zip(change, change[1:])), (name, change)


@pytest.mark.parametrize("name", CORRUPTIONS)
def test_corrupt_is_the_library_on_each_image(digits, name):
    """Grey and colour images of 32 pixels (the library's smallest) against ``imagecorruptions.corrupt``
    given the seed that ``corrupt`` draws for each image."""
    import imagecorruptions

    for images in (F.pad(digits[:2], (2, 2, 2, 2)), scenes(digits)[:2]):
        for severity in range(1, 6):
            out = corrupt(images, name, severity, torch.Generator().manual_seed(3))
            seeds = torch.randint(2**32, (len(images),), generator=torch.Generator().manual_seed(3)).tolist()
            for image, corrupted, seed in zip(images, out, seeds):
                pixels = (image * 255).round().to(torch.uint8).permute(1, 2, 0).numpy()
                np.random.seed(seed)
                expected = imagecorruptions.corrupt(pixels.squeeze(-1) if len(image) == 1 else pixels, severity=severity,
                                                    corruption_name=name, **({"seed": seed} if name == "impulse_noise" else {}))
                assert np.array_equal((corrupted * 255).round().to(torch.uint8).permute(1, 2, 0).numpy(),
                                      expected[..., :len(image)]), (name, severity)


def test_variants_of_one_seed_face_the_same_corrupted_images(tiny, monkeypatch):
    """Two models, the same robustness seed: PGD draws as much from the generator for either, so the
    corruptions after it draw the same noise."""
    model, images, labels = tiny
    seen = []
    monkeypatch.setattr(robustness, "corrupt", lambda *args: seen.append(corrupt(*args)) or seen[-1])
    cfg = Robustness.model_validate({**CFG, "corruptions": ["gaussian_noise", "impulse_noise"]})
    evaluate_robustness(model, loader(images, labels), cfg)
    other = nn.Sequential(nn.Flatten(), nn.Linear(16, 4))
    first, seen[:] = list(seen), []
    evaluate_robustness(other, loader(images, labels), cfg)
    assert len(seen) == len(first) == 3 * 2 * 2 and all(torch.equal(a, b) for a, b in zip(first, seen))


def test_a_corruption_outside_the_suite_is_refused_before_any_attack(tiny):
    model, images, labels = tiny
    with pytest.raises(ConfigError, match="unknown corruption 'frost'"):
        corrupt(images, "frost", 1)
    with pytest.raises(ConfigError, match="severity must be 1..5"):
        corrupt(images, "contrast", 6)
    attacked = []
    model = nn.Sequential(model, nn.Identity())
    model.register_forward_hook(lambda *_: attacked.append(1))
    with pytest.raises(ConfigError, match="unknown corruption 'glass_blur'"):
        evaluate_robustness(model, loader(images, labels),
                            Robustness.model_validate({**CFG, "corruptions": ["contrast", "glass_blur"]}))
    assert not attacked


def test_a_segmentation_corruption_outside_the_suite_stops_the_run_before_training(run_args, capsys):
    from runners.cli import main

    assert main(["train", "domain=segmentation", "preset=smoke", "task.perturbations.corruptions=[contrast,frost]",
                 *run_args]) == 2
    assert "unknown corruption 'frost'" in capsys.readouterr().err
    assert not list((Path(run_args[0].split("=", 1)[1])).rglob("record.json"))


@pytest.mark.skipif(importlib.util.find_spec("pyautoattack") is None, reason="pyautoattack not installed")
def test_autoattack_respects_eps(tiny):
    model, images, labels = tiny
    cfg = Robustness.model_validate({**CFG, "eps": [0.5], "autoattack": {"max_samples": 4, "version": "standard"},
                                     "max_samples": 8})
    results = evaluate_robustness(model, loader(images, labels, batch=4), cfg)
    assert results["acc_autoattack_eps0.5"] <= results["acc_clean"]


def test_quest_robustness_adds_results_to_the_record(tmp_path, monkeypatch):
    import runners.runs.robust_accuracy
    from runners.cli import main
    from runners.runs.training import train

    record = train(["domain=vision", "preset=smoke", "attention=standard", f"output_dir={tmp_path}",
                    f"cache_dir={tmp_path}/cache", "threads=1"])
    assert record.status == "ok"
    run_dir = next(tmp_path.glob("vision/standard/seed*"))
    threads, attack = [], runners.runs.robust_accuracy.evaluate_robustness
    monkeypatch.setattr(runners.runs.robust_accuracy, "evaluate_robustness",
                        lambda *args: threads.append(torch.get_num_threads()) or attack(*args))
    torch.set_num_threads(2)
    assert main(["robustness", str(run_dir), "robustness.eps=[0.05]", "robustness.max_samples=16"]) == 0
    assert threads == [1] and torch.get_num_threads() == 2  # the run's thread setting, then restored
    saved = read_record(run_dir)
    rob = saved.robustness
    assert rob["n_samples"] == 16 and 0 <= rob["acc_pgd_eps0.05"] <= rob["acc_fgsm_eps0.05"] + 1e-9
    assert "acc_jpeg_compression_s5" in rob and "acc_corruption_mean" in rob
    assert saved.robustness_config["eps"] == [0.05]
    assert main(["robustness", str(tmp_path / "missing")]) == 2


def test_a_run_from_an_older_version_is_a_clear_error(tmp_path, capsys):
    from omegaconf import OmegaConf

    from runners.cli import main
    from runners.runs.training import train

    train(["domain=vision", "preset=smoke", "attention=standard", f"output_dir={tmp_path}", f"cache_dir={tmp_path}/cache"])
    run_dir = next(tmp_path.glob("vision/standard/seed*"))
    saved = OmegaConf.load(run_dir / "config.yaml")
    del saved.model["norm_eps"]  # as a run from before the key existed
    OmegaConf.save(saved, run_dir / "config.yaml")
    assert main(["robustness", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert "does not fit this version of the 'vision' domain" in err and err.count("\n") == 1
