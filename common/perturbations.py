"""Robust accuracy of a trained classifier: white-box L∞ attacks (FGSM, PGD), AutoAttack (``pyautoattack``, Croce &
Hein's code) and, for images in [0, 1], the common corruptions of ImageNet-C (``imagecorruptions``).

Batches are ``(inputs, labels)``; ``inputs`` is the Tensor to perturb or a tuple whose first element is
(the rest, e.g. lengths, pass through unchanged). Attacks work in input units and are clipped to
``input_range`` when one is given (``[0, 1]`` for images; null for unbounded features such as point
coordinates or spectrogram values). Corruptions and AutoAttack need images in [0, 1].

Caveat: elliptical variants compute their per-head metric under ``torch.no_grad``, so white-box
gradients treat it as a constant; their attacked accuracies may be optimistic (gradient masking).
"""
from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Iterable

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch import Tensor, nn

from common.errors import ConfigError
from common.optional import require
from common.schema import Robustness

Inputs = Tensor | tuple


# --- attacks -----------------------------------------------------------------------------------------

def split_inputs(inputs: Inputs) -> tuple[Tensor, Callable[[Tensor], Inputs]]:
    """The tensor an attack perturbs, and how to rebuild the model's input around a perturbed copy."""
    if isinstance(inputs, Tensor):
        return inputs, lambda x: x
    return inputs[0], lambda x: type(inputs)((x, *inputs[1:]))


def project(x_adv: Tensor, x: Tensor, eps: float, input_range: tuple[float, float] | None) -> Tensor:
    """Into the L∞ ball of radius ``eps`` around ``x``, then into the valid input range."""
    x_adv = torch.minimum(torch.maximum(x_adv, x - eps), x + eps)
    return x_adv.clamp(*input_range) if input_range is not None else x_adv


def _loss_and_grad(model: nn.Module, rebuild, x: Tensor, labels: Tensor, need_grad: bool = True):
    """Per-sample cross-entropy, logits and (optionally) d loss / d x, also when called under no_grad."""
    with torch.enable_grad():
        x = x.detach().requires_grad_(need_grad)
        logits = model(rebuild(x))
        losses = F.cross_entropy(logits, labels, reduction="none")
        grad = torch.autograd.grad(losses.sum(), x)[0] if need_grad else None
    return losses.detach(), logits.detach(), grad


def fgsm(model: nn.Module, inputs: Inputs, labels: Tensor, eps: float,
         input_range: tuple[float, float] | None = None) -> Tensor:
    """Fast gradient sign method (Goodfellow et al. 2015): one step of size ``eps`` along sign(∇ loss)."""
    x, rebuild = split_inputs(inputs)
    grad = _loss_and_grad(model, rebuild, x, labels)[2]
    return project(x + eps * grad.sign(), x, eps, input_range).detach()


def pgd(model: nn.Module, inputs: Inputs, labels: Tensor, eps: float, *, steps: int, step_size: float,
        random_start: bool = True, input_range: tuple[float, float] | None = None,
        generator: torch.Generator | None = None) -> Tensor:
    """L∞ projected gradient descent (Madry et al. 2018) on the cross-entropy. Returns, per sample, the
    strongest iterate seen (misclassified first, then highest loss), as robust evaluations do; the
    random start draws from ``generator``, so a seeded generator makes the attack deterministic."""
    x, rebuild = split_inputs(inputs)
    adv = x.detach().clone()
    if random_start:
        noise = torch.rand(x.shape, generator=generator, device=x.device, dtype=x.dtype)
        adv = project(adv + (2 * noise - 1) * eps, x, eps, input_range)
    best = adv.clone()
    best_loss = torch.full(labels.shape, -math.inf, device=x.device)
    best_fooled = torch.zeros(labels.shape, dtype=torch.bool, device=x.device)
    for step in range(steps + 1):  # the last pass only scores the final iterate
        loss, logits, grad = _loss_and_grad(model, rebuild, adv, labels, need_grad=step < steps)
        fooled = logits.argmax(-1) != labels
        better = (fooled & ~best_fooled) | ((fooled == best_fooled) & (loss > best_loss))
        best[better], best_loss[better], best_fooled[better] = adv[better], loss[better], fooled[better]
        if step < steps:
            adv = project(adv + step_size * grad.sign(), x, eps, input_range)
    return best.detach()


def autoattack(model: nn.Module, images: Tensor, labels: Tensor, eps: float, *, version: str = "standard",
               seed: int = 0, batch_size: int = 100) -> Tensor:
    """Adversarial images from AutoAttack (APGD-CE, APGD-T, FAB-T, Square in its standard version)."""
    attack = require("pyautoattack", extra="vision").AutoAttack(model, norm="Linf", eps=eps, version=version, seed=seed,
                                                                device=images.device)
    return attack.run_standard_evaluation(images, labels, batch_size=batch_size)[0]


# --- common corruptions (images [B, C, H, W] in [0, 1]) --------------------------------------------

# The suite the configs draw from: ImageNet-C's noise, blur and digital corruptions and two of its held-out
# ones (speckle noise, Gaussian blur), computed by `imagecorruptions`, the reference implementation of
# Hendrycks & Dietterich (2019), at its parameters. Sizes in those parameters (blur radii, shifts) are pixels
# of a 224-pixel ImageNet image and do not scale with the image: docs/domains.md says what they do at 28.
CORRUPTIONS = ("gaussian_noise", "shot_noise", "impulse_noise", "speckle_noise", "gaussian_blur", "defocus_blur",
               "contrast", "brightness", "pixelate", "jpeg_compression")


def check_corruption(name: str, severity: int) -> None:
    """A ``ConfigError`` naming ``name`` or ``severity`` unless both are in the suite."""
    if name not in CORRUPTIONS:
        raise ConfigError(f"unknown corruption {name!r}; the suite (docs/domains.md) is {', '.join(CORRUPTIONS)}")
    if severity not in (1, 2, 3, 4, 5):
        raise ConfigError(f"corruption severity must be 1..5, not {severity!r}")


def corrupt(images: Tensor, name: str, severity: int, generator: torch.Generator | None = None) -> Tensor:
    """``images`` [B, C, H, W] (C = 1 or 3) in [0, 1] under corruption ``name`` at ``severity`` 1..5: float
    images of the same shape, dtype and device, in [0, 1] and multiples of 1/255.

    Each image goes to the library as uint8 H x W x 3, a grey one as three equal channels (as the library's
    ``corrupt`` makes it), and a grey one comes back as the first channel, so noise drawn per channel keeps
    the library's per-pixel strength. The library draws from numpy's global generator (impulse noise from a
    seed it is given): each image gets a seed drawn from ``generator``, so equal images and generator states
    give equal outputs; numpy's global state is left as it was."""
    check_corruption(name, severity)
    channels = images.shape[1]
    if channels not in (1, 3):
        raise ValueError(f"corruptions need 1 or 3 channels, not {channels}")
    import imagecorruptions  # here, not above: it loads numba, OpenCV and scikit-image, a second or more

    function = imagecorruptions.corruption_dict[name]
    takes_seed = "seed" in inspect.signature(function).parameters
    device = generator.device if generator is not None else torch.device("cpu")
    seeds = torch.randint(2**32, (len(images),), generator=generator, device=device).tolist()
    pixels = (images.detach().clamp(0, 1) * 255).round().to(torch.uint8).expand(-1, 3, -1, -1)
    outputs, numpy_state = [], np.random.get_state()
    try:
        for image, seed in zip(pixels.permute(0, 2, 3, 1).cpu().numpy(), seeds):
            np.random.seed(seed)
            kwargs = {"seed": seed} if takes_seed else {}
            # np.uint8 of the float result, as the library's ``corrupt`` returns it
            outputs.append(np.uint8(function(Image.fromarray(image), severity, **kwargs)))
    finally:
        np.random.set_state(numpy_state)
    corrupted = torch.from_numpy(np.stack(outputs)).permute(0, 3, 1, 2)[:, :channels]
    return corrupted.to(images.device, images.dtype) / 255


# --- evaluation -------------------------------------------------------------------------------------

def _first(inputs: Inputs, n: int | None, device: torch.device) -> Inputs:
    """The first ``n`` samples (all where None) of a batch's inputs, each tensor of them on ``device``."""
    def first(x):
        return (x[:n] if x.dim() > 0 else x).to(device) if isinstance(x, Tensor) else x
    return first(inputs) if isinstance(inputs, Tensor) else type(inputs)(first(x) for x in inputs)


def _batches(dataloader: Iterable, limit: int | None, device: torch.device):
    seen = 0
    for inputs, labels in dataloader:
        left = None if limit is None else limit - seen
        if left is not None and left <= 0:
            return
        labels = labels[:left]
        seen += labels.shape[0]
        yield _first(inputs, left, device), labels.to(device)


def eps_key(eps: float) -> str:
    return f"eps{eps:.4g}"


def evaluate_robustness(task: nn.Module, dataloader: Iterable, cfg: Robustness) -> dict[str, float]:
    """Accuracy of ``task`` (a classifier: ``task(inputs) -> logits``) on ``dataloader`` (the test split's batches),
    clean and under each attack and corruption that ``cfg`` (the run config's ``robustness`` section) sets:
    ``acc_clean``, ``acc_fgsm_eps<ε>``, ``acc_pgd_eps<ε>``, ``acc_autoattack_eps<ε>``, ``acc_<corruption>_s<k>``,
    ``acc_corruption_mean`` and ``n_samples``."""
    device = next(task.parameters()).device
    input_range = tuple(cfg.input_range) if cfg.input_range is not None else None
    eps_list = [float(e) for e in cfg.eps]
    pgd_cfg, autoattack_samples = cfg.pgd, cfg.autoattack.max_samples
    if (cfg.corruptions or autoattack_samples) and input_range != (0.0, 1.0):
        raise ValueError("corruptions and AutoAttack need images in [0, 1] (robustness.input_range: [0, 1]); "
                         "otherwise set robustness.corruptions: [] and robustness.autoattack.max_samples: 0")
    for name in cfg.corruptions:  # a wrong name or a missing package is found before any attack runs
        for severity in cfg.severities:
            check_corruption(name, severity)
    if autoattack_samples:
        require("pyautoattack", extra="vision")
    generator = torch.Generator(device).manual_seed(cfg.seed)
    correct: dict[str, int] = {}

    def count(key: str, inputs: Inputs, labels: Tensor) -> None:
        with torch.no_grad():
            hits = int((task(inputs).argmax(-1) == labels).sum())
        correct[key] = correct.get(key, 0) + hits

    was_training = task.training
    task.eval()
    kept: list[tuple[Tensor, Tensor]] = []  # the first samples, for AutoAttack
    n = 0
    # Lightning's test loop runs under inference mode, where autograd is off.
    with torch.inference_mode(False):
        for inputs, labels in _batches(dataloader, cfg.max_samples, device):
            x, rebuild = split_inputs(inputs)
            x, labels = x.clone(), labels.clone()  # ordinary tensors, even if made in inference mode
            n += labels.shape[0]
            count("acc_clean", rebuild(x), labels)
            for eps in eps_list:
                count(f"acc_fgsm_{eps_key(eps)}", rebuild(fgsm(task, rebuild(x), labels, eps, input_range)), labels)
                adv = pgd(task, rebuild(x), labels, eps, steps=pgd_cfg.steps, step_size=pgd_cfg.rel_step_size * eps,
                          random_start=pgd_cfg.random_start, input_range=input_range, generator=generator)
                count(f"acc_pgd_{eps_key(eps)}", rebuild(adv), labels)
            for name in cfg.corruptions:
                for severity in cfg.severities:
                    count(f"acc_{name}_s{severity}", rebuild(corrupt(x, name, severity, generator)), labels)
            if autoattack_samples and sum(len(y) for _, y in kept) < autoattack_samples:
                if not isinstance(inputs, Tensor):
                    raise ValueError("AutoAttack needs plain image tensors; set robustness.autoattack.max_samples: 0")
                kept.append((x, labels))
        results = {key: hits / max(n, 1) for key, hits in correct.items()}
        if kept:
            images, labels = (torch.cat(parts)[:autoattack_samples] for parts in zip(*kept))
            for eps in eps_list:
                adv = autoattack(task, images, labels, eps, version=cfg.autoattack.version, seed=cfg.seed,
                                 batch_size=len(labels))
                with torch.no_grad():
                    results[f"acc_autoattack_{eps_key(eps)}"] = float((task(adv).argmax(-1) == labels).float().mean())
    task.train(was_training)
    if corrupted := [v for k, v in results.items() if any(k.startswith(f"acc_{c}_s") for c in cfg.corruptions)]:
        results["acc_corruption_mean"] = sum(corrupted) / len(corrupted)
    results["n_samples"] = float(n)
    return results
