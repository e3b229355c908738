"""Test-time image corruptions in the manner of ADE20K-C / ImageNet-C (Hendrycks & Dietterich 2019):
six corruptions, five severities each, on float images in [0, 1] of shape [B, 3, H, W].

The severity parameters are ImageNet-C's. Randomness (the two noises) comes only from the generator
passed in, so a corrupted test set is a function of the seed.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor
from torchvision.transforms.v2 import functional as TF

SEVERITY_PARAMS: dict[str, tuple[float, ...]] = {
    "gaussian_noise": (0.08, 0.12, 0.18, 0.26, 0.38),  # noise std
    "shot_noise": (60, 25, 12, 5, 3),                  # photons per unit intensity
    "gaussian_blur": (1, 2, 3, 4, 6),                  # blur sigma in pixels
    "contrast": (0.4, 0.3, 0.2, 0.1, 0.05),            # contrast kept
    "brightness": (0.1, 0.2, 0.3, 0.4, 0.5),           # added to the HSV value
    "jpeg": (25, 18, 15, 10, 7),                       # JPEG quality
}
CORRUPTIONS = tuple(SEVERITY_PARAMS)


def corrupt(images: Tensor, name: str, severity: int, generator: torch.Generator | None = None) -> Tensor:
    """``images`` under corruption ``name`` at ``severity`` (1..5)."""
    if name not in SEVERITY_PARAMS:
        raise ValueError(f"unknown corruption {name!r}; choose from {', '.join(CORRUPTIONS)}")
    if not 1 <= severity <= 5:
        raise ValueError(f"corruption severity must be 1..5, not {severity}")
    c = SEVERITY_PARAMS[name][severity - 1]
    if name == "gaussian_noise":
        noise = torch.randn(images.shape, generator=generator, device=images.device, dtype=images.dtype)
        out = images + c * noise
    elif name == "shot_noise":
        out = torch.poisson(images * c, generator=generator) / c
    elif name == "gaussian_blur":
        # Reflect padding needs the kernel radius below the image size; small images get a cut kernel.
        size = min(2 * math.ceil(3 * c) + 1, 2 * min(images.shape[-2:]) - 1)
        out = TF.gaussian_blur(images, [size, size], [float(c), float(c)])
    elif name == "contrast":
        mean = images.mean(dim=(-3, -2, -1), keepdim=True)
        out = (images - mean) * c + mean
    elif name == "brightness":
        # Adding c to HSV's value V = max(r, g, b) at fixed hue and saturation scales RGB by (V + c) / V.
        value = images.amax(dim=-3, keepdim=True)
        out = images * ((value + c).clamp(max=1.0) / value.clamp(min=1e-6))
        out = torch.where(value > 0, out, torch.full_like(out, c))
    else:  # jpeg
        quantised = (images.clamp(0, 1) * 255).round().to(torch.uint8)
        out = TF.jpeg(quantised.cpu(), int(c)).to(images.device, images.dtype) / 255
    return out.clamp(0, 1)
