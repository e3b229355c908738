"""Robust accuracy of a trained classifier: white-box L∞ attacks (FGSM, PGD), AutoAttack (standard
version, from the ``pyautoattack`` package, Croce & Hein's code) and, for images in [0, 1], the common
corruptions of Hendrycks & Dietterich (ImageNet-C) at five severities.

Batches are ``(inputs, labels)``; ``inputs`` is the Tensor to perturb or a tuple whose first element is
(the rest, e.g. lengths, pass through unchanged). Attacks work in input units and are clipped to
``input_range`` when one is given (``[0, 1]`` for images; null for unbounded features such as point
coordinates or spectrogram values). Corruptions and AutoAttack need images in [0, 1].

Caveat: elliptical variants compute their per-head metric under ``torch.no_grad``, so white-box
gradients treat it as a constant; their attacked accuracies may be optimistic (gradient masking).
"""
from __future__ import annotations

import io
import math
from collections.abc import Callable, Iterable

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch import Tensor, nn

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
    try:
        from pyautoattack import AutoAttack
    except ImportError:
        raise ImportError("AutoAttack needs the pyautoattack package: pip install pyautoattack") from None
    attack = AutoAttack(model, norm="Linf", eps=eps, version=version, seed=seed, device=images.device)
    return attack.run_standard_evaluation(images, labels, batch_size=batch_size)[0]


# --- common corruptions (images [B, C, H, W] in [0, 1]) --------------------------------------------

# Severity 1..5 parameters of ImageNet-C (Hendrycks & Dietterich 2019, `imagecorruptions`). Blur sizes
# are in pixels of a 224-pixel image and scale with the image, so a severity means the same relative blur.
SEVERITIES = {
    "gaussian_noise": (0.08, 0.12, 0.18, 0.26, 0.38),     # noise std
    "shot_noise": (60, 25, 12, 5, 3),                     # photons per unit intensity
    "impulse_noise": (0.03, 0.06, 0.09, 0.17, 0.27),      # salt-and-pepper fraction
    "speckle_noise": (0.15, 0.2, 0.35, 0.45, 0.6),        # multiplicative noise std
    "gaussian_blur": (1, 2, 3, 4, 6),                     # sigma
    "defocus_blur": (3, 4, 6, 8, 10),                     # disk radius
    "contrast": (0.4, 0.3, 0.2, 0.1, 0.05),               # contrast factor
    "brightness": (0.1, 0.2, 0.3, 0.4, 0.5),              # added to HSV value
    "pixelate": (0.6, 0.5, 0.4, 0.3, 0.25),               # downsampling factor
    "jpeg_compression": (25, 18, 15, 10, 7),              # JPEG quality
}
CORRUPTIONS = tuple(SEVERITIES)


def _depthwise(images: Tensor, kernel: Tensor) -> Tensor:
    channels = images.shape[1]
    pad = kernel.shape[-1] // 2
    padded = F.pad(images, (pad,) * 4, mode="reflect" if pad < min(images.shape[-2:]) else "replicate")
    return F.conv2d(padded, kernel.expand(channels, 1, -1, -1), groups=channels)


def _gaussian_blur(images: Tensor, sigma: float) -> Tensor:
    radius = max(1, math.ceil(4 * sigma))
    offsets = torch.arange(-radius, radius + 1, device=images.device, dtype=images.dtype)
    line = torch.exp(-offsets**2 / (2 * sigma**2))
    line = line / line.sum()
    return _depthwise(images, (line[:, None] * line[None, :])[None, None])


def _defocus_blur(images: Tensor, radius: float) -> Tensor:
    """Mean over a disk; its rim pixels are weighted by how much of them the disk covers (roughly), so
    radii below a pixel still blur a little."""
    size = math.ceil(radius)
    offsets = torch.arange(-size, size + 1, device=images.device, dtype=images.dtype)
    distance = (offsets[:, None] ** 2 + offsets[None, :] ** 2).sqrt()
    disk = (radius + 0.5 - distance).clamp(0, 1)
    return _depthwise(images, (disk / disk.sum())[None, None])


def _brightness(images: Tensor, amount: float) -> Tensor:
    """+amount on the HSV value channel: hue and saturation fixed means scaling RGB by V'/V."""
    value = images.amax(1, keepdim=True)
    brighter = (value + amount).clamp(max=1)
    return torch.where(value > 0, images * brighter / value.clamp_min(1e-12), brighter)


def _jpeg(images: Tensor, quality: int) -> Tensor:
    out = []
    for image in (images.clamp(0, 1) * 255).round().to(torch.uint8).cpu():
        array = image.permute(1, 2, 0).numpy()
        buffer = io.BytesIO()
        Image.fromarray(array[..., 0] if array.shape[-1] == 1 else array).save(buffer, format="JPEG", quality=quality)
        decoded = np.array(Image.open(buffer))
        out.append(torch.from_numpy(decoded.reshape(array.shape)).permute(2, 0, 1))
    return torch.stack(out).to(images.device, images.dtype) / 255


def _randn_like(images: Tensor, generator: torch.Generator | None) -> Tensor:
    return torch.randn(images.shape, generator=generator, device=images.device, dtype=images.dtype)


def corrupt(images: Tensor, name: str, severity: int, generator: torch.Generator | None = None) -> Tensor:
    """``images`` [B, C, H, W] in [0, 1] under corruption ``name`` at ``severity`` 1..5, in [0, 1]."""
    if name not in SEVERITIES:
        raise ValueError(f"unknown corruption {name!r}; choose from {', '.join(CORRUPTIONS)}")
    if not 1 <= severity <= 5:
        raise ValueError(f"corruption severity must be 1..5, not {severity}")
    c = SEVERITIES[name][severity - 1]
    relative = images.shape[-1] / 224  # blur sizes are given for 224-pixel images
    if name == "gaussian_noise":
        out = images + c * _randn_like(images, generator)
    elif name == "shot_noise":
        out = torch.poisson(images * c, generator=generator) / c
    elif name == "impulse_noise":
        u = torch.rand(images.shape, generator=generator, device=images.device, dtype=images.dtype)
        out = torch.where(u < c / 2, 0.0, torch.where(u < c, 1.0, images))
    elif name == "speckle_noise":
        out = images + images * c * _randn_like(images, generator)
    elif name == "gaussian_blur":
        out = _gaussian_blur(images, c * relative)
    elif name == "defocus_blur":
        out = _defocus_blur(images, c * relative)
    elif name == "contrast":
        mean = images.mean((1, 2, 3), keepdim=True)
        out = (images - mean) * c + mean
    elif name == "brightness":
        out = _brightness(images, c)
    elif name == "pixelate":
        size = images.shape[-2:]
        small = F.interpolate(images, size=[max(1, int(s * c)) for s in size], mode="area")
        out = F.interpolate(small, size=size, mode="nearest")
    else:  # jpeg_compression
        out = _jpeg(images, c)
    return out.clamp(0, 1)


# --- evaluation -------------------------------------------------------------------------------------

def _take(inputs: Inputs, n: int) -> Inputs:
    """The first ``n`` samples of a batch's inputs."""
    if isinstance(inputs, Tensor):
        return inputs[:n]
    return type(inputs)(x[:n] if isinstance(x, Tensor) and x.dim() > 0 else x for x in inputs)


def _to(inputs: Inputs, device: torch.device) -> Inputs:
    if isinstance(inputs, Tensor):
        return inputs.to(device)
    return type(inputs)(x.to(device) if isinstance(x, Tensor) else x for x in inputs)


def _batches(dataloader: Iterable, limit: int | None, device: torch.device):
    seen = 0
    for inputs, labels in dataloader:
        if limit is not None:
            if seen >= limit:
                return
            inputs, labels = _take(inputs, limit - seen), labels[:limit - seen]
        seen += labels.shape[0]
        yield _to(inputs, device), labels.to(device)


def eps_key(eps: float) -> str:
    return f"eps{eps:.4g}"


def evaluate_robustness(task: nn.Module, dataloader: Iterable, cfg) -> dict[str, float]:
    """Accuracy of ``task`` (a classifier: ``task(inputs) -> logits``) on ``dataloader``, clean and under
    each configured attack and corruption. ``cfg`` is a run config's ``robustness`` section:
    input_range, eps, pgd {steps, rel_step_size, random_start}, corruptions, severities,
    autoattack {max_samples, version}, max_samples, seed. Keys of the result: ``acc_clean``,
    ``acc_fgsm_eps<ε>``, ``acc_pgd_eps<ε>``, ``acc_autoattack_eps<ε>``, ``acc_<corruption>_s<k>``,
    ``acc_corruption_mean``, and ``n_samples``."""
    device = next(task.parameters()).device
    input_range = tuple(cfg["input_range"]) if cfg["input_range"] is not None else None
    eps_list = [float(e) for e in cfg["eps"]]
    pgd_cfg, autoattack_samples = cfg["pgd"], cfg["autoattack"]["max_samples"] or 0
    if (cfg["corruptions"] or autoattack_samples) and input_range != (0.0, 1.0):
        raise ValueError("corruptions and AutoAttack need images in [0, 1] (robustness.input_range: [0, 1]); "
                         "otherwise set robustness.corruptions: [] and robustness.autoattack.max_samples: 0")
    generator = torch.Generator(device).manual_seed(int(cfg["seed"]))
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
        for inputs, labels in _batches(dataloader, cfg["max_samples"], device):
            x, rebuild = split_inputs(inputs)
            x, labels = x.clone(), labels.clone()  # ordinary tensors, even if made in inference mode
            n += labels.shape[0]
            count("acc_clean", rebuild(x), labels)
            for eps in eps_list:
                count(f"acc_fgsm_{eps_key(eps)}", rebuild(fgsm(task, rebuild(x), labels, eps, input_range)), labels)
                adv = pgd(task, rebuild(x), labels, eps, steps=pgd_cfg["steps"], step_size=pgd_cfg["rel_step_size"] * eps,
                          random_start=pgd_cfg["random_start"], input_range=input_range, generator=generator)
                count(f"acc_pgd_{eps_key(eps)}", rebuild(adv), labels)
            for name in cfg["corruptions"]:
                for severity in cfg["severities"]:
                    count(f"acc_{name}_s{severity}", rebuild(corrupt(x, name, severity, generator)), labels)
            if autoattack_samples and sum(len(y) for _, y in kept) < autoattack_samples:
                if not isinstance(inputs, Tensor):
                    raise ValueError("AutoAttack needs plain image tensors; set robustness.autoattack.max_samples: 0")
                kept.append((x, labels))
        results = {key: hits / max(n, 1) for key, hits in correct.items()}
        if kept:
            images, labels = (torch.cat(parts)[:autoattack_samples] for parts in zip(*kept))
            for eps in eps_list:
                adv = autoattack(task, images, labels, eps, version=cfg["autoattack"]["version"], seed=int(cfg["seed"]),
                                 batch_size=len(labels))
                with torch.no_grad():
                    results[f"acc_autoattack_{eps_key(eps)}"] = float((task(adv).argmax(-1) == labels).float().mean())
    task.train(was_training)
    corrupted = [v for k, v in results.items() if any(k.startswith(f"acc_{c}_s") for c in cfg["corruptions"])]
    if corrupted:
        results["acc_corruption_mean"] = sum(corrupted) / len(corrupted)
    results["n_samples"] = float(n)
    return results
