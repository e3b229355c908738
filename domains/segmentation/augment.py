"""The training augmentation of ``data.train_transform`` (random rescale, random crop, horizontal flip, colour
jitter) for a whole padded batch at once on the device it trained on (``data.augment_on: device``).

Per sample it draws what the per-sample transform draws: a scale factor in ``scale_range`` (relative to a
short side of ``resize`` when set), a crop position, a flip and jitter factors. Rescale, crop and flip are
one affine map from each output pixel to the stored image, so the batch is resampled by one ``grid_sample``:
bilinear for the image, nearest for the labels. Where the crop reaches beyond the image (a scaled image
smaller than the crop, or the padding that batched images of different sizes) it reads 0 and
``ignore_index``, as ``RandomCrop(pad_if_needed=True)`` fills. Two differences from the per-sample path:
downscaling does not antialias, and a scaled image smaller than the crop lands at a random place inside it
rather than torchvision's symmetric padding.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from common.errors import ConfigError

from .config import Data

GREY = (0.299, 0.587, 0.114)  # ITU-R 601 luma, as torchvision's rgb_to_grayscale


class DeviceAugment:
    """``(images [B, C, H, W] in [0, 1], masks [B, H, W], sizes [B, 2])`` -> ``(images [B, C, c, c], masks
    [B, c, c])`` with c = ``crop_size``; ``sizes`` are each sample's (height, width) before padding."""

    def __init__(self, data: Data):
        if data.jitter.hue:
            raise ConfigError("data.augment_on=device jitters brightness, contrast and saturation; set "
                              "data.jitter.hue=0 or data.augment_on=cpu")
        self.scale_range, self.short, self.crop = data.scale_range, data.resize, data.crop_size
        self.flip, self.jitter, self.ignore_index = data.flip, data.jitter, data.ignore_index

    def __call__(self, images: Tensor, masks: Tensor, sizes: Tensor) -> tuple[Tensor, Tensor]:
        grid = self.sampling_grid(sizes.to(images.device, torch.float32), images.shape[-2:])
        images = F.grid_sample(images, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
        # labels shifted by one so that 0 marks "outside the stored image", which becomes the ignore index
        shifted = F.grid_sample((masks + 1).unsqueeze(1).to(images.dtype), grid, mode="nearest",
                                padding_mode="zeros", align_corners=False)
        labels = shifted.squeeze(1).round().long() - 1
        return self.photometric(images), labels.masked_fill(labels < 0, self.ignore_index)

    def sampling_grid(self, sizes: Tensor, canvas: torch.Size) -> Tensor:
        """[B, c, c, 2] where each crop pixel reads the stored image, in ``grid_sample``'s [-1, 1] units."""
        batch, device = sizes.shape[0], sizes.device
        low, high = self.scale_range
        factor = low + (high - low) * torch.rand(batch, device=device)
        if self.short is not None:
            factor = factor * self.short / sizes.min(-1).values
        scaled = (sizes * factor[:, None]).round().clamp_min(1)
        # the crop's top-left corner in scaled pixels: anywhere the crop stays inside the scaled image, or,
        # when that is smaller than the crop, anywhere the image stays inside the crop (a negative offset)
        corner = (torch.rand(batch, 2, device=device) * (scaled - self.crop + 1)).floor()
        centres = torch.arange(self.crop, device=device) + 0.5
        rows, cols = ((corner[:, i, None] + centres) * sizes[:, i, None] / scaled[:, i, None] for i in (0, 1))
        if self.flip:
            flipped = torch.rand(batch, 1, device=device) < 0.5
            cols = torch.where(flipped, cols.flip(-1), cols)
        y, x = 2 * rows / canvas[0] - 1, 2 * cols / canvas[1] - 1
        return torch.stack(torch.broadcast_tensors(x[:, None, :], y[:, :, None]), -1)

    def photometric(self, images: Tensor) -> Tensor:
        """Brightness, contrast and saturation, each by its own factor per sample, as ``v2.ColorJitter`` draws
        them (uniform in [max(0, 1 - a), 1 + a]), applied in that order."""
        def factor(amount: float) -> Tensor:
            shape = (images.shape[0], 1, 1, 1)
            return (1 + amount * (2 * torch.rand(shape, device=images.device) - 1)).clamp_min(0)

        def grey(x: Tensor) -> Tensor:
            if x.shape[1] != 3:
                return x
            return sum(w * x[:, i:i + 1] for i, w in enumerate(GREY))

        brightness, contrast, saturation = self.jitter.brightness, self.jitter.contrast, self.jitter.saturation
        if brightness:
            images = (images * factor(brightness)).clamp(0, 1)
        if contrast:
            mean = grey(images).mean((1, 2, 3), keepdim=True)
            images = (mean + factor(contrast) * (images - mean)).clamp(0, 1)
        if saturation:
            plain = grey(images)
            images = (plain + factor(saturation) * (images - plain)).clamp(0, 1)
        return images
